"""The fused ops' properties (docs/spec.md §10), for every fused implementation (--rope-fused-impl)
on every device: QK-norm + RoPE on a packed qkv (contract A) and RoPE + KV-cache write (contract B)
held to the float64 reference within their bounds (rope.harness.fused.check), and the MLA RoPE +
latent-cache write (contract C) for an implementation that has it (the built-in triton does).  The
known bugs' triggers are fixed cases, run first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from properties.fused.fused_cases import KNOWN_CACHE, KNOWN_MLA, KNOWN_QK_NORM, cache_cases, mla_cases, qk_norm_cases
from rope.devices import triton_runs_on
from rope.harness.draws import skip_or_reject
from rope.harness.fused.batch import OPS, assert_batch_matches_reference
from rope.harness.fused.check import assert_mla_rope_kv_cache, assert_qk_norm_rope, assert_rope_kv_cache
from rope.implementation import Implementation
from rope.registry import BUILTIN_FUSED, get_fused_implementation


def _implementation(name: str, device: str, op: str):
    """The op's callable of implementation ``name``, or a skip saying why it does not run here."""
    fn = get_fused_implementation(name, op)
    if fn is None:
        pytest.skip(f"unsupported: {name} implements no {op}")
    if name in BUILTIN_FUSED and not triton_runs_on(device):
        skip_or_reject(f"unsupported: Triton does not run on {device} here")
    return fn


def _supported(name: str, fn, case, device: str):
    """``case`` when the implementation runs it here; else a skip (a rejected draw) with its reason."""
    reason = Implementation.of(name, fn, "fused").unsupported_reason
    why = reason(case, device) if reason is not None else None
    if why:
        skip_or_reject(f"unsupported: {why}")
    return case


def _drawn(data, name: str, fn, strategy):
    """A case drawn within the implementation's declared ``draws`` (an engine's op that takes FP8
    caches only, say, is drawn FP8 caches)."""
    return data.draw(strategy(draws=Implementation.of(name, fn, "fused").draws), label="case")


@settings(deadline=None, max_examples=6)
@given(case=qk_norm_cases())
def test_qk_norm_rope_matches_reference(fused_impl_name, device, case):
    fn = _implementation(fused_impl_name, device, "qk_norm_rope")
    assert_qk_norm_rope(fused_impl_name, fn, case, device)


@settings(deadline=None, max_examples=6)
@given(data=st.data())
def test_rope_kv_cache_matches_reference(fused_impl_name, device, data):
    fn = _implementation(fused_impl_name, device, "rope_kv_cache")
    case = _supported(fused_impl_name, fn, _drawn(data, fused_impl_name, fn, cache_cases), device)
    assert_rope_kv_cache(fused_impl_name, fn, case, device)


@settings(deadline=None, max_examples=6)
@given(data=st.data())
def test_mla_rope_kv_cache_matches_reference(fused_impl_name, device, data):
    fn = _implementation(fused_impl_name, device, "mla_rope_kv_cache")
    case = _supported(fused_impl_name, fn, _drawn(data, fused_impl_name, fn, mla_cases), device)
    assert_mla_rope_kv_cache(fused_impl_name, fn, case, device)


@pytest.mark.parametrize("op", list(OPS))
@settings(deadline=None, max_examples=4)
@given(data=st.data())
def test_fused_cases_checked_in_batches_match_reference(fused_impl_name, device, op, data):
    # Cases called back to back with no wait between them, waited for once (the batched check,
    # rope.harness.fused.batch): a call must not depend on what the call before it left behind.
    fn = _implementation(fused_impl_name, device, op)
    # Small cases (the one-case properties draw the big ones): a batch checks how calls follow each other.
    strategy = {"qk_norm_rope": lambda draws: qk_norm_cases(big=False),
                "rope_kv_cache": lambda draws: cache_cases(draws=draws, big=False), "mla_rope_kv_cache": mla_cases}[op]
    cases = [_supported(fused_impl_name, fn, _drawn(data, fused_impl_name, fn, strategy), device)
             for _ in range(data.draw(st.integers(1, 3), label="cases"))]
    assert_batch_matches_reference(op, fused_impl_name, fn, cases, device)


@pytest.mark.fixed_cases
@pytest.mark.known_bug
@pytest.mark.parametrize("known", list(KNOWN_QK_NORM))
def test_known_qk_norm_rope_cases(fused_impl_name, device, known):
    fn = _implementation(fused_impl_name, device, "qk_norm_rope")
    assert_qk_norm_rope(fused_impl_name, fn, KNOWN_QK_NORM[known], device)


@pytest.mark.fixed_cases
@pytest.mark.known_bug
@pytest.mark.parametrize("known", list(KNOWN_CACHE))
def test_known_rope_kv_cache_cases(fused_impl_name, device, known):
    fn = _implementation(fused_impl_name, device, "rope_kv_cache")
    assert_rope_kv_cache(fused_impl_name, fn, _supported(fused_impl_name, fn, KNOWN_CACHE[known], device), device)


@pytest.mark.fixed_cases
@pytest.mark.known_bug
@pytest.mark.parametrize("known", list(KNOWN_MLA))
def test_known_mla_rope_kv_cache_cases(fused_impl_name, device, known):
    fn = _implementation(fused_impl_name, device, "mla_rope_kv_cache")
    assert_mla_rope_kv_cache(fused_impl_name, fn, _supported(fused_impl_name, fn, KNOWN_MLA[known], device), device)
