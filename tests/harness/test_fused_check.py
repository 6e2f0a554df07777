"""The fused ops' check and diagnosis (rope/harness/fused/): each broken implementation of
properties/mutants/broken_fused.py fails the check on a case that shows its bug, with the label its
diagnosis must name, in an AssertionError tagged with that cause; the built-in kernels pass the same
cases; a raise is a tagged failure too; the MLA rules each name a broken call made for them."""

from __future__ import annotations

import pytest

from rope.devices import triton_runs_on

from properties.fused.fused_cases import (DEEPSEEK_V3, GLM41V, KNOWN_CACHE, KNOWN_MLA, KNOWN_QK_NORM, QWEN2, cache_case,
                                         mla_case, qk_norm_case)
from properties.mutants import broken_fused
from rope.harness.causes import failure_of
from rope.harness.fused.check import assert_mla_rope_kv_cache, assert_qk_norm_rope, assert_rope_kv_cache
from rope.harness.fused.diagnosis import LABELS
from rope.triton.fused_qk_norm_rope import qk_norm_rope_triton
from rope.triton.rope_kv_cache import mla_rope_kv_cache_triton, rope_kv_cache_triton

FP8_CASE = cache_case(QWEN2, num_tokens=6, num_q_heads=2, num_kv_heads=2, cache="float8_e4m3fn", num_blocks=1,
                      padding=0.0)
SMALL_QK = qk_norm_case(GLM41V, num_tokens=6, num_heads_q=2, num_heads_k=2, num_heads_v=2, seed=5)
SMALL_MLA = mla_case(DEEPSEEK_V3, num_tokens=5, num_heads=2, kv_lora_rank=16, cache="float8_e5m2", scale=2.5)

CASES = [
    ("live_key_unrotated", KNOWN_CACHE["sglang-19636-live-k"], "live_key_unrotated"),
    ("padding_slots_written", KNOWN_CACHE["flashinfer-2792-padding-slots"], "padding_slot_written"),
    ("fp8_scale_multiplied", FP8_CASE, "fp8_scale_multiplied"),
    ("pos_ids_swapped_with_slots", KNOWN_CACHE["sglang-19636-live-k"], "rotated_by_slots"),
    ("pos_ids_swapped_with_slots", FP8_CASE, "rotated_by_slots"),
    ("partner_lost_past_10240_in_cache_write", KNOWN_CACHE["vllm-51049-partial-rotary-past-10240"],
     "partner_lost_past_10240"),
    ("norm_after_rotation", SMALL_QK, "norm_after_rotation"),
    ("partner_lost_past_10240", KNOWN_QK_NORM["vllm-51049-partial-rotary-past-10240"], "partner_lost_past_10240"),
    ("q_pe_heads_read_packed", KNOWN_MLA["aiter-3841-heads-major-q"], "heads_read_packed"),
    ("latent_k_pe_unrotated", SMALL_MLA, "cache_k_pe_unrotated"),
]
PARENTS = {"qk_norm_rope": qk_norm_rope_triton, "rope_kv_cache": rope_kv_cache_triton,
           "mla_rope_kv_cache": mla_rope_kv_cache_triton}
ASSERTS = {"qk_norm_rope": assert_qk_norm_rope, "rope_kv_cache": assert_rope_kv_cache,
           "mla_rope_kv_cache": assert_mla_rope_kv_cache}


# The cases here are CPU tensors and the kernels and their mutants are Triton: they run where Triton
# runs on the CPU (its interpreter); a GPU box checks the kernels in properties/fused on cuda.
needs_triton_on_cpu = pytest.mark.skipif(not triton_runs_on("cpu"),
                                         reason="the fused kernels run on CPU tensors only under Triton's "
                                                "interpreter (TRITON_INTERPRET=1)")


@pytest.fixture
def kernel_device():
    """Where the built-in kernels and their mutants run: the CPU under Triton's interpreter, else
    the GPU (a GPU box checks the batch machinery on cuda)."""
    import torch
    if triton_runs_on("cpu"):
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("Triton runs neither on the CPU (TRITON_INTERPRET unset) nor on a GPU here")


@pytest.fixture(autouse=True)
def _no_case_files(monkeypatch):
    """The failures here are wanted: no case file for them (tests/harness/test_fused_replay.py checks the files)."""
    monkeypatch.setenv("ROPE_CASES_DIR", "off")


def _assert(fn, case):
    return ASSERTS[fn.fused_op]("mutant", fn, case)


@needs_triton_on_cpu
@pytest.mark.parametrize("name, case, label", CASES, ids=[c[0] for c in CASES])
def test_each_mutant_fails_with_its_diagnosis(name, case, label):
    op = getattr(broken_fused, name).fused_op
    ASSERTS[op]("triton", PARENTS[op], case)               # the kernel itself passes
    with pytest.raises(AssertionError) as excinfo:
        _assert(getattr(broken_fused, name), case)
    assert failure_of(excinfo.value).get("cause") == label, str(excinfo.value)
    assert f"diagnosis: {label}" in str(excinfo.value)
    assert label in LABELS


def test_a_raise_is_a_tagged_failure():
    def raises(*args, **kwargs):
        raise RuntimeError("no kernel for this")
    raises.fused_op = "rope_kv_cache"
    with pytest.raises(AssertionError, match="raised RuntimeError: no kernel for this") as excinfo:
        assert_rope_kv_cache("raises", raises, FP8_CASE)
    assert failure_of(excinfo.value).get("cause") == "raised"


def test_cases_round_trip_through_their_records():
    for case in (FP8_CASE, SMALL_QK, SMALL_MLA):
        assert type(case).from_dict(case.to_dict()) == case
    with pytest.raises(ValueError, match="fields must be"):
        type(FP8_CASE).from_dict({"spec": FP8_CASE.spec.to_dict()})


# The MLA diagnosis's other rules, each on a broken call it must name (small cases: one launch each).
def _mla_broken(kind: str):
    def fn(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache, *, scale=None):
        k_in = k_pe.clone()
        if kind == "fp8_scale_multiplied":
            scale = 1.0 / scale
        q, k = mla_rope_kv_cache_triton(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache,
                                        scale=scale)
        if kind == "q_nope_touched":       # q's last nope channel of every head, written as a packed stride would
            q_pe.as_strided((q_pe.shape[0], q_pe.shape[1], 1), q_pe.stride(), q_pe.storage_offset() - 1).zero_()
        elif kind == "kv_c_touched":
            kv_c.zero_()
        elif kind == "live_key_unrotated":
            k.copy_(k_in.reshape(k.shape))
        elif kind == "padding_slot_written":
            kv_cache[-1, -1] = kv_cache[0, 0]
        return q, k
    fn.fused_op = "mla_rope_kv_cache"
    return fn


MLA_RULES = {
    "q_nope_touched": SMALL_MLA,
    "kv_c_touched": SMALL_MLA,
    "live_key_unrotated": SMALL_MLA,
    "fp8_scale_multiplied": SMALL_MLA,
    "padding_slot_written": mla_case(DEEPSEEK_V3, num_tokens=3, num_heads=1, kv_lora_rank=16, padding=1.0,
                                     num_blocks=1),
}


@needs_triton_on_cpu
@pytest.mark.parametrize("label", list(MLA_RULES))
def test_each_mla_rule_names_its_break(label):
    with pytest.raises(AssertionError) as excinfo:
        assert_mla_rope_kv_cache("broken", _mla_broken(label), MLA_RULES[label])
    assert failure_of(excinfo.value).get("cause") == label, str(excinfo.value)


# --------------------------------------------------------------------------- the batched check
def test_batch_verdicts_agree_with_the_one_case_check(monkeypatch, kernel_device):
    import dataclasses

    from rope.harness import report
    from rope.harness.fused.batch import check_batch
    from rope.harness.fused.check import check_case
    from rope.registry import get_fused_implementation
    monkeypatch.setenv(report.DISABLE_ENV, "1")
    # The small known cases (the interpreter runs the kernels) and a counter case; the built-in kernel
    # and a mutant each known case catches.
    known = {"qk_norm_rope": (KNOWN_QK_NORM, "norm_after_rotation"), "rope_kv_cache": (KNOWN_CACHE, "live_key_unrotated"),
             "mla_rope_kv_cache": (KNOWN_MLA, "q_pe_heads_read_packed")}
    for op, (cases, mutant) in known.items():
        cases = [c for c in cases.values() if c.num_tokens <= 40]
        cases.append(dataclasses.replace(cases[0], generator="counter", seed=cases[0].seed + 1))
        for name, fn in (("triton", get_fused_implementation("triton", op)), (mutant, getattr(broken_fused, mutant))):
            verdicts = check_batch(op, name, fn, cases, kernel_device)
            assert [v.case for v in verdicts] == cases
            for verdict, case in zip(verdicts, cases):
                alone = check_case(op, fn, case, kernel_device)
                assert verdict.passed == alone.ok, (op, name, case.brief(), verdict.detail, alone.problems)
            assert (name == "triton") == all(v.passed for v in verdicts), (op, name)
    with pytest.raises(ValueError, match="op='mla'"):
        check_batch("mla", "unfused", None, [], "cpu")


def test_batch_raise_and_nondeterminism_are_each_their_own(monkeypatch, kernel_device):
    from rope.harness import report
    from rope.harness.fused.batch import assert_batch_matches_reference, check_batch
    from rope.registry import get_fused_implementation
    monkeypatch.setenv(report.DISABLE_ENV, "1")
    triton = get_fused_implementation("triton", "rope_kv_cache")
    cases = [KNOWN_CACHE["sglang-19636-live-k"], KNOWN_CACHE["flashinfer-2792-padding-slots"]]
    calls = []

    def second_raises(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("illegal memory access")
        return triton(*args, **kwargs)

    def wrong_in_a_batch(*args, **kwargs):          # right alone, its first call in a batch wrong
        calls.append(1)
        return broken_fused.live_key_unrotated(*args, **kwargs) if len(calls) == 2 else triton(*args, **kwargs)

    verdicts = check_batch("rope_kv_cache", "raises", second_raises, cases, kernel_device)
    assert [v.outcome for v in verdicts] == ["passed", "raised"]
    assert "RuntimeError: illegal memory access" in verdicts[1].detail
    calls.clear()
    calls.append(1)
    with pytest.raises(AssertionError) as info:
        assert_batch_matches_reference("rope_kv_cache", "wrong-in-a-batch", wrong_in_a_batch, cases, kernel_device)
    assert failure_of(info.value)["cause"] == "nondeterministic"
