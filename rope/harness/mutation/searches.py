"""The dedicated searches' machinery: a property that must fail on a mutant is run, and what caught
it is recorded for the mutation runner (``time_to_failure_s``, ``examples_run``, ``detected_by``) as
pytest properties of the test.  The searches themselves are the suite's (properties/mutants/searches.py);
the detectors' marks are rope.harness.guards' (PLAIN, GUARDED)."""

from __future__ import annotations

import time

import pytest

from rope.harness.guards import GUARDED

# A failure message's needles and the detector each names (besides the comparisons themselves).
NEEDLES = (("NaN in output", "nan"), ("guard modified", "guard-write"),
           ("read(s) of guard elements", "traced-read"), ("write(s) of guard elements", "traced-write"),
           ("wild read", "wild-read"), ("wild write", "wild-write"))


def detectors(message: str) -> list[str]:
    """Which detectors a failure message shows: ``plain`` / ``guarded`` (the comparison on plain or on
    guarded inputs failed), then those of :data:`NEEDLES`."""
    found = []
    for section in message.split("\n\n"):
        if "Mismatched elements" in section or "wrong positions" in section:
            found.append("guarded" if section.startswith(GUARDED) else "plain")
    for needle, label in NEEDLES:
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
