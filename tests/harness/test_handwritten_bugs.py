"""The hand-written bugs of tests/harness/handwritten_bugs.py: each a different slip, each named
by the diagnosis with its own label on a fixed case, and the measurement of
tests/harness/diagnosis_accuracy.py (docs/mutation.md's accuracy table) on a few drawn cases."""

from __future__ import annotations

import pytest

from rope.harness.rotation.check import diagnose_run, evaluate_case
from rope.harness.rotation.diagnosis import LABELS
from tests.harness import diagnosis_accuracy
from tests.harness.handwritten_bugs import BUGS, CORRECT

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu


def test_at_least_ten_bugs_each_a_different_slip():
    assert len(BUGS) >= 10
    assert len({bug.slip for bug in BUGS.values()}) == len(BUGS)
    assert {bug.label for bug in BUGS.values()} <= set(LABELS)


@pytest.mark.parametrize("name", list(BUGS))
def test_the_kernel_without_its_slip_matches_the_reference(name):
    run = evaluate_case("correct", CORRECT, BUGS[name].case, "cpu")
    assert run.comparison.ok, run.comparison


@pytest.mark.parametrize("name", list(BUGS))
def test_handwritten_bug_gets_its_label(name):
    bug = BUGS[name]
    run = evaluate_case(name, bug.fn, bug.case, "cpu")
    assert not run.comparison.ok, f"{name} does not fail on its case: pick another"
    d = diagnose_run(bug.fn, bug.case, run)
    assert d.label == bug.label, d.lines()


def test_the_user_bucketize_slip_says_where_the_boundaries_are():
    bug = BUGS["bucketize_default_right"]
    run = evaluate_case("bucketize_default_right", bug.fn, bug.case, "cpu")
    d = diagnose_run(bug.fn, bug.case, run)
    assert "every section boundary moved by +1 frequency" in d.sentence, d.lines()
    assert "(on section boundaries: 16 opens row 1, 40 opens row 2)" in d.location["query"]["freqs"], d.lines()


def test_accuracy_measures_the_share_of_failures_with_the_right_label():
    subject = diagnosis_accuracy.subjects(["handwritten:sin_sign_flipped"])[0]
    tally = diagnosis_accuracy.measure(subject, failures=4, rounds=1)
    assert tally.failures == 4 and tally.share == 1.0, tally.labels
    table = diagnosis_accuracy.table([tally])
    assert "| `handwritten:sin_sign_flipped` |" in table and "| 4 | 4 | 100% |" in table


def test_every_mutant_with_a_rotation_output_has_an_accuracy_label():
    from rope.harness.mutation import discover_mutants
    mutants = discover_mutants()
    # A mutant wrong only in a mode (or only in its backward) has the mode's (the backward's) cause
    # label, not an eager diagnosis to measure.
    from properties.mutants.broken_backwards import BACKWARD_ONLY
    from properties.mutants.broken_rotations import MODE_ONLY
    modes = {f"broken_rotations:{name}" for name in MODE_ONLY} | {f"broken_backwards:{name}" for name in BACKWARD_ONLY}
    rotation = {m.name for m in mutants if m.kind.startswith("rotation") and not m.needs} - modes
    assert rotation <= set(diagnosis_accuracy.MUTANT_LABELS) <= {m.name for m in mutants}
    assert {m.kind for m in mutants if m.name not in diagnosis_accuracy.MUTANT_LABELS and not m.needs
            and m.name not in modes} <= \
        set(diagnosis_accuracy.NOT_LABELLED)


def test_a_failure_with_right_values_is_right_when_named_by_what_the_guards_saw():
    # positions_rows_packed: where its packed reads happen to give the right values, only the
    # tracer sees them, and out_of_bounds_read is the right name for that failure, not the label of
    # the bug's wrong values; any other label is still wrong.
    subject = diagnosis_accuracy.Subject("s", None, "wrong_positions", "guarded")
    tally = diagnosis_accuracy.Tally(subject)
    tally.labels.update({"wrong_positions": 15, "out_of_bounds_read" + diagnosis_accuracy.VALUES_RIGHT: 4,
                         "out_of_bounds_read": 2, "unknown": 1})
    assert (tally.right, tally.failures) == (19, 22)
