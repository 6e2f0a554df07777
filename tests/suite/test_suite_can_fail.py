"""The rotation property rejects every broken implementation in properties/mutants, with a
shrunk counterexample: a harness that cannot fail catches nothing."""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings, strategies as st

from rope.harness.rotation.check import assert_matches_reference
from properties.mutants.broken_rotations import BROKEN_ROTATIONS, MODE_ONLY, SCALED_TABLE_MUTANTS, VIEW_MUTANTS
from properties.rotation.views import view_cases
from properties.rotation.scaled_cases import scaled_rotation_cases
from properties.strategies import DTYPES, KINDS, RotationCase, rotation_cases
from rope.native import rotate_native
from rope.spec import RopeSpec

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu


# The bug each broken implementation has, as the diagnosis must name it in the shrunk failure.
EXPECTED_DIAGNOSIS = {
    "neox_for_gptj": "pairing_swapped",
    "chunked_for_interleaved": "axis_map_wrong",
    "key_unrotated": "key_only",
    "touches_pass_through": "pass_through_touched",
    "first_pow2_heads": "head_subset",
    "assumes_contiguous": "row_stride_ignored",
    "bf16_claiming_fp32": "precision_loss",
    "hides_nonfinite": "nan",
    "chunked_for_two_row": "axis_map_wrong",
    "glm_round_robin_without_skip": "axis_map_wrong",
    "ernie45_h_w_swapped": "position_rows_swapped",
    "row_map_shifted_by_one": "axis_map_wrong",
}
# The kinds a mutant's bug lives in, where it is not every kind: the maps' mutants break one layout
# of kind "mapped" (a sixth of the kinds; a quarter of its draws).
MUTANT_KINDS = {name: ["mapped"] for name in ("chunked_for_two_row", "glm_round_robin_without_skip",
                                              "ernie45_h_w_swapped", "row_map_shifted_by_one")}


@pytest.mark.parametrize("broken", [b for b in BROKEN_ROTATIONS
                                    if b not in MODE_ONLY and b not in VIEW_MUTANTS and b not in SCALED_TABLE_MUTANTS])
def test_rotation_property_rejects_broken_implementation(broken, monkeypatch, tmp_path):
    fn = BROKEN_ROTATIONS[broken]
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))   # deliberate failures: keep reports/cases clean

    # The same property test_rotation_matches_reference runs, over all variants at once.
    @settings(max_examples=300, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(case=st.tuples(st.sampled_from(list(DTYPES)), st.sampled_from(MUTANT_KINDS.get(broken, KINDS))).flatmap(
        lambda dk: rotation_cases(dtype=dk[0], kind=dk[1], nonfinite=True)))
    def rotation_matches_reference(case):
        assert_matches_reference(broken, fn, case, "cpu")

    with pytest.raises(AssertionError, match="does not match the reference") as failure:
        rotation_matches_reference()
    # Rejected for its own bug: the shrunk counterexample is diagnosed as that bug.
    assert f"diagnosis: {EXPECTED_DIAGNOSIS[broken]}" in str(failure.value), str(failure.value)[:2000]


# ------------------------------------------------------------------ scaled tables
SCALED_TABLE_DIAGNOSIS = {"fp32_table_rounded_to_activations": "table_misread", "table_clamped_to_unit": "table_misread",
                          "fast_math_angles": "angle_error"}


@pytest.mark.parametrize("broken", list(SCALED_TABLE_MUTANTS))
def test_scaled_table_property_rejects_broken_implementation(broken, monkeypatch, tmp_path):
    # The draws of test_scaled_tables_match_reference (every rope type at its admitted length, q and k
    # beside an fp32 table or in the table's dtype), without its model examples.
    fn = BROKEN_ROTATIONS[broken]
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))

    @settings(max_examples=100, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(case=scaled_rotation_cases())
    def scaled_tables_match_reference(case):
        assert_matches_reference(broken, fn, case, "cpu")

    with pytest.raises(AssertionError, match="does not match the reference") as failure:
        scaled_tables_match_reference()
    assert f"diagnosis: {SCALED_TABLE_DIAGNOSIS[broken]}" in str(failure.value), str(failure.value)[:2000]


# ------------------------------------------------------------------ views
def _copies_back_contiguous(spec, positions, query, key, cache):
    """Rotates out of place and returns the right outputs, then copies them back into the input's
    buffer as if it were contiguous (a copy-back that ignores the destination's strides: ggml's
    transposed copy path, llama.cpp#27663): an engine reading the buffer reads garbage."""
    q, k = rotate_native(spec, positions, query, key, cache)
    for x, out in ((query, q), (key, k)):
        if x is not None and x.numel():
            x.as_strided((x.numel(),), (1,), x.storage_offset()).copy_(out.reshape(-1))
    return q, k


_copies_back_contiguous.working_precision = "activation"
# The view mutants (test_views.py's property catches them), and a copy-back only the buffer shows.
VIEW_BUGS = {"heads_at_contiguous_stride": (BROKEN_ROTATIONS["heads_at_contiguous_stride"], "view_misread"),
             "rows_as_wide_as_stride": (BROKEN_ROTATIONS["rows_as_wide_as_stride"], "wrote_outside_view"),
             "copies_back_contiguous": (_copies_back_contiguous, "wrote_outside_view")}


@pytest.mark.parametrize("broken", list(VIEW_BUGS))
def test_view_property_rejects_broken_views(broken, monkeypatch, tmp_path):
    # The draws of test_views_match_reference alone catch each, with its diagnosis.
    fn, label = VIEW_BUGS[broken]
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))

    @settings(max_examples=50, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(case=view_cases(dtype="float32", kind="chunked3"))
    def views_match_reference(case):
        assert_matches_reference(broken, fn, case, "cpu")

    with pytest.raises(AssertionError, match="does not match the reference") as failure:
        views_match_reference()
    assert f"diagnosis: {label}" in str(failure.value), str(failure.value)[:2000]


def test_a_copy_back_into_a_heads_major_view_is_seen_in_the_buffer(monkeypatch, tmp_path):
    # Its outputs are right and nothing outside the views changes: only the buffer shows it.
    monkeypatch.setenv("ROPE_CASES_DIR", "off")
    case = RotationCase(RopeSpec(32, 32, True, (4, 6, 6), max_position=64), 4, 2, 1, "float32", view="heads-major")
    with pytest.raises(AssertionError, match="diagnosis: wrote_outside_view") as failure:
        assert_matches_reference("copies_back_contiguous", _copies_back_contiguous, case, "cpu")
    said = " ".join(str(failure.value).split())
    assert "query's heads-major view holds neither its input nor the output returned for it" in said, said


# ------------------------------------------------------------------ the position step
from properties.mutants.broken_positions import BROKEN_POSITIONS, correct_loop  # noqa: E402
from properties.strategies import ragged_batches  # noqa: E402
from rope.harness.position_step.check import assert_positions_match  # noqa: E402

# delta_per_chunk corrupts the stored delta for later steps; one step cannot see it (the
# scheduler state machine in test_scheduler_positions.py does).
SINGLE_STEP_VISIBLE = [b for b in BROKEN_POSITIONS if b != "delta_per_chunk"]


@pytest.mark.parametrize("broken", SINGLE_STEP_VISIBLE)
def test_position_property_rejects_broken_implementation(broken):
    fn = BROKEN_POSITIONS[broken]

    @settings(max_examples=300, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(batch=ragged_batches())
    def prepared_positions_match_reference(batch):
        assert_positions_match(broken, fn, batch, "cpu")

    with pytest.raises(AssertionError, match=f"{broken} on cpu"):
        prepared_positions_match_reference()


@settings(max_examples=50, deadline=None)
@given(batch=ragged_batches())
def test_mutant_loop_without_bug_is_correct(batch):
    assert_positions_match("correct_loop", correct_loop, batch, "cpu")


# The scheduler's prompts are short: a delta past 16 bits is the single-step property's to find
# (positions to 2^20, deltas to +-2^20).
@pytest.mark.parametrize("broken", [b for b in BROKEN_POSITIONS if b != "delta_in_16_bits"])
def test_scheduler_machine_rejects_broken_positions(broken):
    from hypothesis.stateful import run_state_machine_as_test

    from properties.position_step.scheduler import make_machine
    machine = make_machine(f"properties.mutants.broken_positions:{broken}", "cpu", "qwen2_5_vl")
    with pytest.raises(AssertionError):
        # Found is enough: shrinking a 25-step run (most of this test's time) proves nothing more.
        run_state_machine_as_test(machine, settings=settings(max_examples=200, stateful_step_count=25,
                                                             derandomize=True, database=None, deadline=None,
                                                             print_blob=False,
                                                             phases=[Phase.explicit, Phase.generate]))


@pytest.mark.parametrize("broken", ["request_state_cached_per_buffer"])
def test_step_sequence_property_rejects_state_kept_per_buffer(broken):
    # Right on every fresh call, stale on buffers a runner refills: the drawn request-state sequences
    # (no explicit example) find it, under the eager mode's own label.
    from properties.mutants.broken_positions import STEP_MODE_MUTANTS
    from properties.position_step.step_sequences import request_state_sequences
    from rope.harness.position_step.modes import assert_steps_match
    fn = STEP_MODE_MUTANTS[broken]
    assert set(STEP_MODE_MUTANTS) == {broken}

    @settings(max_examples=100, derandomize=True, database=None, deadline=None, print_blob=False,
              phases=[Phase.generate])
    @given(steps=request_state_sequences())
    def steps_match_reference(steps):
        assert_steps_match(broken, fn, steps, "cpu", mode="eager")

    from rope.harness.causes import failure_of
    with pytest.raises(AssertionError, match="on the same buffers does not match the reference") as failed:
        steps_match_reference()
    assert failure_of(failed.value)["cause"] == "reused_buffers_stale"


def test_rotation_check_rejects_an_implementation_that_writes_the_cache(monkeypatch, tmp_path):
    from properties.known_cases import KNOWN_BUG_CASES
    from rope.native import rotate_native
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))

    def scribbles_on_cache(spec, positions, query, key, cache):
        out = rotate_native(spec, positions, query, key, cache)
        cache[-1].zero_()           # e.g. a kernel that "refreshes" rows in place
        return out
    scribbles_on_cache.working_precision = "activation"
    with pytest.raises(AssertionError, match="cos_sin_cache was modified"):
        assert_matches_reference("scribbles", scribbles_on_cache, KNOWN_BUG_CASES["single-token-no-key"], "cpu")


def test_a_cache_written_once_is_never_lent_again(monkeypatch, tmp_path):
    # The cache an implementation receives is a copy lent for the case and returned for the next
    # case of the same table only if it is unchanged after the call (rope.harness.rotation.cases,
    # return_lent_cache).  A writer is caught on the call that writes, and the next implementation
    # then gets an untouched table: were the written copy lent again, the correct implementation
    # below would rotate with a zeroed row and fail.  A copy returned unchanged is lent again.
    from properties.known_cases import KNOWN_BUG_CASES
    from rope.harness.rotation.check import evaluate_case
    from rope.native import rotate_native
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    case = KNOWN_BUG_CASES["single-token-no-key"]
    seen = []

    def remembers(spec, positions, query, key, cache):
        seen.append(cache)
        return rotate_native(spec, positions, query, key, cache)

    def zeroes_its_rows(spec, positions, query, key, cache):
        out = rotate_native(spec, positions, query, key, cache)
        cache[positions.long().flatten()] = 0
        return out
    for fn in (remembers, zeroes_its_rows):
        fn.working_precision = "activation"
    assert evaluate_case("remembers", remembers, case, "cpu").comparison.ok
    assert evaluate_case("remembers", remembers, case, "cpu").comparison.ok
    assert seen[0] is seen[1]                         # returned unchanged, lent again
    bad = evaluate_case("zeroes", zeroes_its_rows, case, "cpu").comparison
    assert "cos_sin_cache was modified by the implementation" in bad.problems
    assert evaluate_case("remembers", remembers, case, "cpu").comparison.ok
    assert seen[2] is not seen[1]                     # the written copy was dropped


def test_the_empty_batch_case_rejects_an_implementation_that_raises_on_0_tokens(monkeypatch, tmp_path):
    # The known case empty-batch-glm41v against the peers' defect: q viewed as (num_tokens, -1,
    # head_size) before the kernel, which cannot infer -1 from 0 elements.  The suite's check on it
    # fails; on the single-token case the same code is right.
    from properties.known_cases import KNOWN_BUG_CASES
    from rope.harness import report
    from rope.native import rotate_native
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    monkeypatch.setenv(report.DISABLE_ENV, "1")

    def views_before_the_kernel(spec, positions, query, key, cache):
        query.view(query.shape[0], -1, spec.head_size)
        return rotate_native(spec, positions, query, key, cache)
    views_before_the_kernel.working_precision = "activation"
    assert_matches_reference("views", views_before_the_kernel, KNOWN_BUG_CASES["single-token-no-key"], "cpu")
    with pytest.raises(AssertionError, match="raised RuntimeError"):
        assert_matches_reference("views", views_before_the_kernel, KNOWN_BUG_CASES["empty-batch-glm41v"], "cpu")


def test_spec_without_section_sum_rule_is_caught(monkeypatch):
    # docs/spec.md §7.8 as a mutant of our spec: the section-sum rule dropped (vLLM's XDRotaryEmbedding
    # never checked it; a wrong sum gave a shape error or a silent mismatch).  The bad-spec
    # table must then fail on its XD-RoPE row.
    from tests.contract.bad_specs import BAD_SPECS, assert_bad_spec_raises
    from rope.spec import RopeSpec
    original = RopeSpec._validate

    def without_sum_rule(self):
        try:
            original(self)
        except ValueError as exc:
            if "must sum to rotary_dim/2" not in str(exc):
                raise
    monkeypatch.setattr(RopeSpec, "_validate", without_sum_rule)
    kwargs, pattern = next(row for row in BAD_SPECS if row[0].get("sections") == (16, 16, 16, 15))
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        assert_bad_spec_raises(kwargs, pattern)


# ------------------------------------------------------------------ the modes
def test_the_mode_properties_reject_the_mode_only_mutants(monkeypatch, tmp_path):
    # Right on every single eager call, wrong in a mode: the compile property rejects the rotation
    # skipped under torch.compile, calling twice rejects the one wrong on every other large call.
    from properties.mutants.broken_rotations import skipped_under_compile, wrong_in_half_of_large_calls
    from rope.harness.rotation.check import checked_run, run_rotation
    from rope.harness.rotation.modes import bit_differences, compiled_implementation
    from rope.implementation import Implementation
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    case = RotationCase(RopeSpec(head_size=64, rotary_dim=64, is_neox_style=True, max_position=64), 9, 2, 1,
                        "float32", "uniform", False, 3)
    assert checked_run("skipped", skipped_under_compile, case, "cpu").comparison.ok
    compiled = compiled_implementation(Implementation.of("skipped", skipped_under_compile), "cpu")
    with pytest.raises(AssertionError, match="does not match the reference"):
        checked_run("skipped", compiled, case, "cpu")
    _, q1, k1 = run_rotation(wrong_in_half_of_large_calls, case, "cpu")
    _, q2, k2 = run_rotation(wrong_in_half_of_large_calls, case, "cpu")
    assert bit_differences(q1, q2, "query") and not bit_differences(k1, k2, "key")

