"""rope.diagnosis names the cause of a mismatch: every broken implementation in
properties/mutants on a fixed case where it fails, and synthetic outputs with one known defect."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import reference
from properties.checks import diagnose_run, evaluate_case
from properties.mutants.broken_rotations import BROKEN_ROTATIONS
from properties.strategies import RotationCase, build_rotation_inputs
from rope.diagnosis import LABELS, Diagnosis, diagnose, ranges
from rope.native import rotate_native
from rope.spec import RopeSpec

# Model shapes with short caches (the diagnosis does not depend on the cache length).
GLM_41V = RopeSpec(head_size=128, rotary_dim=64, is_neox_style=False, sections=(8, 12, 12),
                   layout="chunked", base=10000.0, max_position=4096)                        # GPT-J, partial
QWEN3_VL = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(24, 20, 20),
                    layout="interleaved", base=5000000.0, max_position=4096)
HUNYUAN_OCR = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(16, 16, 16, 16),
                       layout="chunked", base=10000.0, max_position=4096, ntk_alpha=1000.0)

# mutant -> (a case where it fails, expected label, a phrase the sentence must contain).
# float32 cases: the mutants wrap the native path and declare float32, so in fp16/bf16 they are
# imprecise as well; the second table checks the structural bug is still named then.
MUTANT_CASES = {
    "neox_for_gptj": (RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", False, 1),
                      "pairing_swapped", "NeoX pairs"),
    "chunked_for_interleaved": (RotationCase(QWEN3_VL, 5, 2, 1, "float32", "uniform", False, 2),
                                "interleave_map_wrong", "layout='chunked'"),
    "key_unrotated": (RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", False, 3),
                      "key_only", "never rotated"),
    "touches_pass_through": (RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", False, 4),
                             "pass_through_touched", "channels 64-127"),
    "first_pow2_heads": (RotationCase(GLM_41V, 5, 7, 3, "float32", "uniform", False, 5),
                         "head_subset", "query heads 4-6 of 7, key heads 2 of 3"),
    "assumes_contiguous": (RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", True, 6),
                           "row_stride_ignored", "row stride"),
    "bf16_claiming_fp32": (RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", False, 7),
                           "precision_loss", "computes in bfloat16 although it declares float32"),
}
MUTANT_CASES_LOW_PRECISION = {
    "neox_for_gptj": (RotationCase(GLM_41V, 11, 4, 2, "bfloat16", "uniform", False, 11), "pairing_swapped"),
    "chunked_for_interleaved": (RotationCase(QWEN3_VL, 7, 2, 1, "float16", "uniform", False, 12),
                                "interleave_map_wrong"),
    "key_unrotated": (RotationCase(HUNYUAN_OCR, 12, 4, 2, "bfloat16", "grid", False, 13), "key_only"),
    "first_pow2_heads": (RotationCase(GLM_41V, 1, 3, 0, "float16", "uniform", False, 14), "head_subset"),
    "assumes_contiguous": (RotationCase(QWEN3_VL, 9, 2, 1, "float16", "uniform", True, 15), "row_stride_ignored"),
}


def _diagnose(impl_name, fn, case) -> Diagnosis:
    run = evaluate_case(impl_name, fn, case, "cpu")
    assert not run.comparison.ok, f"{impl_name} does not fail on {case}: pick another case"
    return diagnose_run(fn, case, run)


def test_every_mutant_has_an_expected_diagnosis():
    assert set(MUTANT_CASES) == set(BROKEN_ROTATIONS)


@pytest.mark.parametrize("broken", list(MUTANT_CASES))
def test_diagnosis_names_broken_implementation(broken):
    case, label, phrase = MUTANT_CASES[broken]
    d = _diagnose(broken, BROKEN_ROTATIONS[broken], case)
    assert (d.label, phrase in d.sentence) == (label, True), d.lines()


@pytest.mark.parametrize("broken", list(MUTANT_CASES_LOW_PRECISION))
def test_diagnosis_names_structural_bug_despite_imprecision(broken):
    case, label = MUTANT_CASES_LOW_PRECISION[broken]
    d = _diagnose(broken, BROKEN_ROTATIONS[broken], case)
    assert d.label == label, d.lines()


# --------------------------------------------------------------------------- synthetic outputs
def _inputs(case):
    return build_rotation_inputs(case, "cpu")


def _correct(case):
    """A correct float32 output: the reference rounded once to the dtype."""
    x = _inputs(case)
    q, k = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    return x, q.to(x.query.dtype), None if k is None else k.to(x.query.dtype)


def _diagnosis_of(case, q_out, k_out, precision="float32", x=None) -> Diagnosis:
    x = x or _inputs(case)
    return diagnose(case.spec, x.positions, x.query, x.key, x.cache, q_out, k_out, precision=precision)


FP32_CASE = RotationCase(GLM_41V, 6, 4, 2, "float32", "uniform", False, 21)


def test_correct_output_is_a_match():
    x, q, k = _correct(FP32_CASE)
    assert _diagnosis_of(FP32_CASE, q, k, x=x).label == "match"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_is_named_with_its_first_location(value):
    x, q, k = _correct(FP32_CASE)
    q[2, 1 * 128 + 6] = value
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert d.label == "nan", d.lines()
    assert "query[token 2, head 1, channel 6]" in d.sentence


def test_only_key_wrong():
    x, q, k = _correct(FP32_CASE)
    k[3, 5] += 0.5
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert (d.label, "the query is right" in d.sentence) == ("key_only", True), d.lines()
    assert set(d.location) == {"key"} and d.location["key"]["tokens"] == "3 of 6"


def test_only_query_wrong():
    x, q, k = _correct(FP32_CASE)
    q[:, 128:128 + 64] *= 1.25                       # head 1, rotary channels
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert d.label == "query_only", d.lines()


def test_pass_through_touched():
    x, q, k = _correct(FP32_CASE)
    q[1, 2 * 128 + 100] += 1e-6                      # head 2, channel 100 >= rotary_dim 64
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert d.label == "pass_through_touched", d.lines()
    assert d.location["query"]["pass_through_channels"] == "100"


def test_shifted_section_boundary():
    # Rows 0 and 1 split at frequency 9 instead of 8 (a <= for <).
    shifted = dataclasses.replace(GLM_41V, sections=(9, 11, 12))
    x = _inputs(FP32_CASE)
    q, k = rotate_native(shifted, x.positions, x.query, x.key, x.cache)
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert (d.label, "sections=(9, 11, 12)" in d.sentence) == ("section_boundary_shifted", True), d.lines()
    assert d.location["query"]["freqs"].startswith("8 of"), d.location     # the one frequency that moved


def test_shifted_interleaved_bound():
    case = RotationCase(QWEN3_VL, 5, 2, 1, "float32", "uniform", False, 22)
    shifted = dataclasses.replace(QWEN3_VL, sections=(24, 21, 19))   # i < 3*s_h one step too far
    x = _inputs(case)
    q, k = rotate_native(shifted, x.positions, x.query, x.key, x.cache)
    assert _diagnosis_of(case, q, k, x=x).label == "section_boundary_shifted"


def test_swapped_position_rows():
    case = RotationCase(HUNYUAN_OCR, 6, 2, 1, "float32", "uniform", False, 23)
    x = _inputs(case)
    q, k = rotate_native(case.spec, x.positions[[0, 2, 1, 3]], x.query, x.key, x.cache)   # W and H swapped
    d = _diagnosis_of(case, q, k, x=x)
    assert (d.label, "(0, 2, 1, 3)" in d.sentence) == ("position_rows_swapped", True), d.lines()


def test_tokens_at_the_last_cache_row():
    case = RotationCase(GLM_41V, 8, 2, 1, "float32", "last_row", False, 24)
    x, q, k = _correct(case)
    last = (x.positions == case.spec.max_position - 1).any(dim=0)
    assert 0 < int(last.sum()) < case.num_tokens
    q[last] = x.query[last]                           # those tokens left unrotated
    k[last] = x.key[last]
    d = _diagnosis_of(case, q, k, x=x)
    assert (d.label, "last cache row" in d.sentence) == ("token_subset", True), d.lines()


def test_truncating_store_is_precision_loss():
    case = RotationCase(GLM_41V, 6, 4, 2, "bfloat16", "uniform", False, 25)
    x = _inputs(case)
    rq, rk = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)

    def truncate(t):                                  # fp32 -> bf16 by dropping the low bits
        return (t.to(torch.float32).view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    d = _diagnosis_of(case, truncate(rq), truncate(rk), x=x)
    assert (d.label, "modest" in d.sentence) == ("precision_loss", True), d.lines()


def test_writes_outside_and_wrong_output():
    def writes_positions(spec, positions, query, key, cache):
        q, k = rotate_native(spec, positions, query, key, cache)
        positions.fill_(0)
        return q, k

    def drops_key(spec, positions, query, key, cache):
        return rotate_native(spec, positions, query, key, cache)[0], None
    assert _diagnose("writes_positions", writes_positions, FP32_CASE).label == "writes_outside"
    assert _diagnose("drops_key", drops_key, FP32_CASE).label == "wrong_output"


def _garbage_rotary(case, x, heads_q, heads_k):
    """Correct output with random values in the rotary channels of the given heads."""
    _, q, k = _correct(case)
    gen = torch.Generator().manual_seed(0)
    rd, hs = case.spec.rotary_dim, case.spec.head_size
    for out, heads in ((q, heads_q), (k, heads_k)):
        for h in heads:
            out[:, h * hs: h * hs + rd] = torch.randn(out.shape[0], rd, generator=gen)
    return q, k


def test_garbage_is_unknown():
    x = _inputs(FP32_CASE)
    q, k = _garbage_rotary(FP32_CASE, x, range(4), range(2))
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert d.label == "unknown", d.lines()


def test_some_heads_wrong():
    x = _inputs(FP32_CASE)
    q, k = _garbage_rotary(FP32_CASE, x, [1, 2], [0])
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert (d.label, "query heads 1-2 of 4, key heads 0 of 2" in d.sentence) == ("head_subset", True), d.lines()


def test_garbage_everywhere_names_pass_through():
    x = _inputs(FP32_CASE)
    gen = torch.Generator().manual_seed(0)
    d = _diagnosis_of(FP32_CASE, torch.randn(x.query.shape, generator=gen), torch.randn(x.key.shape, generator=gen), x=x)
    assert (d.label, "rotary channels are wrong too" in d.sentence) == ("pass_through_touched", True), d.lines()


def test_labels_and_round_trip():
    d = Diagnosis("key_only", "sentence", {"key": {"tokens": "0-2 of 3"}})
    assert Diagnosis.from_dict(d.to_dict()) == d
    assert d.lines() == ["diagnosis: key_only: sentence", "  where: key: tokens 0-2 of 3"]
    assert {label for _, label, *_ in MUTANT_CASES.values()} <= set(LABELS)


def test_ranges():
    assert ranges([5, 0, 1, 2, 7, 8, 2]) == "0-2,5,7-8"
    assert ranges([]) == "none"
    assert ranges([3]) == "3"
