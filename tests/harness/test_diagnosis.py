"""rope.harness.rotation.diagnosis names the cause of a mismatch: every broken implementation in
properties/mutants on a fixed case where it fails (MUTANT_LABELS: every mutant rope.harness.mutation finds
has an entry), synthetic outputs with one known defect, and each rule of diagnosis.RULES on its own
(RULE_INPUTS: it fires on the input built for it, says nothing on a correct output, and the order
of RULES matters where a later rule would also fire on an earlier rule's input)."""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest
import torch

import reference
from properties import known_cases
from rope.harness.rotation.check import diagnose_run, evaluate_case
from rope.harness.rotation.guards import diagnose_guarded
from properties.mutants.broken_positions import BROKEN_POSITIONS, STEP_MODE_MUTANTS
from properties.mutants.broken_position_ids import BROKEN_POSITION_IDS
from properties.mutants.broken_backwards import BACKWARD_ONLY
from properties.mutants.broken_rotations import BROKEN_ROTATIONS, MODE_ONLY
from properties.mutants.dispatch import BROKEN_OPS
from properties.mutants.kernel import ROTARY_MUTANTS
from properties.strategies import DTYPES, RotationCase, build_rotation_inputs
from rope.devices import is_interpreter
from rope.harness.rotation import diagnosis
from rope.harness.rotation.bound import compare_rotation
from rope.harness.rotation.diagnosis import LABELS, RULES, Context, Diagnosis, diagnose, ranges
from rope.harness.mutation import discover_mutants
from rope.native import rotate_native
from rope.registry import working_precision
from rope.spec import RopeSpec

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

# Model shapes with short caches (the diagnosis does not depend on the cache length).
GLM_41V = RopeSpec(head_size=128, rotary_dim=64, is_neox_style=False, sections=(8, 12, 12),
                   layout="chunked", base=10000.0, max_position=4096)                        # GPT-J, partial
QWEN3_VL = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(24, 20, 20),
                    layout="interleaved", base=5000000.0, max_position=4096)
HUNYUAN_OCR = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(16, 16, 16, 16),
                       layout="chunked", base=10000.0, max_position=4096, ntk_alpha=1000.0)
GLM_ROUND_ROBIN = RopeSpec.glm_round_robin(128, 64, (8, 12, 12), max_position=4096)
ERNIE_45_VL = RopeSpec.ernie45(128, 128, (22, 22, 20), is_neox_style=False, base=500000.0, max_position=4096)
HUNYUAN_IMAGE = RopeSpec.two_row_interleaved(128, 128, max_position=4096)
# gpt-oss's YaRN (factor 32, mscale 1 + 0.1 ln 32: cos and sin reach 1.35) on a short table.
YARN_MSCALE = RopeSpec(64, 64, True, base=150000.0, max_position=4096,
                       scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position": 4096,
                                "beta_fast": 32.0, "beta_slow": 1.0})

# mutant -> (a case where it fails, expected label, a phrase the sentence must contain).
# float32 cases: the mutants wrap the native path and declare float32, so in fp16/bf16 they are
# imprecise as well; the second table checks the structural bug is still named then.
MUTANT_CASES = {
    "neox_for_gptj": (RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", False, 1),
                      "pairing_swapped", "NeoX pairs"),
    "chunked_for_interleaved": (RotationCase(QWEN3_VL, 5, 2, 1, "float32", "uniform", False, 2),
                                "axis_map_wrong", "layout='chunked'"),
    "chunked_for_two_row": (RotationCase(HUNYUAN_IMAGE, 5, 2, 1, "float32", "uniform", False, 21),
                            "axis_map_wrong", "layout='chunked' instead of 'two_row_interleaved'"),
    "glm_round_robin_without_skip": (RotationCase(GLM_ROUND_ROBIN, 5, 2, 1, "float32", "uniform", False, 22),
                                     "axis_map_wrong", "layout='interleaved' instead of 'glm_round_robin'"),
    "ernie45_h_w_swapped": (RotationCase(ERNIE_45_VL, 5, 2, 1, "float32", "uniform", False, 23),
                            "position_rows_swapped", "(0, 2, 1)"),
    "row_map_shifted_by_one": (RotationCase(ERNIE_45_VL, 5, 2, 1, "float32", "uniform", False, 24),
                               "axis_map_wrong", "read one frequency off"),
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
    "hides_nonfinite": (RotationCase(GLM_41V, 5, 3, 2, "bfloat16", "uniform", False, 8, nonfinite=True),
                        "nan", "finite where the reference is NaN/inf"),
    "fp32_table_rounded_to_activations": (RotationCase(GLM_41V, 5, 3, 2, "bfloat16", "uniform", False, 9,
                                                       cache_dtype="float32"),
                                          "table_misread", "float32 table rounded to bfloat16"),
    "table_clamped_to_unit": (RotationCase(YARN_MSCALE, 5, 3, 2, "float32", "uniform", False, 10),
                              "table_misread", "clamped to [-1, 1]"),
    "fast_math_angles": (RotationCase(dataclasses.replace(GLM_41V, sections=None, max_position=1 << 17), 5, 3, 2,
                                      "float32", "last_row", False, 11),
                         "angle_error", "do not reduce the argument exactly"),
    "heads_at_contiguous_stride": (RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", False, 26, view="heads-major"),
                                   "view_misread", "each head at the contiguous head stride"),
    "rows_as_wide_as_stride": (RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", False, 27, view="row-gaps"),
                               "wrote_outside_view", "outside q's and k's row-gaps views were modified"),
}
MUTANT_CASES_LOW_PRECISION = {
    "neox_for_gptj": (RotationCase(GLM_41V, 11, 4, 2, "bfloat16", "uniform", False, 11), "pairing_swapped"),
    "chunked_for_interleaved": (RotationCase(QWEN3_VL, 7, 2, 1, "float16", "uniform", False, 12),
                                "axis_map_wrong"),
    "key_unrotated": (RotationCase(HUNYUAN_OCR, 12, 4, 2, "bfloat16", "grid", False, 13), "key_only"),
    "first_pow2_heads": (RotationCase(GLM_41V, 1, 3, 0, "float16", "uniform", False, 14), "head_subset"),
    "assumes_contiguous": (RotationCase(QWEN3_VL, 9, 2, 1, "float16", "uniform", True, 15), "row_stride_ignored"),
}


def _diagnose(impl_name, fn, case) -> Diagnosis:
    run = evaluate_case(impl_name, fn, case, "cpu")
    assert not run.comparison.ok, f"{impl_name} does not fail on {case}: pick another case"
    return diagnose_run(fn, case, run)


def test_every_mutant_has_an_expected_diagnosis():
    assert set(MUTANT_CASES) == set(BROKEN_ROTATIONS) - set(MODE_ONLY)


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
    k[3, [5, 128 + 5]] += 0.5                        # token 3, both key heads
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert (d.label, "the query is right" in d.sentence) == ("key_only", True), d.lines()
    assert set(d.location) == {"key"} and d.location["key"]["tokens"] == "3 of 6"


def test_only_query_wrong():
    x, q, k = _correct(FP32_CASE)
    for head in range(FP32_CASE.num_q_heads):
        q[:, head * 128:head * 128 + 64] *= 1.25     # every head, rotary channels
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert d.label == "query_only", d.lines()


def test_some_heads_of_one_tensor_are_a_head_subset():
    # Query heads 1-3 wrong, head 0 and the key right: a head loop bound (e.g. the query's loop
    # bounded by the key's head count), not the whole query path.
    x, q, k = _correct(FP32_CASE)
    q[:, 128:] = x.query[:, 128:]                    # heads 1-3 left unrotated
    d = _diagnosis_of(FP32_CASE, q, k, x=x)
    assert (d.label, "query heads 1-3 of 4" in d.sentence) == ("head_subset", True), d.lines()


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


def _shifted_map(spec, offset):
    """The chunked map with every section boundary moved by ``offset`` (a <, <= slip)."""
    bounds = [b + offset for b in itertools.accumulate(spec.sections[:-1])]
    return [sum(b <= i for b in bounds) for i in range(spec.num_freqs)]


def _rotated_with_map(case, axis):
    x = _inputs(case)
    cos, sin = reference.rotation.select_cos_sin(case.spec, x.positions, x.cache, axis)
    q, k = (reference.rotation.rotate_heads(case.spec, t, cos, sin).to(t.dtype) for t in (x.query, x.key))
    return x, q, k


SYSTEMATIC_SPECS = {
    "qwen2-vl": RopeSpec(128, 128, True, (16, 24, 24), "chunked", max_position=4096),
    "glm-4.1v": GLM_41V,
    "4-row": RopeSpec(64, 32, True, (4, 4, 4, 4), "chunked", max_position=4096),
}


@pytest.mark.parametrize("offset", [1, -1])
@pytest.mark.parametrize("name", list(SYSTEMATIC_SPECS))
def test_every_boundary_shifted_by_one_is_one_cause(name, offset):
    # torch.bucketize(freq, cumsum(sections)) with its default right=False moves every boundary by +1
    # (frequencies 16 and 40 of (16, 24, 24) read the previous section's row); the converse slip by -1.
    spec = SYSTEMATIC_SPECS[name]
    case = RotationCase(spec, 6, 2, 1, "float32", "uniform", False, 61)
    axis = _shifted_map(spec, offset)
    x, q, k = _rotated_with_map(case, axis)
    d = _diagnosis_of(case, q, k, x=x)
    assert (d.label, f"every section boundary moved by {offset:+d} frequency" in d.sentence) == \
        ("section_boundary_shifted", True), d.lines()
    moved = [i for i, (a, b) in enumerate(zip(spec.axis_map(), axis)) if a != b]
    assert d.location["query"]["freqs"].startswith(f"{ranges(moved)} of {spec.num_freqs} (on section boundaries: ")


def test_bucketize_slip_on_grid_positions_is_a_section_boundary_shift():
    # The user's report: on an image grid, tokens whose rows are all equal come out right, which
    # token_subset took for evidence; the systematic shift names the one cause.
    spec = SYSTEMATIC_SPECS["qwen2-vl"]
    case = RotationCase(spec, 5, 2, 1, "bfloat16", "grid", True, 41)
    x, q, k = _rotated_with_map(case, _shifted_map(spec, 1))
    d = _diagnosis_of(case, q, k, x=x)
    assert (d.label, "torch.bucketize" in d.sentence) == ("section_boundary_shifted", True), d.lines()


def test_where_says_when_the_wrong_frequencies_sit_on_section_boundaries():
    spec = SYSTEMATIC_SPECS["qwen2-vl"]
    assert diagnosis.locations.boundary_note(spec, [16, 40]) == \
        " (on section boundaries: 16 opens row 1, 40 opens row 2)"
    assert diagnosis.locations.boundary_note(spec, [15]) == " (on section boundaries: 15 closes row 0)"
    assert diagnosis.locations.boundary_note(spec, [16, 17]) == ""             # 17 is inside row 1
    assert diagnosis.locations.boundary_note(RopeSpec(64, 64, True), [0]) == ""   # 1-D: no boundaries
    assert "on section boundaries" in diagnosis.locations.boundary_note(QWEN3_VL, [61])   # past 3*s_h = 60


def test_token_subset_leaves_out_tokens_whose_rows_are_all_equal():
    # A map bug cannot show on a token whose position rows are all equal: such a token being right
    # is no evidence that only some tokens are wrong.
    case = RotationCase(GLM_41V, 6, 2, 1, "float32", "uniform", False, 62)
    x = _inputs(case)
    x.positions[:, :2] = x.positions[0, :2]             # tokens 0-1: text tokens (all rows equal)
    q, k = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    q, k = q.to(x.query.dtype), k.to(x.key.dtype)
    gen = torch.Generator().manual_seed(0)
    for out in (q, k):                                   # tokens 2-5 wrong, beyond any configuration
        out[2:, :64] = torch.randn(4, 64, generator=gen)
    ctx = _context(case, q, k, x=x)
    assert RULE["token_subset"](ctx) is None
    # The same wrong tokens beside a right token with distinct rows are a token subset.
    x.positions[:, 1] = torch.tensor([7, 8, 9])
    q1, k1 = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    q1[2:], k1[2:] = q[2:].double(), k[2:].double()
    d = RULE["token_subset"](_context(case, q1.to(x.query.dtype), k1.to(x.key.dtype), x=x))
    assert d is not None and "only tokens 2-5 of 6" in d.sentence, d and d.lines()


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
    writes_positions, drops_key = _writes_positions, _drops_key      # defined with the rule tests below
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


# --------------------------------------------------------------------------- every mutant
# Every mutant rope.harness.mutation.discover_mutants finds in properties/mutants -> how the diagnosis of
# its output is checked, on a case where it fails:
#   ("plain", case, label, phrase)    the implementation on plain inputs (test_rotation.py's check)
#   ("guarded", case, label, phrase)  on guarded inputs (rope/harness/guards.py): guard-only bugs
#   ("op", case, label, phrase)       a broken op class, called twice (test_dispatch.py's check)
#   ("batch_dim", case, label, phrase) a broken op called with positions [D, 1, T]
#   ("raises", case, platform, phrase) an op that crashes before any output: nothing to diagnose
#   NO_ROTATION                       a positions mutant: it produces no rotation output
#   POSITION_IDS                      a position-id mutant, diagnosed by its own module
NO_ROTATION = ("no rotation output",)
# A position-id mutant: its diagnosis (rope.harness.position_ids.diagnosis) is checked per mutant by
# test_position_ids_harness.py::test_fixed_prompt_catches_mutant_with_its_diagnosis.
POSITION_IDS = ("position ids: test_position_ids_harness.py",)
GPU_ONLY = ("its bug shows only past 2^31 elements: a GPU in the deep profile",)
MODE = ("wrong only in a mode (properties/rotation/test_modes.py): its cause is the mode's label",)
# A broken backward: its label is the backward check's (tests/kernels/test_rotation_backward.py checks each).
BACKWARD = ("wrong only in its backward (properties/rotation/test_backward.py): its cause is the backward's label",)
# The table's and the fused ops' mutants are diagnosed by their own slices (tests/harness/test_table_check.py,
# test_fused_check.py), not by the rotation's rules.
OWN_SLICE = ("diagnosed by its own slice's rules (rope/harness/table/, rope/harness/fused/)",)
PADDING_LANES = dataclasses.replace(known_cases.PADDING_LANES, max_position=4096)      # head 80: lanes 40..63
QWEN35 = dataclasses.replace(known_cases.QWEN35, max_position=4096)                    # head 256, rotary 64
SMALL_INTERLEAVED = known_cases.SMALL_INTERLEAVED                                      # [8, 12, 12] of 32
GLM_41V_NEOX = dataclasses.replace(GLM_41V, is_neox_style=True)                        # partial, NeoX
MROPE_CHUNKED = RopeSpec(32, 16, False, (2, 3, 3), max_position=64)                    # test_dispatch's
XDROPE4 = RopeSpec(32, 32, True, (4, 4, 4, 4), max_position=64, ntk_alpha=1000.0)

_OWN_SLICE_MUTANTS = [m.name for m in discover_mutants() if m.kind in ("table", "fused")]
MUTANT_LABELS = {
    **{f"broken_rotations:{name}": ("plain", case, label, phrase)
       for name, (case, label, phrase) in MUTANT_CASES.items()},
    "kernel:neox_for_gptj": ("plain", RotationCase(GLM_41V, 5, 3, 2, "bfloat16", "uniform", False, 1),
                             "pairing_swapped", "NeoX pairs"),
    "kernel:cos_sin_unmasked": ("guarded", RotationCase(PADDING_LANES, 3, 2, 1, "bfloat16", "last_row", False, 10),
                                "out_of_bounds_read", "cos_sin_cache: "),
    "kernel:cos_sin_unmasked_head_padded": (
        "guarded", RotationCase(QWEN35, 3, 2, 1, "bfloat16", "last_row", False, 3), "out_of_bounds_read",
        "cos_sin_cache: "),
    "kernel:partial_rotary_head_half": ("plain", RotationCase(GLM_41V, 5, 4, 2, "float32", "uniform", True, 4),
                                        "partial_rotary_stride", "head_size/2 = 64 where rotary_dim/2 = 32"),
    "kernel:interleaved_h_bound_off_by_one": (
        "plain", RotationCase(QWEN3_VL, 5, 2, 2, "float32", "uniform", False, 5), "section_boundary_shifted",
        "frequency 61 takes row 1 instead of row 0"),
    "kernel:interleaved_thw_order_swapped": (
        "plain", RotationCase(SMALL_INTERLEAVED, 5, 4, 1, "float32", "uniform", False, 6), "position_rows_swapped",
        "(0, 2, 1)"),
    "kernel:row_map_table_shifted": (
        "plain", RotationCase(ERNIE_45_VL, 5, 2, 1, "float32", "uniform", False, 25), "axis_map_wrong",
        "read one frequency off"),
    # Identical to the right kernel on contiguous positions: the guarded, row-strided ones read guards
    # (clamped to a cache row by the kernel, so the output is the reference for other positions).
    # The sentinel it reads as a position is clamped to a cache row: other positions than given.
    "kernel:positions_rows_packed": ("guarded", RotationCase(QWEN3_VL, 9, 2, 1, "float16", "uniform", True, 8),
                                     "wrong_positions", "other positions than given"),
    "kernel:positions_rows_at_token_offsets": (
        "plain", RotationCase(QWEN3_VL, 9, 2, 1, "float16", "uniform", True, 8), "position_rows_misread",
        "positions[0, t + d]"),
    "kernel:positions_store_unmasked": NO_ROTATION,
    "kernel:offsets_32bit": GPU_ONLY,
    "kernel:cache_offsets_32bit": GPU_ONLY,
    # Right below 4,096 tokens; GPT-J paired NeoX-style from there (a prefill-size path).
    "kernel:neox_pairs_from_4096_tokens": (
        "plain", RotationCase(RopeSpec(32, 32, False, (4, 6, 6), max_position=4096), 4096, 1, 0, "float32",
                              "uniform", False, 9), "pairing_swapped", "NeoX pairs"),
    **{f"broken_rotations:{name}": MODE for name in MODE_ONLY},
    **{f"broken_backwards:{name}": BACKWARD for name in BACKWARD_ONLY},
    **{name: OWN_SLICE for name in _OWN_SLICE_MUTANTS},
    **{f"broken_positions:{name}": NO_ROTATION for name in BROKEN_POSITIONS},
    **{f"broken_positions:{name}": NO_ROTATION for name in STEP_MODE_MUTANTS},
    **{f"broken_position_ids:{name}": POSITION_IDS for name in BROKEN_POSITION_IDS},
    "dispatch:mrope_without_xpu_cpu_overrides": (
        "raises", RotationCase(MROPE_CHUNKED, 4, 2, 1, "float32", "uniform", False, 41), "cpu",
        "must have the same batch_size and seq_len"),
    "dispatch:xdrope_without_xpu_override": (
        "raises", RotationCase(XDROPE4, 4, 2, 1, "float32", "uniform", False, 42), "xpu",
        "must have the same batch_size and seq_len"),
    "dispatch:mrope_cached_cos_sin": ("op", RotationCase(GLM_41V, 5, 3, 2, "bfloat16", "uniform", False, 43),
                                      "wrong_positions", "other positions than given"),
    # Its outputs are right; its bug is accepting [3, 1, T] (test_dispatch.py rejects it for that).
    "dispatch:mrope_accepts_batch_dim": ("batch_dim", RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", False, 44),
                                         "match", "match the reference"),
}


def test_every_mutant_has_an_expected_label():
    names = [m.name for m in discover_mutants()]
    assert sorted(MUTANT_LABELS) == sorted(names), "a mutant without an expected diagnosis (or a stale entry)"
    kinds = {m.name: m.kind for m in discover_mutants()}
    for name, entry in MUTANT_LABELS.items():
        assert (entry is NO_ROTATION) == kinds[name].startswith("positions"), name
        assert (entry is POSITION_IDS) == (kinds[name] == "position-ids"), name
        if entry[0] in ("plain", "guarded", "op", "batch_dim"):
            assert entry[2] in LABELS, (name, entry[2])


def test_accuracy_table_expects_the_labels_named_here():
    # docs/mutation.md's accuracy table (tests/harness/diagnosis_accuracy.py) holds each rotation
    # mutant to the label this file checks on its fixed case.
    from tests.harness.diagnosis_accuracy import MUTANT_LABELS as ACCURACY_LABELS
    for name, (_, label) in ACCURACY_LABELS.items():
        entry = MUTANT_LABELS[name]
        if entry is not GPU_ONLY:
            assert entry[2] == label, (name, entry[2], label)


def _op_label(how, case, broken_cls):
    x = build_rotation_inputs(case)
    op = broken_cls(case.spec, DTYPES[case.dtype], platform="cpu", custom_ops=False)
    if how == "op":                       # a first call with other positions, then the case
        first = build_rotation_inputs(dataclasses.replace(case, seed=case.seed + 1))
        op(first.positions, first.query, first.key)
        positions = x.positions
    else:
        positions = x.positions.unsqueeze(-2)
    q, k = op(positions, x.query.clone(), x.key.clone())
    return diagnose(case.spec, x.positions, x.query, x.key, x.cache, q, k,
                    precision=rotate_native.working_precision)


@pytest.mark.parametrize("name", sorted(n for n, e in MUTANT_LABELS.items()
                                        if e not in (NO_ROTATION, GPU_ONLY, POSITION_IDS, MODE, BACKWARD, OWN_SLICE)))
def test_diagnosis_names_every_mutant(name):
    how, case, expected, phrase = MUTANT_LABELS[name]
    module, attr = name.split(":")
    if module == "kernel" and not is_interpreter():
        pytest.skip("kernel mutants run here under Triton's interpreter (TRITON_INTERPRET=1) on the CPU")
    if how == "raises":
        _, broken_cls = BROKEN_OPS[attr]
        x = build_rotation_inputs(case)
        op = broken_cls(case.spec, DTYPES[case.dtype], platform=expected, custom_ops=True)
        with pytest.raises(RuntimeError, match=phrase):
            op(x.positions, x.query, x.key)
        return
    if module == "dispatch":
        d = _op_label(how, case, BROKEN_OPS[attr][1])
    else:
        fn = ROTARY_MUTANTS[attr] if module == "kernel" else BROKEN_ROTATIONS[attr]
        d = _diagnose(name, fn, case) if how == "plain" else diagnose_guarded(fn, case)
    assert (d.label, phrase in d.sentence) == (expected, True), d.lines()


def test_partial_rotary_stride_with_neox_pairs():
    # NeoX partial rotary: the partner channel i + head_size/2 is a pass-through channel.
    case = RotationCase(GLM_41V_NEOX, 5, 3, 2, "float32", "uniform", False, 45)
    if not is_interpreter():
        pytest.skip("needs Triton's interpreter")
    d = _diagnose("partial_rotary_head_half", ROTARY_MUTANTS["partial_rotary_head_half"], case)
    assert (d.label, "pairs channels (i, i + 64)" in d.sentence) == ("partial_rotary_stride", True), d.lines()


def test_rows_read_as_row_zero_is_misread():
    case = RotationCase(HUNYUAN_OCR, 6, 2, 1, "float32", "uniform", False, 46)
    x = _inputs(case)
    q, k = rotate_native(case.spec, x.positions[[0, 0, 0, 0]], x.query, x.key, x.cache)
    d = _diagnosis_of(case, q, k, x=x)
    assert (d.label, "every row read as row 0" in d.sentence) == ("position_rows_misread", True), d.lines()


def test_labels_and_round_trip():
    d = Diagnosis("key_only", "sentence", {"key": {"tokens": "0-2 of 3"}})
    assert Diagnosis.from_dict(d.to_dict()) == d
    assert d.lines() == ["diagnosis: key_only: sentence", "  where: key: tokens 0-2 of 3"]
    assert {label for _, label, *_ in MUTANT_CASES.values()} <= set(LABELS)


def test_ranges():
    assert ranges([5, 0, 1, 2, 7, 8, 2]) == "0-2,5,7-8"
    assert ranges([]) == "none"
    assert ranges([3]) == "3"


def _block_layout_rotation(case, x):
    """Each rotary channel c takes the position row of its block of 2*s_i channels (sections laid
    over the whole head, as transformers' HunYuanVL does), written channel by channel."""
    spec = case.spec
    half, hs = spec.num_freqs, spec.head_size
    block_of = [d for d, s in enumerate(spec.sections) for _ in range(2 * s)]
    cache = x.cache.to(torch.float64)

    def rotate(t):
        if t is None:
            return None
        heads = t.to(torch.float64).reshape(t.shape[0], -1, hs)
        out = heads.clone()
        for c in range(spec.rotary_dim):
            i, partner = c % half, (c + half) % spec.rotary_dim
            pos = x.positions[block_of[c]].long()
            cos, sin = cache[pos, i][:, None], cache[pos, half + i][:, None]
            sign = -1.0 if c < half else 1.0
            out[..., c] = heads[..., c] * cos + sign * heads[..., partner] * sin
        return out.reshape(t.shape).to(t.dtype)
    return rotate(x.query), rotate(x.key)


def test_pair_members_on_different_rows_is_pair_rows_split():
    case = RotationCase(HUNYUAN_OCR, 6, 2, 1, "float32", "uniform", False, 47)
    x = _inputs(case)
    q, k = _block_layout_rotation(case, x)
    d = _diagnosis_of(case, q, k, x=x)
    assert (d.label, "blocks of 2*s_i" in d.sentence) == ("pair_rows_split", True), d.lines()


def test_transformers_hunyuan_vl_divergence_is_pair_rows_split():
    # The real thing: transformers' HunYuanVL rotation (tests/backends/regressions/transformers).
    from rope.registry import get_implementation, unsupported_reason
    try:
        fn = get_implementation("transformers")
    except ValueError as exc:
        pytest.skip(f"transformers adapter unavailable: {exc}")
    case = RotationCase(HUNYUAN_OCR, 6, 2, 1, "float32", "uniform", False, 48)
    reason = unsupported_reason("transformers", fn, case.spec, torch.float32, "cpu")
    if reason:
        pytest.skip(reason)
    x = _inputs(case)
    q, k = fn(case.spec, x.positions, x.query.clone(), x.key.clone(), x.cache)
    d = _diagnosis_of(case, q, k, x=x, precision="activation")
    assert d.label == "pair_rows_split", d.lines()


def test_chunked_boundary_that_empties_a_row_is_section_boundary_shifted():
    # The kernel's first chunked boundary tested with > instead of >=: with sections (1, 1, 30)
    # frequency 1 takes row 0 and row 1 none (a split no RopeSpec can express).
    if not is_interpreter():
        pytest.skip("needs Triton's interpreter")
    from rope.harness.mutation.kernel_mutant import KernelMutant, rotary_module
    broken = KernelMutant("chunked_boundary_gt", rotary_module, "rotate_triton",
                          [("axis += (freq >= sec0).to(tl.int32)", "axis += (freq > sec0).to(tl.int32)")],
                          "chunked boundary tested with >")
    spec = RopeSpec(64, 64, False, (1, 1, 30), "chunked", max_position=4096)
    case = RotationCase(spec, 3, 2, 1, "float32", "uniform", False, 49)
    d = _diagnose("chunked_boundary_gt", broken, case)
    assert (d.label, "frequency 1 takes row 0 instead of row 1" in d.sentence) == \
        ("section_boundary_shifted", True), d.lines()


# --------------------------------------------------------------------------- rules, one by one
def _context(case, q_out, k_out, precision="float32", x=None, comparison=None) -> Context:
    x = x or _inputs(case)
    return Context.build(case.spec, x.positions, x.query, x.key, x.cache, q_out, k_out, precision=precision,
                         comparison=comparison)


def _run_context(impl_name, fn, case) -> Context:
    """The context diagnose_run builds for ``fn`` on the case."""
    run = evaluate_case(impl_name, fn, case, "cpu")
    x = run.ref_in
    return Context.build(case.spec, x.positions, x.query, x.key, x.cache, run.q_out, run.k_out,
                         precision=working_precision(fn), ref=(run.ref_q, run.ref_k), comparison=run.comparison)


def _rotated_by(case, spec=None, positions=None) -> Context:
    """The native rotation with another spec and/or other positions than the case's."""
    x = _inputs(case)
    q, k = rotate_native(spec or case.spec, x.positions if positions is None else positions(x.positions),
                         x.query, x.key, x.cache)
    return _context(case, q, k, x=x)


def _writes_positions(spec, positions, query, key, cache):
    q, k = rotate_native(spec, positions, query, key, cache)
    positions.fill_(0)
    return q, k


def _drops_key(spec, positions, query, key, cache):
    return rotate_native(spec, positions, query, key, cache)[0], None


def _nan_input(case):
    x, q, k = _correct(case)
    q[2, 1 * 128 + 6] = float("nan")
    return _context(case, q, k, x=x)


def _traced_read_input(case):
    # Right values, but the guards' tracer saw reads past the cache (rope/harness/guards.py's wording).
    x, q, k = _correct(case)
    comparison = compare_rotation(case.spec, x.positions, x.query, x.key, x.cache, q, k,
                                  *reference.rotate(case.spec, x.positions, x.query, x.key, x.cache))
    comparison.problems.append("cos_sin_cache: 96 out-of-bounds read(s) of guard elements (traced), first at "
                               "element 262144")
    return _context(case, q, k, x=x, comparison=comparison)


def _far_sin_input(case):
    # Partial rotary with head_size/2 = 64 where rotary_dim/2 = 32 belongs (docs/spec.md §7.3) as the sin
    # offset into a cache row of rotary_dim = 64: sin of frequency i is element 64 + i of row p,
    # that is element i of row p + 1: the cos of the next row.
    spec = case.spec
    assert spec.head_size // 2 == spec.rotary_dim
    x = _inputs(case)
    rows = x.positions.long().reshape(spec.num_dims, -1)
    assert int(rows.max()) + 1 < spec.max_position
    cos, _ = reference.rotation.select_cos_sin(spec, rows, x.cache)
    far_sin, _ = reference.rotation.select_cos_sin(spec, rows + 1, x.cache)
    q, k = (reference.rotation.rotate_heads(spec, t, cos, far_sin).to(t.dtype) for t in (x.query, x.key))
    return _context(case, q, k, x=x)


def _imprecise_pairing_input(case):
    # Two bugs at once: NeoX pairs for a GPT-J spec, and every value rounded through bfloat16.
    x = _inputs(case)
    q, k = rotate_native(dataclasses.replace(case.spec, is_neox_style=not case.spec.is_neox_style),
                         x.positions, x.query, x.key, x.cache)
    return _context(case, q.to(torch.bfloat16).to(q.dtype), k.to(torch.bfloat16).to(k.dtype), x=x)


def _block_layout_input(case):
    x = _inputs(case)
    return _context(case, *_block_layout_rotation(case, x), x=x)


def _pass_through_input(case):
    x, q, k = _correct(case)
    q[1, 2 * 128 + 100] += 1e-6                      # head 2, channel 100 >= rotary_dim 64
    return _context(case, q, k, x=x)


def _truncated_input(case):
    x = _inputs(case)
    rq, rk = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)

    def truncate(t):                                  # fp32 -> bf16 by dropping the low bits
        return (t.to(torch.float32).view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    return _context(case, truncate(rq), truncate(rk), x=x)


def _key_wrong_input(case):
    x, q, k = _correct(case)
    k[3, [5, 128 + 5]] += 0.5                        # token 3, both key heads
    return _context(case, q, k, x=x)


def _query_wrong_input(case):
    x, q, k = _correct(case)
    for head in range(case.num_q_heads):
        q[:, head * 128:head * 128 + 64] *= 1.25     # every head, rotary channels
    return _context(case, q, k, x=x)


def _sin_flipped_input(case):
    x = _inputs(case)
    cos, sin = reference.rotation.select_cos_sin(case.spec, x.positions, x.cache)
    q, k = (reference.rotation.rotate_heads(case.spec, t, cos, -sin).to(t.dtype) for t in (x.query, x.key))
    return _context(case, q, k, x=x)


def _garbage_input(case, heads_q, heads_k):
    x = _inputs(case)
    return _context(case, *_garbage_rotary(case, x, heads_q, heads_k), x=x)


def _last_row_input(case):
    x, q, k = _correct(case)
    last = (x.positions == case.spec.max_position - 1).any(dim=0)
    q[last], k[last] = x.query[last], x.key[last]     # those tokens left unrotated
    return _context(case, q, k, x=x)


def _random_output_input(case):
    x = _inputs(case)
    gen = torch.Generator().manual_seed(0)
    return _context(case, torch.randn(x.query.shape, generator=gen), torch.randn(x.key.shape, generator=gen), x=x)


BF16_CASE = RotationCase(GLM_41V, 6, 4, 2, "bfloat16", "uniform", False, 25)
QWEN3_VL_CASE = RotationCase(QWEN3_VL, 5, 2, 1, "float32", "uniform", False, 22)
HUNYUAN_CASE = RotationCase(HUNYUAN_OCR, 6, 2, 1, "float32", "uniform", False, 23)
LAST_ROW_CASE = RotationCase(GLM_41V, 8, 2, 1, "float32", "last_row", False, 24)
FP32_TABLE_CASE = RotationCase(GLM_41V, 6, 4, 2, "bfloat16", "uniform", False, 25, cache_dtype="float32")
LONG_1D_CASE = RotationCase(RopeSpec(64, 64, True, max_position=1 << 17), 6, 2, 1, "float32", "last_row", False, 26)


def _broken_rotation_input(name):
    return lambda case: _run_context(name, BROKEN_ROTATIONS[name], case)


def _own_angles_input(case):
    # The fast-math emulation (properties/mutants/own_angles.py), compared as an own-angle
    # implementation is: with the exact angles' rotation and the own-angle bound.
    from rope.harness.rotation.check import exact_rotation
    x = _inputs(case)
    q, k = BROKEN_ROTATIONS["fast_math_angles"](case.spec, x.positions, x.query, x.key, x.cache)
    ref_q, ref_k = exact_rotation(case.spec, x.positions, x.query, x.key)
    comparison = compare_rotation(case.spec, x.positions, x.query, x.key, x.cache, q, k, ref_q, ref_k, "float32",
                                  angles="own-float32")
    return Context.build(case.spec, x.positions, x.query, x.key, x.cache, q, k, precision="float32",
                         ref=(ref_q, ref_k), comparison=comparison, angles="own-float32")

# rule name -> (its case, a builder of the input made for it, the label it gives, a phrase of its sentence)
RULE_INPUTS = {
    "writes_outside": (FP32_CASE, lambda c: _run_context("writes_positions", _writes_positions, c),
                       "writes_outside", "positions were modified"),
    "wrote_outside_view": (MUTANT_CASES["rows_as_wide_as_stride"][0],
                           lambda c: _run_context("rows_as_wide_as_stride", BROKEN_ROTATIONS["rows_as_wide_as_stride"], c),
                           "wrote_outside_view", "the gap after query row 0"),
    "wrong_output": (FP32_CASE, lambda c: _run_context("drops_key", _drops_key, c), "wrong_output", "key"),
    "nonfinite_output": (FP32_CASE, _nan_input, "nan", "query[token 2, head 1, channel 6]"),
    "out_of_bounds_read": (FP32_CASE, _traced_read_input, "out_of_bounds_read", "cos_sin_cache: 96 out-of-bounds"),
    "pairing_swapped": (FP32_CASE, lambda c: _rotated_by(c, spec=dataclasses.replace(GLM_41V, is_neox_style=True)),
                        "pairing_swapped", "NeoX pairs"),
    "cos_sin_misused": (FP32_CASE, _sin_flipped_input, "cos_sin_misused", "sin's sign flipped"),
    "axis_map_wrong": (QWEN3_VL_CASE, lambda c: _rotated_by(c, spec=dataclasses.replace(QWEN3_VL, layout="chunked")),
                       "axis_map_wrong", "layout='chunked' instead of 'interleaved'"),
    "section_boundary_shifted": (
        FP32_CASE, lambda c: _rotated_by(c, spec=dataclasses.replace(GLM_41V, sections=(9, 11, 12))),
        "section_boundary_shifted", "sections=(9, 11, 12)"),
    "position_rows_swapped": (HUNYUAN_CASE, lambda c: _rotated_by(c, positions=lambda p: p[[0, 2, 1, 3]]),
                              "position_rows_swapped", "(0, 2, 1, 3)"),
    "position_rows_misread": (HUNYUAN_CASE, lambda c: _rotated_by(c, positions=lambda p: p[[0, 0, 0, 0]]),
                              "position_rows_misread", "every row read as row 0"),
    "row_stride_ignored": (MUTANT_CASES["assumes_contiguous"][0],
                           lambda c: _run_context("assumes_contiguous", BROKEN_ROTATIONS["assumes_contiguous"], c),
                           "row_stride_ignored", "row stride"),
    "view_misread": (MUTANT_CASES["heads_at_contiguous_stride"][0],
                     lambda c: _run_context("heads_at_contiguous_stride", BROKEN_ROTATIONS["heads_at_contiguous_stride"],
                                            c),
                     "view_misread", "query strides (1, 5)"),
    "partial_rotary_stride": (FP32_CASE, _far_sin_input, "partial_rotary_stride",
                              "sin read at offset head_size/2 + i"),
    "pair_rows_split": (RotationCase(HUNYUAN_OCR, 6, 2, 1, "float32", "uniform", False, 47), _block_layout_input,
                        "pair_rows_split", "blocks of 2*s_i"),
    "pass_through_only": (FP32_CASE, _pass_through_input, "pass_through_touched", "channels 100"),
    "modest_rounding": (BF16_CASE, _truncated_input, "precision_loss", "modest"),
    "lower_working_precision": (
        MUTANT_CASES["bf16_claiming_fp32"][0],
        lambda c: _run_context("bf16_claiming_fp32", BROKEN_ROTATIONS["bf16_claiming_fp32"], c),
        "precision_loss", "computes in bfloat16 although it declares float32"),
    "imprecise_neighbour": (FP32_CASE, _imprecise_pairing_input, "pairing_swapped",
                            "besides, the arithmetic fits bfloat16 working precision, not the declared float32"),
    "key_only": (FP32_CASE, _key_wrong_input, "key_only", "the query is right"),
    "query_only": (FP32_CASE, _query_wrong_input, "query_only", "the key is right"),
    "head_subset": (FP32_CASE, lambda c: _garbage_input(c, [1, 2], [0]), "head_subset",
                    "query heads 1-2 of 4, key heads 0 of 2"),
    "token_subset": (LAST_ROW_CASE, _last_row_input, "token_subset", "last cache row"),
    "table_misread": (FP32_TABLE_CASE, _broken_rotation_input("fp32_table_rounded_to_activations"),
                      "table_misread", "float32 table rounded to bfloat16"),
    "own_angles_off": (LONG_1D_CASE, _own_angles_input, "angle_error", "do not reduce the argument exactly"),
    "wrong_positions": (FP32_CASE, lambda c: _rotated_by(c, positions=lambda p: (p + 5) % GLM_41V.max_position),
                        "wrong_positions", "other positions than given"),
    "pass_through_and_rotary": (FP32_CASE, _random_output_input, "pass_through_touched",
                                "rotary channels are wrong too"),
}
RULE_NAMES = [rule.__name__ for rule in RULES]
RULE = dict(zip(RULE_NAMES, RULES))


def test_every_rule_has_an_input():
    assert sorted(RULE_INPUTS) == sorted(RULE_NAMES)


def test_rules_are_listed_in_order_in_the_module_docstring():
    listed = re.findall(r"^\s*(\d+)\. ``(\w+)``", diagnosis.__doc__, re.M)
    assert listed == [(str(i), name) for i, name in enumerate(RULE_NAMES, 1)]
    assert len(set(RULE_NAMES)) == len(RULE_NAMES)


def test_every_rule_says_what_it_recognises_and_why_it_sits_there():
    for rule in RULES:
        doc = rule.__doc__ or ""
        assert "\n\n" in doc.strip(), f"{rule.__name__}: what it recognises, a blank line, why it sits where it does"
    # Rules of a known bug cite the spec.
    for name in ("pairing_swapped", "axis_map_wrong", "section_boundary_shifted", "position_rows_swapped",
                 "position_rows_misread", "partial_rotary_stride", "nonfinite_output", "out_of_bounds_read",
                 "wrong_positions"):
        assert "docs/spec.md §7." in RULE[name].__doc__, name


@pytest.mark.parametrize("name", RULE_NAMES)
def test_rule_fires_on_its_input_and_not_on_a_correct_output(name):
    case, build, label, phrase = RULE_INPUTS[name]
    ctx = build(case)
    d = RULE[name](ctx)
    assert d is not None and (d.label, phrase in d.sentence) == (label, True), d and d.lines()
    assert diagnose(case.spec, ctx.positions, ctx.query, ctx.key, ctx.cache, ctx.out_q, ctx.out_k,
                    precision=ctx.precision, ref=(ctx.ref_q, ctx.ref_k), comparison=ctx.comparison,
                    angles=ctx.angles) == d
    x, q, k = _correct(case)
    assert RULE[name](_context(case, q, k, x=x)) is None


# Where the order of RULES matters: the later rule also fires on the earlier rule's input, and the
# earlier one names the cause.  (earlier, later)
ORDER_MATTERS = [
    ("writes_outside", "wrong_output"),            # a modified input is a problem like any other
    ("nonfinite_output", "token_subset"),          # one NaN in the query: token 2 alone is "wrong"
    ("nonfinite_output", "head_subset"),
    ("out_of_bounds_read", "modest_rounding"),     # right values: every error/bound ratio is modest
    ("position_rows_swapped", "wrong_positions"),  # swapped rows are other positions, more specifically
    ("row_stride_ignored", "token_subset"),        # the first token's row reads right
    ("pass_through_only", "lower_working_precision"),   # a tiny pass-through change fits bf16 rounding
    ("modest_rounding", "lower_working_precision"),     # one rounding too many is not a whole precision
    ("lower_working_precision", "pass_through_and_rotary"),   # bf16 arithmetic rounds pass-through too
    ("imprecise_neighbour", "pass_through_and_rotary"),
    ("key_only", "token_subset"),                  # the key wrong at one token
    ("token_subset", "wrong_positions"),           # unrotated tokens are rotated by position 0
]


@pytest.mark.parametrize("earlier, later", ORDER_MATTERS, ids=[f"{a}-before-{b}" for a, b in ORDER_MATTERS])
def test_rule_order_matters(earlier, later):
    assert RULE_NAMES.index(earlier) < RULE_NAMES.index(later)
    case, build, label, _ = RULE_INPUTS[earlier]
    ctx = build(case)
    assert RULE[later](ctx) is not None, f"{later} does not fire on {earlier}'s input: not an order test"
    assert diagnose(case.spec, ctx.positions, ctx.query, ctx.key, ctx.cache, ctx.out_q, ctx.out_k,
                    precision=ctx.precision, ref=(ctx.ref_q, ctx.ref_k), comparison=ctx.comparison).label == label


def test_imprecise_neighbour_is_what_names_a_structural_bug_in_low_precision():
    # The swapped pairing explains the output only with bf16 rounding allowed, so pairing_swapped
    # (to the declared precision) does not fire, imprecise_neighbour does.
    case, build, _, _ = RULE_INPUTS["imprecise_neighbour"]
    ctx = build(case)
    assert RULE["pairing_swapped"](ctx) is None
    assert RULE["imprecise_neighbour"](ctx).label == "pairing_swapped"


def test_neighbouring_rules_do_not_fire_on_each_others_inputs():
    # The neighbouring configurations (rules 6-16) each explain only their own bug's output.
    neighbours = RULE_NAMES[RULE_NAMES.index("pairing_swapped"):RULE_NAMES.index("pair_rows_split") + 1]
    assert neighbours == list(diagnosis.NEIGHBOURS)
    for name in neighbours:
        case, build, _, _ = RULE_INPUTS[name]
        ctx = build(case)
        fired = [other for other in neighbours if RULE[other](ctx) is not None]
        assert fired == [name], (name, fired)


def test_unknown_is_the_fallback():
    x = _inputs(FP32_CASE)
    ctx = _context(FP32_CASE, *_garbage_rotary(FP32_CASE, x, range(4), range(2)), x=x)
    assert [rule.__name__ for rule in RULES if rule(ctx) is not None] == []
    assert diagnosis.unknown(ctx).label == "unknown"


def test_a_location_says_a_pattern_not_thousands_of_ranges():
    # A kernel wrong on three tokens of every four at 16,383 tokens (as one was on the H200): the
    # location says the period, the count and a few runs, in one short line.
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    wide = ranges([t for t in range(16383) if t % 4])
    assert wide == "3 of every 4 from 1: 1-3,5-7,9-11,...,16381-16382 (12287 in 4096 runs)"
    scattered = ranges([2, 22, 26, 40, 77, 99, 150, 151, 300, 967])
    assert scattered.startswith("2,22,26,...,967 (10 in 9 runs)") and len(scattered) < 60
