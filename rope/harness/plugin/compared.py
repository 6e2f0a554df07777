"""No green for nothing: a run of the suite whose tests compared nothing against the reference
(every case unsupported, every test skipped) ends non-zero, with a line saying why.

The controller tallies, per checked thing (the marker the plugin sets on a suite test that takes an
implementation: rotation, position_step, position_ids), the tests that ran, how they ended and the
comparisons they made (each test report carries its count, rope.harness.plugin.failures).  At the
end of a run that would exit 0, the run has compared nothing when its checked tests made no
comparison at all, or when a checked thing whose implementation the command line names made none
(``--rope-impl mine`` beside a position step that compares: mine was still never checked).  Such a
run exits with pytest's "no tests ran" status, 5.  ``--collect-only`` and replays are left alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rope.harness.suite import COMPARED_PLUGIN_NAME, NOTHING_COMPARED_EXIT

# The checked things that record their comparisons, and the option naming each one's implementations.
OPTION_OF_THING = {"rotation": "--rope-impl", "position_step": "--rope-position-step-impl",
                   "position_ids": "--rope-position-ids-impl", "table": "--rope-table-impl"}
OPTION_OF_THING["fused"] = "--rope-fused-impl"


@dataclass
class Tally:
    """What the tests of one checked thing did in this run."""
    outcomes: Counter = field(default_factory=Counter)      # passed, failed, skipped
    comparisons: int = 0
    skip_reasons: Counter = field(default_factory=Counter)

    @property
    def tests(self) -> int:
        return sum(self.outcomes.values())


def checked_thing(report) -> str | None:
    """The checked thing a test report belongs to (its marker), or None for the other tests."""
    keywords = getattr(report, "keywords", {}) or {}
    if "replay" in keywords:
        return None
    return next((thing for thing in OPTION_OF_THING if thing in keywords), None)


def note(tallies: dict, report, comparisons_property: str) -> None:
    """Count one test report (the controller sees every worker's)."""
    thing = checked_thing(report)
    if thing is None:
        return
    tally = tallies.setdefault(thing, Tally())
    for name, value in getattr(report, "user_properties", ()):
        if name == comparisons_property:
            tally.comparisons += int(value)
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        tally.outcomes["failed" if report.failed else report.outcome] += 1
        if report.skipped and isinstance(report.longrepr, tuple):
            tally.skip_reasons[_one_line(str(report.longrepr[2]))] += 1


def _one_line(text: str, width: int = 100) -> str:
    text = " ".join(text.replace("Skipped: ", "", 1).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def why_nothing_compared(tallies: dict, named: set[str]) -> str | None:
    """Why the run compared nothing, or None when it compared something (or checked nothing the
    rule covers: a run of the project's own tests)."""
    if not tallies:
        return None
    total = sum(t.comparisons for t in tallies.values())
    empty = [thing for thing, t in tallies.items() if t.comparisons == 0 and (thing in named or total == 0)]
    if not empty:
        return None
    return "; ".join(f"{thing.replace('_', ' ')}: {_reason(tallies[thing])}" for thing in empty)


def _reason(tally: Tally) -> str:
    ran = tally.tests
    skipped = tally.outcomes["skipped"]
    if ran == 0:
        return "no test ran"
    if skipped == ran:
        head = f"every test skipped ({ran})"
    else:
        head = (f"{ran - skipped} test{'s' if ran - skipped != 1 else ''} ran without a comparison "
                f"(every case they drew was unsupported or rejected), {skipped} skipped")
    common = tally.skip_reasons.most_common(2)
    if common:
        head += "; most often: " + "; ".join(f"{reason} ({count}x)" for reason, count in common)
    return head


def named_things(config) -> set[str]:
    """The checked things whose implementations the command line names."""
    return {thing for thing, option in OPTION_OF_THING.items() if config.getoption(option)}


def applies(config) -> bool:
    """Whether the rule holds for this run: not a collection, not a replay."""
    return not (config.getoption("collectonly", False) or config.getoption("--rope-repro"))


class Verdict:
    """The plugin object of a harness run's controller: tallies the reports and, at the end, turns
    a run that compared nothing into exit 5 with its reason (``reason``: read by rope-harness check)."""

    def __init__(self, config, comparisons_property: str):
        self.config = config
        self.comparisons_property = comparisons_property
        self.tallies: dict[str, Tally] = {}
        self.reason: str | None = None

    def pytest_runtest_logreport(self, report):
        note(self.tallies, report, self.comparisons_property)

    def pytest_sessionfinish(self, session, exitstatus):
        if int(session.exitstatus) != 0 or not applies(self.config):
            return
        self.reason = why_nothing_compared(self.tallies, named_things(self.config))
        if self.reason is not None:
            session.exitstatus = NOTHING_COMPARED_EXIT

    def pytest_terminal_summary(self, terminalreporter):
        if self.reason is not None:
            terminalreporter.write_line(f"rope-harness: nothing compared, so nothing checked: {self.reason} "
                                        f"(exit {NOTHING_COMPARED_EXIT})", red=True, bold=True)

    def comparisons(self) -> dict[str, int]:
        return {thing: t.comparisons for thing, t in self.tallies.items()}


PLUGIN_NAME = COMPARED_PLUGIN_NAME
