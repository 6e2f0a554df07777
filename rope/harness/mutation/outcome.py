"""What one pytest run did, read from its records (rope.harness.mutation.records): the tests it
collected and ran, which failed or errored, the test that was running when it died, pytest's own
duration, and a failure's text split into its assertion and Hypothesis' failing example."""

from __future__ import annotations

from dataclasses import dataclass, field

# Hypothesis' notes: the one that opens its failing example, and those that follow the example.
HYPOTHESIS_HEADS = ("Failing test case", "Falsifying example", "Failing explicit example",
                    "Falsifying explicit example")
HYPOTHESIS_TAILS = ("Explanation:", "You can reproduce", "Unreliable test", "Highest target score")
# The order of pytest's own summary line.
_COUNT_ORDER = ("failed", "passed", "skipped", "xfailed", "xpassed", "errors")


@dataclass
class PytestRun:
    """A pytest run, from its records."""
    started: bool = False                   # the session began (its plugin wrote a session record)
    finished: bool = False                  # the session ended (not killed, not crashed)
    exitstatus: int | None = None
    pytest_s: float | None = None           # pytest's session duration
    collected: list = field(default_factory=list)   # node ids, in run order
    ran: list = field(default_factory=list)         # node ids that reported a result
    passed: list = field(default_factory=list)      # node ids whose call passed
    failed: list = field(default_factory=list)      # node ids whose call failed, in order
    errors: list = field(default_factory=list)      # setup / teardown / collection errors
    counts: dict = field(default_factory=dict)
    running: str | None = None              # the test started and never finished (a crash, a kill)
    reports: dict = field(default_factory=dict)     # (nodeid, when) -> report record

    @classmethod
    def from_records(cls, records: list[dict]) -> "PytestRun":
        run = cls()
        open_tests: list[str] = []
        ran: dict = {}
        for r in records:
            event = r.get("event")
            if event == "session":
                run.started = True
            elif event == "finish":
                run.finished, run.exitstatus, run.pytest_s = True, r.get("exitstatus"), r.get("duration")
            elif event == "collected":
                run.collected = list(r.get("nodeids", []))
            elif event == "collect":
                run.errors.append(r.get("nodeid", ""))
                run._count("errors")
            elif event == "start":
                open_tests.append(r["nodeid"])
            elif event == "report":
                run._report(r, ran)
                if r.get("when") == "teardown" and r["nodeid"] in open_tests:
                    open_tests.remove(r["nodeid"])
        run.ran = list(ran)
        run.running = open_tests[-1] if open_tests else None
        return run

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def _report(self, r: dict, ran: dict) -> None:
        node, when, outcome, xfail = r["nodeid"], r.get("when"), r.get("outcome"), r.get("wasxfail", False)
        self.reports[node, when] = r
        if when == "call":
            ran[node] = None
            if outcome == "passed":
                self._count("xpassed" if xfail else "passed")
                self.passed.append(node)
            elif outcome == "failed":
                self._count("failed")
                self.failed.append(node)
            else:
                self._count("xfailed" if xfail else "skipped")
        elif outcome != "passed":
            ran[node] = None
            if outcome == "failed":
                self._count("errors")
                self.errors.append(node)
            elif when == "setup":
                self._count("xfailed" if xfail else "skipped")

    @property
    def summary(self) -> str:
        """pytest's summary line without the time: ``1 failed, 20 passed``."""
        parts = []
        for key in _COUNT_ORDER:
            n = self.counts.get(key, 0)
            if n:
                parts.append(f"{n} {'error' if key == 'errors' and n == 1 else key}")
        return ", ".join(parts) or ("no tests ran" if self.finished else "")

    def failure(self, node: str) -> dict | None:
        """The failed report of a test (its call, else its setup or teardown)."""
        for when in ("call", "setup", "teardown"):
            r = self.reports.get((node, when))
            if r is not None and r.get("outcome") == "failed":
                return r
        return None

    def failure_text(self, node: str) -> tuple[list[str], list[str]]:
        """(assertion lines, Hypothesis' failing example) of a test's failure."""
        r = self.failure(node)
        if r is None:
            return [], []
        return split_failure(r.get("exception") or _from_crash(r.get("crash") or r.get("longrepr") or ""))

    def caught_text(self, node: str) -> tuple[list[str], list[str]]:
        """(assertion lines, failing example) of what the test's ``pytest.raises`` caught first."""
        r = self.reports.get((node, "call"))
        caught = (r or {}).get("caught") or []
        return split_failure(caught[0]) if caught else ([], [])

    def first_message(self) -> str:
        """The first line of the first failure or error's message (for notes)."""
        for node in self.failed + self.errors:
            assertion, _ = self.failure_text(node)
            if assertion:
                return assertion[0]
        return ""


def _from_crash(text: str) -> dict:
    """An exception record from pytest's crash message (when the exception itself is unknown)."""
    return {"type": "", "message": text, "notes": []}


def split_failure(exc: dict) -> tuple[list[str], list[str]]:
    """(assertion lines, Hypothesis' failing example) of an exception record.  The assertion is
    ``Type: message`` and the notes before Hypothesis' example; pytest's assert rewriting
    ("assert False", "+  where ...") is dropped.  The example runs from Hypothesis' "Failing test
    case" (or "Falsifying example") note up to its explanation or reproduction hint."""
    message = exc.get("message") or ""
    lines = message.splitlines()
    kind = exc.get("type") or ""
    if kind and not (kind == "AssertionError" and lines and lines[0].startswith("assert ")):
        lines = [f"{kind}: {lines[0]}" if lines else kind, *lines[1:]]
    notes = [str(n) for n in exc.get("notes") or []]
    head = next((i for i, note in enumerate(notes) if note.strip().startswith(HYPOTHESIS_HEADS)), None)
    for note in notes if head is None else notes[:head]:
        lines += note.splitlines()
    assertion = [line for line in lines if line.strip() and not line.strip().startswith(("+", "assert "))]
    falsifying: list[str] = []
    if head is not None:
        for line in "\n".join(notes[head:]).splitlines():
            if line.strip().startswith(HYPOTHESIS_TAILS):
                break
            falsifying.append(line)
        while falsifying and not falsifying[-1].strip():
            falsifying.pop()
    return assertion, falsifying


_FIXTURE_ARGS = ("impl_name=", "positions_impl_name=", "device=", "data=data(")


def _says_more(line: str) -> bool:
    """A line of Hypothesis' example that is more than the test's name, brackets or fixtures."""
    return bool(line) and not line.endswith("(") and line != ")" and not line.startswith(_FIXTURE_ARGS)


def excerpt(assertion: list[str], falsifying: list[str], width: int = 160) -> str:
    """One or two lines for the table, each cut to ``width``: the assertion's first line, then the
    case (or the first line of Hypothesis' example that says more than the test's name)."""
    if not assertion and not falsifying:
        return ""
    first = assertion[0].strip() if assertion else ""
    first = first[len("AssertionError: "):] if first.startswith("AssertionError: ") else first
    detail = next((line.strip() for line in assertion[1:] if line.strip().startswith(("case:", "batch:"))), None)
    if detail is None and falsifying and "<state machine>" in falsifying[0]:
        # A state machine's last step with arguments: the one that failed (invariants take none).
        detail = next((line.strip() for line in reversed(falsifying)
                       if line.startswith("state.") and not line.rstrip().endswith("()")), None)
    if detail is None:
        detail = next((line.strip() for line in falsifying[1:] if _says_more(line.strip())), None)
    lines = [line if len(line) <= width else line[: width - 3] + "..." for line in (first, detail) if line]
    return "\n".join(lines)
