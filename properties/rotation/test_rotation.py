"""Every rotation implementation, on every device, against the float64 reference."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rope.harness.draws import skip_if_none_supported
from rope.harness.rotation.check import assert_matches_reference, skip_if_unsupported
from rope.registry import get_implementation
from properties.known_cases import KNOWN_BUG_CASES
from properties.rotation.checks import (check_text_tokens_reduce_to_1d, more_batches_match_reference,
                                        one_shape_many_batches_match_reference, supported_variants)
from properties.strategies import (DTYPE_SHORT, DTYPES, KINDS, RotationCase, as_1d, probe_specs, rotation_cases,
                                   supported_shapes)

DTYPE_PARAMS = [pytest.param(d, id=DTYPE_SHORT[d]) for d in DTYPES]
KIND_PARAMS = [pytest.param(k, id=k) for k in KINDS]
PAIRING_PARAMS = [pytest.param(True, id="neox"), pytest.param(False, id="gptj")]


@pytest.mark.parametrize("is_neox_style", PAIRING_PARAMS)
@pytest.mark.parametrize("kind", KIND_PARAMS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@given(data=st.data())
def test_rotation_matches_reference(impl_name, device, dtype, kind, is_neox_style, data):
    # Rejects: wrong pairing, wrong axis map or sections, wrong partial strides, rounding or
    # precision worse than declared, writes outside q/k, NaN from out-of-range loads.
    impl = get_implementation(impl_name)
    narrowed = _supported_or_skip(impl_name, impl, kind, is_neox_style, dtype, device)
    case = data.draw(rotation_cases(dtype=dtype, kind=kind, is_neox_style=is_neox_style, nonfinite=True, **narrowed),
                     label="case")
    skip_if_unsupported(impl_name, impl, case.spec, dtype, device)
    assert_matches_reference(impl_name, impl, case, device)
    more_batches_match_reference(impl_name, impl, case, device, data)


def _supported_or_skip(impl_name, impl, kind, is_neox_style, dtype, device) -> dict:
    """The rotation_cases arguments drawing only shapes the implementation runs (strategies.supported_shapes);
    the test is skipped, with the reasons, when it runs none of them."""
    narrowed = supported_shapes(impl_name, impl, kind, is_neox_style, dtype, device)
    if narrowed is None:
        skip_if_none_supported(impl_name, impl, probe_specs(kind, is_neox_style), dtype, device)
    return narrowed


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@given(data=st.data())
def test_one_shape_many_batches_match_reference(impl_name, device, dtype, data):
    # An engine compiles its rotary kernel once per shape (head counts, head size, rotary width and
    # sections are constexprs of every Triton M-RoPE kernel checked here) and serves every batch of
    # a model with it.  One shape, then 1-12 batches through it, each held to the reference: bugs
    # that depend on the batch (token count, positions, packing, NaN) are searched within one
    # compiled shape, and an engine kernel's compile (about 100 ms on an H200, against a few ms per
    # check) is paid once for many checks.  Rejects what test_rotation_matches_reference rejects,
    # and state carried from one call to the next (a cached table or launch setting keyed on the shape).
    one_shape_many_batches_match_reference(impl_name, device, dtype, data)


@given(data=st.data())
def test_large_batches_match_reference(impl_name, device, data):
    # test_rotation_matches_reference draws up to 48 tokens; kernels switch tiles, grids and code
    # paths with the batch (our Triton kernel from 128 tokens; FlashInfer picks its split or
    # head-parallel kernel by token count), so every implementation is also held to the reference on
    # 128-640 tokens (128-320 on the CPU), with few small heads to keep interpreter runs cheap.  Rejects: a large-batch
    # default wired wrong (a grid computed before its default: half the rows never rotated), a
    # token tile running past the batch, a program count that overflows a grid dimension.
    impl = get_implementation(impl_name)
    dtype, kind, neox, narrowed = data.draw(st.sampled_from(supported_variants(impl_name, impl, device, list(DTYPES))),
                                            label="variant")
    small = tuple(h for h in narrowed.get("head_sizes", (16, 32, 64)) if h <= 64) or narrowed["head_sizes"][:1]
    case = data.draw(rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, min_tokens=128, max_tokens=128,
                                    **{**narrowed, "head_sizes": small}), label="case")
    # Past our kernel's switches at 128 and 256 tokens (rope/triton/rotary_plan.py) on the CPU, where the
    # interpreter runs a program at a time; up to 640 on a GPU.
    most = 320 if device == "cpu" else 640
    case = RotationCase(**{**case.__dict__, "num_tokens": data.draw(st.integers(128, most), label="tokens"),
                           "num_q_heads": min(case.num_q_heads, 4), "num_kv_heads": min(case.num_kv_heads, 2)})
    skip_if_unsupported(impl_name, impl, case.spec, dtype, device)
    assert_matches_reference(impl_name, impl, case, device)


@pytest.mark.fixed_cases
@pytest.mark.known_bug
@pytest.mark.parametrize("bug", list(KNOWN_BUG_CASES), ids=list(KNOWN_BUG_CASES))
def test_known_bug_triggers_match_reference(impl_name, device, bug):
    impl = get_implementation(impl_name)
    case = KNOWN_BUG_CASES[bug]
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    assert_matches_reference(impl_name, impl, case, device)


@pytest.mark.parametrize("kind", ["chunked3", "chunked4", "interleaved", "mapped"])
@given(data=st.data())
def test_text_tokens_reduce_to_1d(impl_name, device, kind, data):
    impl = get_implementation(impl_name)
    # With all position rows equal, every layout is 1-D RoPE, bit for bit.  Rejects kernels that
    # read rows with the wrong stride or mix lanes across rows.
    skip_if_none_supported(impl_name, impl, probe_specs(kind, True) + probe_specs(kind, False), "float32", device)
    skip_if_none_supported(impl_name, impl, probe_specs("1d", True) + probe_specs("1d", False), "float32", device)
    case = data.draw(rotation_cases(dtype="float32", kind=kind, min_tokens=1))
    case = RotationCase(**{**case.__dict__, "positions_kind": "text"})
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    skip_if_unsupported(impl_name, impl, as_1d(case.spec), case.dtype, device)
    check_text_tokens_reduce_to_1d(impl_name, impl, case, device)


@pytest.mark.fixed_cases
@pytest.mark.known_bug
@pytest.mark.guarded
@pytest.mark.parametrize("bug", list(KNOWN_BUG_CASES), ids=list(KNOWN_BUG_CASES))
def test_known_bug_triggers_under_guards(impl_name, device, bug):
    # Inputs inside NaN/sentinel guard regions (rope.harness.rotation.guards): a stray read that
    # reaches the output is NaN, a stray write changes a guard; under the interpreter every load and
    # store is also traced against the guards.
    from rope.harness.rotation.guards import assert_matches_reference_guarded
    impl = get_implementation(impl_name)
    case = KNOWN_BUG_CASES[bug]
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    assert_matches_reference_guarded(impl_name, impl, case, device)
