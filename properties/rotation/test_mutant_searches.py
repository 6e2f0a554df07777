"""The guarded searches that ``rope-harness mutants`` runs as the dedicated stage of a kernel mutant
(rope/harness/mutation/stages.py): each known Triton-kernel bug, as a mutant of our own kernels
(properties/mutants/kernel.py), is searched for in the variant cell of test_rotation.py's
parametrization where its bug lives (or on the position step's batches), derandomized and without
shrinking, with the rotation property's check plus the guard checker (properties/guards.py).  The
time to the first failing example is recorded as ``time_to_failure_s``, the detectors that fired as
``detected_by``.  The project's other tests of the mutants are tests/suite/test_kernel_mutants.py.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import Phase, given, settings

from rope.devices import is_interpreter
from properties.guards import (
    assert_matches_reference_guarded,
    assert_matches_reference_traced,
    assert_positions_match_guarded,
    trace_memory,
)
from properties.mutants.kernel import POSITIONS_MUTANTS, ROTARY_MUTANTS
from properties.strategies import RotationCase, ragged_batches, rotation_cases
from properties.position_step.test_runner_positions import assert_positions_match

pytestmark = [
    pytest.mark.self_test,          # runs deliberately broken implementations: kept out of the run report
    pytest.mark.harness_stage,      # rope-harness mutants names these by node id; not a plain run's
    pytest.mark.interpreter,
    pytest.mark.skipif(not is_interpreter(), reason="needs Triton's interpreter (TRITON_INTERPRET=1): the "
                                                    "tracer and the mutants' stray accesses are CPU-only"),
]

# Small shapes: the interpreter costs ~0.4 ms per program instance.
HEAD_SIZES = (64, 80, 96, 128, 32, 16)
MAX_POSITIONS = (64, 1, 7, 300)
MAX_TOKENS = 6

SEARCH = settings(max_examples=60, derandomize=True, database=None, deadline=None, print_blob=False,
                  phases=(Phase.explicit, Phase.generate))

# Mutant -> (dtype, kind, is_neox_style): the test_rotation.py cell that holds its bug; the
# known-bug trigger cases that apply; detectors of which one must fire; detectors that must not.
#   plain:        test_rotation.py's comparison on plain tensors (wild-read/-write: the tracer saw
#                 an access past an argument's storage, suppressed it and reported it)
#   guarded:      the comparison on guarded inputs;   nan: NaN in the output under guards
#   traced-read:  the tracer saw a read of a guard element (the value need not reach the output)
# A value bug may first show on a case where the plain run is blind (one token, position 0, a
# one-row cache): those accept either comparison.
VALUE_BUG = ("plain", "guarded")
ROTARY_CELLS = {
    "neox_for_gptj": (("bfloat16", "chunked3", False), ["gptj-paired-neox-glm41v"], VALUE_BUG, ()),
    # No known case applies: every known spec has a power-of-two rotary_dim/2, so our kernel has no
    # padding lanes there.  The values never reach the output: only the tracer sees the reads.
    "cos_sin_unmasked": (("bfloat16", "interleaved", True), [], ("traced-read",), ("plain", "guarded", "nan")),
    "cos_sin_unmasked_head_padded": (("bfloat16", "interleaved", True), ["interleaved-padding-lanes-qwen35"],
                                     ("traced-read",), ("plain", "guarded", "nan")),
    "partial_rotary_head_half": (("float32", "chunked3", True), ["partial-rotary-strides-glm41v"], VALUE_BUG, ()),
    "interleaved_h_bound_off_by_one": (("float32", "interleaved", True), ["interleaved-map-qwen3vl"], VALUE_BUG,
                                       ()),
    "interleaved_thw_order_swapped": (("float32", "interleaved", True), ["interleaved-map-short-sections"],
                                      VALUE_BUG, ()),
    "row_map_table_shifted": (("float32", "mapped", True), ["two-row-map-hunyuan-image"], VALUE_BUG, ()),
    # Identical to the right kernel on contiguous positions: only the row-strided guarded positions see it
    # (the sentinel it reads as a position is clamped to a cache row: a wrong value, and a traced read).
    "positions_rows_packed": (("float16", "chunked3", True), ["row-strides-many-tokens"], ("guarded", "traced-read"),
                              ("plain",)),
    # With one token, positions[0, 0 + d] IS positions[d, 0] in a packed [3, 1] tensor.
    "positions_rows_at_token_offsets": (("float16", "chunked3", True), ["row-strides-many-tokens"], VALUE_BUG, ()),
}
KNOWN_PAIRS = [(m, k) for m, (_, known, _, _) in ROTARY_CELLS.items() for k in known]

_PLAIN, _GUARDED = "[plain inputs]", "[guarded inputs]"


def check_rotation(name: str, fn, case: RotationCase) -> None:
    """test_rotation.py's check (assert_matches_reference, inside the tracer so that a broken kernel
    stays memory-safe and wild accesses are reported), then the guard checker; both always run."""
    failures = []
    for tag, check in ((_PLAIN, assert_matches_reference_traced), (_GUARDED, assert_matches_reference_guarded)):
        try:
            check(name, fn, case, "cpu")
        except AssertionError as exc:
            failures.append(f"{tag} {exc}")
    if failures:
        raise AssertionError("\n\n".join(failures))


def detectors(message: str) -> list[str]:
    """Which detectors a failure message shows (see ROTARY_CELLS)."""
    found = []
    for section in message.split("\n\n"):
        if "Mismatched elements" in section or "wrong positions" in section:
            found.append("guarded" if section.startswith(_GUARDED) else "plain")
    for needle, label in (("NaN in output", "nan"), ("guard modified", "guard-write"),
                          ("read(s) of guard elements", "traced-read"), ("write(s) of guard elements", "traced-write"),
                          ("wild read", "wild-read"), ("wild write", "wild-write")):
        if needle in message:
            found.append(label)
    return sorted(set(found), key=found.index)


def expect_failure(prop, record_property, calls=None) -> list[str]:
    """Run a property that must fail; record the time to the failure, the examples it took
    (including Hypothesis's final replay of the failing one) and the detectors that fired."""
    start = time.perf_counter()
    with pytest.raises(AssertionError) as info:
        prop()
    elapsed = time.perf_counter() - start
    found = detectors(str(info.value))
    record_property("time_to_failure_s", round(elapsed, 3))
    record_property("detected_by", ",".join(found))
    if calls is not None:
        record_property("examples_run", calls[0])
    print(f"caught in {elapsed:.2f} s{f' ({calls[0]} examples)' if calls else ''} by {found}")
    return found


# --------------------------------------------------------------------------- rotation mutants
@pytest.mark.parametrize("name", list(ROTARY_CELLS))
def test_rotation_property_catches_kernel_mutant(name, record_property):
    mutant = ROTARY_MUTANTS[name]
    (dtype, kind, neox), _, must, must_not = ROTARY_CELLS[name]

    @SEARCH
    @given(case=rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, max_tokens=MAX_TOKENS,
                               head_sizes=HEAD_SIZES, max_positions=MAX_POSITIONS))
    def rotation_matches_reference_under_guards(case):
        calls[0] += 1
        check_rotation(name, mutant, case)

    calls = [0]
    found = expect_failure(rotation_matches_reference_under_guards, record_property, calls)
    assert set(must) & set(found), f"{name}: expected one of {must}, got {found}"
    assert not set(must_not) & set(found), f"{name}: {sorted(set(must_not) & set(found))} must not fire ({found})"


# --------------------------------------------------------------------------- positions mutant
def _positions_checks(name, fn, batch):
    failures = []
    with trace_memory() as tracer:        # plain out: a spill past `out` is a wild write (suppressed)
        try:
            assert_positions_match(name, fn, batch, "cpu")
        except AssertionError as exc:
            failures.append(f"{_PLAIN} {exc}")
    failures += [f"{_PLAIN} memory violation: {m}" for m in tracer.messages()]
    try:
        assert_positions_match_guarded(name, fn, batch, "cpu")
    except AssertionError as exc:
        failures.append(f"{_GUARDED} {exc}")
    if failures:
        raise AssertionError("\n\n".join(failures))


@pytest.mark.parametrize("name", list(POSITIONS_MUTANTS))
def test_position_property_catches_kernel_mutant(name, record_property):
    mutant = POSITIONS_MUTANTS[name]

    @SEARCH
    @given(batch=ragged_batches())
    def prepared_positions_match_reference_under_guards(batch):
        calls[0] += 1
        _positions_checks(name, mutant, batch)

    calls = [0]
    found = expect_failure(prepared_positions_match_reference_under_guards, record_property, calls)
    assert "guard-write" in found or "traced-write" in found, found
