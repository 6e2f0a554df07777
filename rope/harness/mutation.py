"""``rope-harness mutants``: run the property suite against every mutant in properties/mutants and
report, for each, whether it was caught, how long the suite took to its first failure and the
shrunk counterexample; next to it, the same for the serving-engine-style baseline suite.

Entry points (rope/cli.py wires the sub-command with either):

* ``add_mutants_parser(sub)``: register ``mutants`` on the CLI's sub-parsers (``args.func`` is
  :func:`cmd_mutants`, which returns the exit status), as ``rope.harness.repro.add_repro_parser`` does.
* ``main(argv) -> int``: parse the options below and run; ``python -m rope.harness.mutation`` calls it.
* ``run(...) -> MutationReport``: the programmatic API (no printing, no files).

    rope-harness mutants [--profile ci|dev] [--only NAME ...] [--no-baseline] [--jobs N] [--out DIR]
                         [--budget S] [--limit S] [--no-confirm] [--logs] [--list]

Writes OUT/mutants.json and OUT/mutants.md (OUT defaults to reports/), atomically, and prints a
table: mutant, kind, caught by the harness? seconds, caught by the baseline? seconds, the shrunk
counterexample.

Exit status: 0 when the harness catches every mutant; 1 when any survives it (or its run ends in
a timeout, a crash or a pytest error); 2 on bad options.  A catch slower than ``--limit``
(60 s of suite time) is flagged in the table and the reports but does not change the status.

How each kind of mutant is run (one pytest subprocess per suite run, ``-x``, ``-v``,
``--hypothesis-profile``; ``ROPE_CASES_DIR=off`` and ``ROPE_NO_REPORT=1``, so deliberate failures
write no case files and no run report):

=================  ============================================================================
rotation           BROKEN_ROTATIONS (wrappers of rope.native): properties/test_rotation.py with
                   ``--rope-impl properties.mutants.broken_rotations:NAME``; caught = a test fails
rotation-kernel    ROTARY_MUTANTS (source-patched Triton kernels): the same with
                   ``--rope-impl properties.mutants.kernel:NAME``.  The memory-safety bugs
                   (:data:`MEMORY_SAFETY`: only the guards/tracer of properties/guards.py see
                   them) run test_known_bug_triggers_under_guards first, then the rest of
                   test_rotation.py, then, should that not catch them, test_mutants.py's guarded
                   search for the mutant (a dedicated test: caught = it passes)
positions          BROKEN_POSITIONS: test_runner_positions.py and test_scheduler_positions.py with
                   ``--rope-positions-impl``; caught = a test fails
positions-kernel   POSITIONS_MUTANTS: the same; then test_mutants.py's guarded search (the plain
                   suites run an unmasked store unguarded: the process may crash, which is
                   recorded but is no catch)
dispatch           BROKEN_OPS are op classes, not registry implementations: they run through
                   their dedicated tests in properties/test_dispatch.py
                   (``test_dispatch_property_rejects_broken_op[NAME]``; caught = it passes)
=================  ============================================================================

The baseline (properties/baseline, ``--rope-baseline``) runs against every rotation mutant.

A failure counts as a catch only if it is the mutant's doing: the failing test's id must name the
mutant, and (unless ``--no-confirm``) the same test must pass on the mutant's unmutated parent
(rope.native, the Triton kernel, or broken_positions.correct_loop).  A failure the parent shares is
a *false alarm*: it is recorded and the suite continues with the tests after it.  Each mutant's
suite gets ``--budget`` seconds of wall time; past it the mutant counts as not caught (timeout).

A dedicated test that passes because its ``pytest.raises`` caught the property's failure prints
nothing; in those runs this module is loaded as a pytest plugin (``-p rope.harness.mutation``) that echoes
what ``pytest.raises`` caught (the assertion and Hypothesis' failing example) to the captured
output, where the parser finds it between ``[rope-mutation]`` markers.

Seconds: ``wall_s`` is the wall time of the pytest subprocesses (until ``-x`` stops them),
``pytest_s`` pytest's own reported duration; the limit applies to the suite time, pytest's
duration where it reported one, else the wall time.

``properties`` is imported inside the functions: rope/ does not depend on it at import time.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pytest

from rope.harness.suite import suite_dir



def suite_root() -> Path:
    """The directory holding the ``properties`` suite (a checkout's root, or site-packages): the
    stages name tests relative to it, and pytest runs there so node ids read ``properties/...``."""
    return suite_dir().parent

SCHEMA = "rope-harness/mutants/1"
PROFILES = ("ci", "dev")
DEFAULT_LIMIT_S = 60.0          # a mutant must be caught within this much suite time
DEFAULT_BUDGET_S = 300.0        # wall time one mutant's suite may use before it counts as a timeout
MARK, MARK_END = "[rope-mutation] caught", "[rope-mutation] end"

ROTATION_SUITE = "properties/test_rotation.py"
GUARDED_FIRST = "test_known_bug_triggers_under_guards"
POSITION_SUITES = ("properties/test_runner_positions.py", "properties/test_scheduler_positions.py")
MUTANTS_TESTS = "properties/test_mutants.py"
DISPATCH_TESTS = "properties/test_dispatch.py"
BASELINE_SUITE = "properties/baseline"

# Kernel mutants whose bug is a memory-safety one: the output is right (or right on plain,
# contiguous inputs), and only the guarded inputs / interpreter tracer of properties/guards.py see
# it.  The same split as test_mutants.py's ROTARY_CELLS (detectors without "plain";
# test_mutation_runner.py holds the two together) plus the positions kernel's unmasked store.
MEMORY_SAFETY = frozenset({"cos_sin_unmasked", "cos_sin_unmasked_head_padded", "positions_rows_packed",
                           "positions_store_unmasked"})

KINDS = ("rotation", "rotation-kernel", "positions", "positions-kernel", "dispatch")
ROTATION_KINDS = ("rotation", "rotation-kernel")


# =========================================================================== the mutants
@dataclass(frozen=True)
class Mutant:
    """One mutant: ``name`` is ``<module>:<attribute>`` (unique: neox_for_gptj exists as a
    wrapper and as a kernel mutant), ``target`` the import path the registry resolves."""
    name: str
    kind: str
    target: str
    parent: str | None              # the unmutated implementation a failure is confirmed against
    doc: str = ""
    memory_safety: bool = False

    @property
    def attribute(self) -> str:
        return self.name.split(":", 1)[1]


def _first_line(doc: str | None) -> str:
    """The docstring's first paragraph, on one line."""
    return " ".join((doc or "").strip().split("\n\n", 1)[0].split())


def discover_mutants() -> list[Mutant]:
    """Every mutant defined in properties/mutants, in catalogue order."""
    from properties.mutants.broken_positions import BROKEN_POSITIONS
    from properties.mutants.broken_rotations import BROKEN_ROTATIONS
    from properties.mutants.dispatch import BROKEN_OPS
    from properties.mutants.kernel import POSITIONS_MUTANTS, ROTARY_MUTANTS

    out = []
    for name, fn in BROKEN_ROTATIONS.items():
        out.append(Mutant(f"broken_rotations:{name}", "rotation", f"properties.mutants.broken_rotations:{name}",
                          "native", _first_line(fn.__doc__)))
    for name, m in ROTARY_MUTANTS.items():
        out.append(Mutant(f"kernel:{name}", "rotation-kernel", f"properties.mutants.kernel:{name}", "triton",
                          _first_line(m.__doc__), name in MEMORY_SAFETY))
    for name, fn in BROKEN_POSITIONS.items():
        out.append(Mutant(f"broken_positions:{name}", "positions", f"properties.mutants.broken_positions:{name}",
                          "properties.mutants.broken_positions:correct_loop", _first_line(fn.__doc__)))
    for name, m in POSITIONS_MUTANTS.items():
        out.append(Mutant(f"kernel:{name}", "positions-kernel", f"properties.mutants.kernel:{name}", "triton",
                          _first_line(m.__doc__), name in MEMORY_SAFETY))
    for name, (_, cls) in BROKEN_OPS.items():
        out.append(Mutant(f"dispatch:{name}", "dispatch", f"properties.mutants.dispatch:{cls.__name__}", None,
                          _first_line(cls.__doc__)))
    return out


def select_mutants(mutants: list[Mutant], only: list[str]) -> list[Mutant]:
    """Filter by ``--only`` values: a full name (``kernel:neox_for_gptj``), a bare attribute name
    (``neox_for_gptj``: every mutant of that name) or an import path.  Unknown names raise ValueError."""
    if not only:
        return list(mutants)
    keep = []
    for want in only:
        hits = [m for m in mutants if want in (m.name, m.attribute, m.target)]
        if not hits:
            raise ValueError(f"--only={want!r}: no such mutant (known: {', '.join(m.name for m in mutants)})")
        keep += [m for m in hits if m not in keep]
    return [m for m in mutants if m in keep]


# =========================================================================== the stages
@dataclass(frozen=True)
class Stage:
    """One pytest invocation.  ``caught_when="fail"``: the suite runs on the mutant and a failing
    test catches it; ``"pass"``: a dedicated test asserts the property rejects the mutant, so its
    passing catches it.  ``impl_option`` names the option carrying the mutant (for the control)."""
    label: str
    tests: tuple[str, ...]
    options: tuple[str, ...] = ()
    caught_when: str = "fail"
    impl_option: str | None = None


def functions_in(path: str) -> list[str]:
    """Top-level ``test_*`` functions of a test file, in source order (read with ast, not imported)."""
    tree = ast.parse((suite_root() / path).read_text())
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def harness_stages(m: Mutant) -> list[Stage]:
    """The harness suite for a mutant: the stages run in order until one catches it."""
    if m.kind in ROTATION_KINDS:
        opts = ("--rope-impl", m.target)
        if not m.memory_safety:
            return [Stage("rotation suite", (ROTATION_SUITE,), opts, "fail", "--rope-impl")]
        names = functions_in(ROTATION_SUITE)
        order = [GUARDED_FIRST] + [n for n in names if n != GUARDED_FIRST]
        return [Stage("rotation suite, guarded known-bug tests first",
                      tuple(f"{ROTATION_SUITE}::{n}" for n in order), opts, "fail", "--rope-impl"),
                Stage("guarded search (test_mutants.py, dedicated)",
                      (f"{MUTANTS_TESTS}::test_rotation_property_catches_kernel_mutant[{m.attribute}]",),
                      (), "pass")]
    if m.kind in ("positions", "positions-kernel"):
        stages = [Stage("position suites", POSITION_SUITES, ("--rope-positions-impl", m.target), "fail",
                        "--rope-positions-impl")]
        if m.kind == "positions-kernel":
            # Guarded first: unguarded, a kernel writing past its output corrupts the test process's
            # own memory, which may crash it at once or hang it until the budget is spent.
            stages.insert(0, Stage("guarded search (test_mutants.py, dedicated)",
                                   (f"{MUTANTS_TESTS}::test_position_property_catches_kernel_mutant[{m.attribute}]",),
                                   (), "pass"))
        return stages
    if m.kind == "dispatch":
        return [Stage("dedicated test (test_dispatch.py)",
                      (f"{DISPATCH_TESTS}::test_dispatch_property_rejects_broken_op[{m.attribute}]",), (), "pass")]
    raise ValueError(f"kind={m.kind!r}: must be one of {KINDS}")


def baseline_stages(m: Mutant) -> list[Stage]:
    """The serving-engine-style baseline, for rotation mutants only ([] for the others)."""
    if m.kind not in ROTATION_KINDS:
        return []
    return [Stage("baseline suite", (BASELINE_SUITE,), ("--rope-baseline", "--rope-impl", m.target), "fail",
                  "--rope-impl")]


# =========================================================================== parsing pytest
_SUMMARY = re.compile(r"^=*\s*(?P<counts>[^=]*?)\s+in\s+(?P<secs>\d+(?:\.\d+)?)s(?:\s+\([\d:.]+\))?\s*=*\s*$")
_COUNT = re.compile(r"(\d+) (failed|passed|skipped|deselected|xfailed|xpassed|errors?|warnings?|rerun)")
_PROGRESS = re.compile(r"^(?P<node>[\w./-]+\.py::\S+)(?:\s+(?P<result>PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b)?")
_SHORT = re.compile(r"^(?P<result>FAILED|ERROR) (?P<node>\S+?)(?: - .*)?$")
_FAILURE_HEADER = re.compile(r"^_+ (?P<title>.+?) _+$")
_SECTION = re.compile(r"^=+ (?P<name>[A-Za-z ]+?) =+$")
_HYPOTHESIS_HEAD = re.compile(r"^(Failing test case|Falsifying example|Failing explicit example|"
                              r"Falsifying explicit example)\b")
_HYPOTHESIS_TAIL = re.compile(r"^(Explanation:|You can reproduce|Unreliable test|Highest target score)")


@dataclass
class PytestOutput:
    """What one pytest run printed, parsed."""
    summary: str = ""                       # "1 failed, 47 passed, 1 warning"
    pytest_s: float | None = None           # pytest's own duration ("in 131.65s")
    counts: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)      # node ids, in the order reported
    errors: list = field(default_factory=list)
    ran: list = field(default_factory=list)         # node ids that reported a result (-v)
    crash: str | None = None                # "Fatal Python error: Segmentation fault"
    crash_node: str | None = None           # the test running when it crashed (-v)
    message: list = field(default_factory=list)     # the first failure's E lines (or the caught block)
    assertion: list = field(default_factory=list)   # its assertion lines, Hypothesis' report removed
    falsifying: list = field(default_factory=list)  # Hypothesis' failing example, as reported
    caught_by_raises: list = field(default_factory=list)   # what pytest.raises caught (dedicated tests)


def _first_failure_lines(lines: list[str]) -> list[str]:
    """The E lines of the first test's section under FAILURES (or ERRORS)."""
    out, section, inside = [], None, False
    for line in lines:
        sec = _SECTION.match(line)
        if sec:
            if inside:
                break
            section = sec["name"]
            continue
        if section not in ("FAILURES", "ERRORS"):
            continue
        head = _FAILURE_HEADER.match(line)
        if head and set(head["title"]) - {"_", " "}:
            if inside:
                break
            inside = True
            continue
        if inside and (line == "E" or line.startswith("E ")):
            out.append(line[4:] if line.startswith("E   ") else line[1:].lstrip())
    return out


def _caught_blocks(lines: list[str]) -> list[str]:
    """The first block the plugin echoed between its markers."""
    out, inside = [], False
    for line in lines:
        if line.startswith(MARK):
            if out:
                break
            inside = True
            continue
        if inside and line.startswith(MARK_END):
            break
        if inside:
            out.append(line)
    return out


def split_message(message: list[str]) -> tuple[list[str], list[str]]:
    """(assertion lines, Hypothesis' failing example) of a failure message.  pytest's assert
    rewriting lines ("assert False", "+  where ...") are dropped from the assertion."""
    head = next((i for i, line in enumerate(message) if _HYPOTHESIS_HEAD.match(line.strip())), None)
    body = message if head is None else message[:head]
    assertion = [line for line in body if line.strip() and not line.strip().startswith(("+", "assert "))]
    falsifying = []
    if head is not None:
        for line in message[head:]:
            if _HYPOTHESIS_TAIL.match(line.strip()):
                break
            falsifying.append(line)
        while falsifying and not falsifying[-1].strip():
            falsifying.pop()
    return assertion, falsifying


def parse_pytest_output(text: str) -> PytestOutput:
    """Parse the output of ``pytest -v --tb=short`` (``-x``): the summary and duration, the
    failing / erroring node ids, the tests that ran, a crash and the test it hit, and the first
    failure's message split into its assertion and Hypothesis' failing example.  For dedicated
    tests (``-p rope.harness.mutation -rP``) the message is what ``pytest.raises`` caught."""
    out = PytestOutput()
    lines = text.splitlines()
    started = None
    for line in lines:
        m = _PROGRESS.match(line)
        if m:
            if m["result"]:
                out.ran.append(m["node"])
                started = None
            else:
                started = m["node"]
            if "Fatal Python error" in line and out.crash is None:
                out.crash = line[line.index("Fatal Python error"):].strip()
                out.crash_node = m["node"]
            continue
        if line.startswith("Fatal Python error") and out.crash is None:
            out.crash, out.crash_node = line.strip(), started
        s = _SHORT.match(line)
        if s:
            (out.failed if s["result"] == "FAILED" else out.errors).append(s["node"])
        summary = _SUMMARY.match(line)
        if summary and (_COUNT.search(summary["counts"]) or "no tests ran" in summary["counts"]):
            out.summary = summary["counts"].strip()
            out.pytest_s = float(summary["secs"])
            out.counts = {}
            for n, what in _COUNT.findall(out.summary):
                key = {"error": "errors", "warning": "warnings"}.get(what, what)
                out.counts[key] = out.counts.get(key, 0) + int(n)
    out.failed = list(dict.fromkeys(out.failed))
    out.errors = list(dict.fromkeys(out.errors))
    out.caught_by_raises = _caught_blocks(lines)
    out.message = _first_failure_lines(lines) or out.caught_by_raises
    out.assertion, out.falsifying = split_message(out.message)
    return out


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


# =========================================================================== running pytest
@dataclass
class RawRun:
    returncode: int
    output: str
    wall_s: float
    timed_out: bool = False


Executor = Callable[[list, float, dict], RawRun]


def execute_pytest(args: list[str], timeout_s: float, env: dict) -> RawRun:
    """``python -m pytest ARGS`` in the project root, stdout and stderr together; killed (its
    process group, which it leads) after ``timeout_s``."""
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+b") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=suite_root(), env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        wall = time.perf_counter() - start
        log.seek(0)
        text = log.read().decode("utf-8", "replace")
    return RawRun(proc.returncode, text, wall, timed_out)


def build_pytest_args(stage: Stage, tests, profile: str, options=None) -> list[str]:
    args = [*tests, *(stage.options if options is None else options), "-x", "-v", "--tb=short",
            "-p", "no:cacheprovider", f"--hypothesis-profile={profile}", "--rootdir", str(suite_root())]
    if stage.caught_when == "pass":
        args += ["-rA", "-p", "rope.harness.mutation"]
    return args


def _command(args: list[str], num_tests: int) -> str:
    """The command line of a run, its test list shortened."""
    tests = args[:num_tests] if num_tests <= 3 else args[:2] + [f"... ({num_tests} tests)"]
    return " ".join(["pytest", *tests, *args[num_tests:]])


# =========================================================================== results
@dataclass
class RunRecord:
    """One pytest subprocess of a mutant's suite."""
    stage: str
    command: str
    returncode: int
    wall_s: float
    pytest_s: float | None
    summary: str
    outcome: str            # caught | false-alarm | unrelated-failure | passed | crashed | timeout | error
    tests_run: int
    failing_test: str | None = None
    note: str = ""


@dataclass
class Control:
    """The failing test rerun on the mutant's parent."""
    test: str
    parent_test: str
    parent_failed: bool | None      # None: inconclusive (the parent's test did not run)
    wall_s: float
    summary: str


@dataclass
class SuiteResult:
    """A mutant against one suite (harness or baseline)."""
    suite: str
    status: str = "survived"        # caught | survived | timeout | crashed | error
    stage: str | None = None        # the stage that caught it
    test: str | None = None         # the test that caught it
    wall_s: float = 0.0
    pytest_s: float | None = None
    suite_s: float = 0.0            # pytest_s where reported, else wall_s, summed over runs
    slow: bool = False              # caught, but after more than the limit
    assertion: list = field(default_factory=list)
    falsifying_example: list = field(default_factory=list)
    excerpt: str = ""
    false_alarms: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    controls: list = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return self.status == "caught"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["caught"] = self.caught
        return d


@dataclass
class MutantResult:
    mutant: Mutant
    harness: SuiteResult
    baseline: SuiteResult | None = None

    def to_dict(self) -> dict:
        return {**asdict(self.mutant), "dedicated": self.mutant.kind == "dispatch",
                "harness": self.harness.to_dict(), "baseline": self.baseline.to_dict() if self.baseline else None}


@dataclass
class MutationReport:
    results: list
    profile: str
    limit_s: float
    budget_s: float
    jobs: int
    baseline: bool
    confirm: bool
    total_wall_s: float = 0.0
    created: str = ""

    def summary(self) -> dict:
        def side(pairs):
            caught = [(n, s) for n, s in pairs if s.caught]
            return {"mutants": len(pairs), "caught": len(caught),
                    "suite_s_total": round(sum(s.suite_s for _, s in pairs), 2),
                    "suite_s_caught_total": round(sum(s.suite_s for _, s in caught), 2),
                    "slow": [n for n, s in caught if s.slow],
                    "not_caught": [n for n, s in pairs if not s.caught],
                    "false_alarms": sum(len(s.false_alarms) for _, s in pairs)}
        harness = [(r.mutant.name, r.harness) for r in self.results]
        baseline = [(r.mutant.name, r.baseline) for r in self.results if r.baseline is not None]
        rotation = [(r.mutant.name, r.harness) for r in self.results if r.mutant.kind in ROTATION_KINDS]
        return {"harness": side(harness), "baseline": side(baseline) if self.baseline else None,
                "harness_on_rotation_mutants": side(rotation),
                "survivors": [r.mutant.name for r in self.results if not r.harness.caught]}

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "created": self.created, "profile": self.profile, "limit_s": self.limit_s,
                "budget_s": self.budget_s, "jobs": self.jobs, "baseline": self.baseline, "confirm": self.confirm,
                "total_wall_s": round(self.total_wall_s, 2), "summary": self.summary(),
                "mutants": [r.to_dict() for r in self.results]}


def exit_code(report: MutationReport) -> int:
    """0 when the harness caught every mutant, else 1 (slow catches are flagged, not failed)."""
    return 0 if all(r.harness.caught for r in report.results) else 1


# =========================================================================== the runner
class _Controls:
    """Parent reruns, cached: several mutants reach the same false alarm (one subprocess each)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._futures: dict = {}

    def get(self, key, compute):
        with self._lock:
            future = self._futures.get(key)
            owner = future is None
            if owner:
                future = self._futures[key] = Future()
        if owner:
            try:
                future.set_result(compute())
            except BaseException as exc:
                future.set_exception(exc)
        return future.result()


class MutationRunner:
    """Runs mutants' suites (``execute`` is the subprocess call; tests replace it with a fake)."""

    def __init__(self, *, profile: str = "ci", budget_s: float = DEFAULT_BUDGET_S, limit_s: float = DEFAULT_LIMIT_S,
                 confirm: bool = True, jobs: int = 2, execute: Executor = execute_pytest, log_dir: Path | None = None):
        if profile not in PROFILES:
            raise ValueError(f"profile={profile!r}: must be one of {PROFILES}")
        if jobs < 1:
            raise ValueError(f"jobs={jobs}: must be >= 1")
        self.profile, self.budget_s, self.limit_s, self.confirm, self.jobs = profile, budget_s, limit_s, confirm, jobs
        self.execute = execute
        self.log_dir = log_dir
        self._controls = _Controls()
        from rope.harness import report
        env = dict(os.environ)
        threads = str(max(1, (os.cpu_count() or 1) // jobs))
        # Deliberate failures leave no trace: no case files (rope.harness.case_files), no run report (rope.harness.report).
        env.update({"ROPE_CASES_DIR": "off", report.DISABLE_ENV: "1", "OMP_NUM_THREADS": threads,
                    "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})
        for name in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_WORKER", report.RUN_ENV):
            env.pop(name, None)
        self.env = env

    # ------------------------------------------------------------------ one suite
    def run_suite(self, m: Mutant, suite: str) -> SuiteResult | None:
        stages = harness_stages(m) if suite == "harness" else baseline_stages(m)
        if not stages:
            return None
        result = SuiteResult(suite)
        statuses = []
        for stage in stages:
            remaining = self.budget_s - result.wall_s
            if remaining <= 0:
                statuses.append("timeout")
                break
            status = self._run_stage(m, stage, result, remaining)
            statuses.append(status)
            if status == "caught":
                break
            if status == "timeout":
                break
        result.status = self._combine(statuses)
        if result.caught:
            result.slow = result.suite_s > self.limit_s
            if result.slow:
                result.notes.append(f"caught after {result.suite_s:.1f} s of suite time, over the "
                                    f"{self.limit_s:.0f} s limit")
        result.excerpt = excerpt(result.assertion, result.falsifying_example)
        result.wall_s, result.suite_s = round(result.wall_s, 3), round(result.suite_s, 3)
        if result.pytest_s is not None:
            result.pytest_s = round(result.pytest_s, 3)
        return result

    @staticmethod
    def _combine(statuses: list[str]) -> str:
        if "caught" in statuses:
            return "caught"
        for status in ("timeout", "error", "crashed"):
            if status in statuses:
                return status
        return "survived"

    def _log(self, m: Mutant, suite: str, index: int, raw: RawRun, args: list[str]) -> None:
        if self.log_dir is None:
            return
        from rope.harness.atomic import atomic_write
        name = re.sub(r"[^\w.-]+", "_", f"{m.name}.{suite}.{index}") + ".log"
        atomic_write(Path(self.log_dir) / name, (f"$ pytest {' '.join(args)}\n" + raw.output).encode())

    def _account(self, result: SuiteResult, raw: RawRun, parsed: PytestOutput) -> None:
        result.wall_s += raw.wall_s
        if parsed.pytest_s is not None:
            result.pytest_s = (result.pytest_s or 0.0) + parsed.pytest_s
        result.suite_s += parsed.pytest_s if parsed.pytest_s is not None else raw.wall_s

    def _run_stage(self, m: Mutant, stage: Stage, result: SuiteResult, remaining: float) -> str:
        tests = list(stage.tests)
        collected = None
        while True:
            args = build_pytest_args(stage, tests, self.profile)
            raw = self.execute(args, remaining, self.env)
            parsed = parse_pytest_output(raw.output)
            self._account(result, raw, parsed)
            self._log(m, result.suite, len(result.runs), raw, args)
            remaining -= raw.wall_s
            record = RunRecord(stage.label, _command(args, len(tests)), raw.returncode, round(raw.wall_s, 3),
                               parsed.pytest_s, parsed.summary, "", len(parsed.ran))
            result.runs.append(record)
            outcome, node = self._judge(m, stage, raw, parsed, result)
            record.outcome, record.failing_test = outcome, node
            if outcome == "caught":
                result.stage, result.test = stage.label, node
                result.assertion, result.falsifying_example = parsed.assertion[:12], parsed.falsifying[:60]
                return "caught"
            if outcome in ("false-alarm", "unrelated-failure") and not raw.timed_out:
                # Go on with the tests after the one that stopped -x.
                if collected is None:
                    collected = self._collect(stage, tests)
                if node not in collected:
                    result.notes.append(f"{stage.label}: cannot continue past {node} (not in the collection)")
                    return "error"
                tests = collected[collected.index(node) + 1:]
                if not tests:
                    return "survived"
                if remaining <= 0:
                    result.notes.append(f"{stage.label}: budget of {self.budget_s:.0f} s spent "
                                        f"after {len(parsed.ran)} tests")
                    return "timeout"
                continue
            if outcome == "timeout":
                result.notes.append(f"{stage.label}: budget of {self.budget_s:.0f} s spent after "
                                    f"{len(parsed.ran)} tests ({parsed.ran[-1] if parsed.ran else 'none'} last)")
            return {"passed": "survived", "crashed": "crashed", "timeout": "timeout"}.get(outcome, "error")

    def _collect(self, stage: Stage, tests: list[str]) -> list[str]:
        args = [*tests, *stage.options, "--collect-only", "-q", "-p", "no:cacheprovider",
                "--rootdir", str(suite_root())]
        raw = self.execute(args, 300.0, self.env)
        return [line.strip() for line in raw.output.splitlines() if "::" in line and not line.startswith(" ")]

    def _judge(self, m: Mutant, stage: Stage, raw: RawRun, parsed: PytestOutput, result: SuiteResult):
        """(outcome, node) of one run."""
        if parsed.crash or (raw.returncode < 0 and not raw.timed_out):
            node = parsed.crash_node
            what = parsed.crash or f"killed by signal {-raw.returncode}"
            result.notes.append(f"{stage.label}: the process crashed ({what}) in {node or 'an unknown test'}; "
                                f"a crash gives no counterexample and is not counted as a catch")
            return "crashed", node
        if raw.timed_out:
            return "timeout", None
        if stage.caught_when == "pass":
            if raw.returncode == 0 and parsed.counts.get("passed", 0) >= 1:
                return "caught", parsed.ran[-1] if parsed.ran else stage.tests[0]
            if raw.returncode == 1 and parsed.failed:
                result.notes.append(f"{stage.label}: the dedicated test failed (the property did not reject the "
                                    f"mutant): {parsed.assertion[0] if parsed.assertion else parsed.summary}")
                return "passed", parsed.failed[0]
            result.notes.append(f"{stage.label}: pytest exit {raw.returncode} ({parsed.summary or 'no summary'})"
                                f"{': ' + parsed.message[0] if parsed.message else ''}")
            return "error", None
        if raw.returncode == 0:
            if not parsed.ran:
                result.notes.append(f"{stage.label}: no test ran ({parsed.summary})")
                return "error", None
            return "passed", None
        if raw.returncode == 1 and parsed.failed:
            node = parsed.failed[0]
            if m.target not in node:
                result.false_alarms.append(node)
                result.notes.append(f"{stage.label}: {node} failed but does not test the mutant; not a catch")
                return "unrelated-failure", node
            if self.confirm and m.parent:
                control = self._control(m, stage, node)
                result.controls.append(control)
                if control.parent_failed:
                    result.false_alarms.append(node)
                    result.notes.append(f"{stage.label}: {node} also fails on the parent {m.parent} "
                                        f"(false alarm, skipped)")
                    return "false-alarm", node
                if control.parent_failed is None:
                    result.notes.append(f"{stage.label}: control on {m.parent} inconclusive ({control.summary})")
            return "caught", node
        result.notes.append(f"{stage.label}: pytest exit {raw.returncode} ({parsed.summary or 'no summary'})"
                            f"{': ' + parsed.message[0] if parsed.message else ''}"
                            f"{'; errors: ' + ', '.join(parsed.errors[:3]) if parsed.errors else ''}")
        return "error", None

    def _control(self, m: Mutant, stage: Stage, node: str) -> Control:
        """Rerun the failing test on the parent: does the unmutated implementation fail it too?"""
        parent_node = node.replace(m.target, m.parent)
        options = list(stage.options)
        if stage.impl_option in options:
            options[options.index(stage.impl_option) + 1] = m.parent

        def compute() -> Control:
            args = build_pytest_args(stage, [parent_node], self.profile, options)
            raw = self.execute(args, max(self.budget_s, 60.0), self.env)
            parsed = parse_pytest_output(raw.output)
            if raw.returncode == 1 and parent_node in parsed.failed:
                failed = True
            elif raw.returncode == 0 and parsed.ran:
                failed = False
            else:
                failed = None
            return Control(node, parent_node, failed, round(raw.wall_s, 3), parsed.summary or f"exit {raw.returncode}")

        control = self._controls.get((tuple(options), parent_node), compute)
        return Control(node, control.parent_test, control.parent_failed, control.wall_s, control.summary)

    # ------------------------------------------------------------------ all mutants
    def run(self, mutants: list[Mutant], *, baseline: bool = True,
            progress: Callable[[str], None] | None = None) -> list[MutantResult]:
        items = [(m, "harness") for m in mutants]
        if baseline:
            items += [(m, "baseline") for m in mutants if baseline_stages(m)]
        # Longest first (kernel mutants under the interpreter; the baseline's 8192-token examples).
        cost = {("rotation-kernel", "baseline"): 0, ("rotation-kernel", "harness"): 1, ("positions", "harness"): 2}
        items.sort(key=lambda it: cost.get((it[0].kind, it[1]), 3))
        done: dict = {}
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = {pool.submit(self._safe_suite, m, suite): (m, suite) for m, suite in items}
            for i, future in enumerate(as_completed(futures), 1):
                m, suite = futures[future]
                res = future.result()
                done[m.name, suite] = res
                if progress:
                    progress(f"[{i}/{len(items)}] {m.name} {suite}: {describe(res)}")
        return [MutantResult(m, done[m.name, "harness"], done.get((m.name, "baseline"))) for m in mutants]

    def _safe_suite(self, m: Mutant, suite: str) -> SuiteResult | None:
        try:
            return self.run_suite(m, suite)
        except Exception as exc:         # one mutant's runner failure must not lose the others
            return SuiteResult(suite, status="error",
                               notes=[f"runner failed: {type(exc).__name__}: {exc}",
                                      *traceback.format_exc().splitlines()[-6:]])


def describe(s: SuiteResult | None) -> str:
    if s is None:
        return "n/a"
    if s.caught:
        return f"caught in {s.suite_s:.1f} s{' (SLOW)' if s.slow else ''} by {s.test}"
    return f"{s.status.upper()} after {s.wall_s:.1f} s"


def run(only: list[str] | None = None, *, profile: str = "ci", baseline: bool = True, jobs: int = 2,
        budget_s: float = DEFAULT_BUDGET_S, limit_s: float = DEFAULT_LIMIT_S, confirm: bool = True,
        log_dir: Path | None = None, progress: Callable[[str], None] | None = None,
        execute: Executor = execute_pytest) -> MutationReport:
    """Run the harness (and the baseline) against the mutants selected by ``only`` (all by
    default); returns the report, prints nothing, writes only logs (when ``log_dir`` is given)."""
    mutants = select_mutants(discover_mutants(), list(only or []))
    runner = MutationRunner(profile=profile, budget_s=budget_s, limit_s=limit_s, confirm=confirm, jobs=jobs,
                            execute=execute, log_dir=log_dir)
    start = time.perf_counter()
    results = runner.run(mutants, baseline=baseline, progress=progress)
    return MutationReport(results, profile, limit_s, budget_s, jobs, baseline, confirm,
                          time.perf_counter() - start, datetime.now(timezone.utc).isoformat(timespec="seconds"))


# =========================================================================== output
def _cell(s: SuiteResult | None, *, markup: bool) -> tuple[str, str]:
    """(caught?, seconds) cells of a suite result."""
    if s is None:
        return "n/a", "-"
    if s.caught:
        word = "yes (SLOW)" if s.slow else "yes"
        if markup:
            word = f"[yellow]{word}[/]" if s.slow else f"[green]{word}[/]"
    else:
        word = f"NO ({s.status})"
        if markup:
            word = f"[bold red]{word}[/]"
    if s.false_alarms:
        word += f" {len(s.false_alarms)} false alarm{'s' if len(s.false_alarms) > 1 else ''} skipped"
    pyt = f"{s.pytest_s:.1f}" if s.pytest_s is not None else "-"
    return word, f"{s.wall_s:.1f} / {pyt}"


def _kind(m: Mutant) -> str:
    if m.kind == "dispatch":
        return "dispatch (dedicated test)"
    return m.kind + (" (memory)" if m.memory_safety else "")


def _summary_lines(report: MutationReport) -> list[str]:
    s = report.summary()
    h, b, hr = s["harness"], s["baseline"], s["harness_on_rotation_mutants"]
    lines = [f"harness: caught {h['caught']}/{h['mutants']} mutants "
             f"({hr['caught']}/{hr['mutants']} rotation mutants), {h['suite_s_caught_total']:.1f} s of suite time "
             f"over the catches; over the {report.limit_s:.0f} s limit: {', '.join(h['slow']) or 'none'}"]
    if b is not None:
        lines.append(f"baseline: caught {b['caught']}/{b['mutants']} rotation mutants, "
                     f"{b['suite_s_caught_total']:.1f} s of suite time over the catches "
                     f"({b['suite_s_total']:.1f} s in all); false alarms skipped: {b['false_alarms']}; "
                     f"over the limit: {', '.join(b['slow']) or 'none'}")
    lines.append(f"survivors of the harness: {', '.join(s['survivors']) or 'none'}")
    lines.append(f"total wall time {report.total_wall_s:.1f} s, profile {report.profile}, {report.jobs} jobs, "
                 f"budget {report.budget_s:.0f} s per suite")
    return lines


NOTE_SECONDS = ("seconds: wall time of the pytest subprocess(es) until the first genuine failure / pytest's own "
                "reported duration; the limit applies to pytest's duration")
NOTE_DISPATCH = ("dispatch mutants are op classes, not registry implementations: they run through their dedicated "
                 "tests in properties/test_dispatch.py (test_dispatch_property_rejects_broken_op[NAME]), which pass "
                 "when the dispatch property rejects the broken op")
NOTE_CONTROL = ("a failure counts only if the same test passes on the mutant's unmutated parent; failures the parent "
                "shares are false alarms, skipped")


def print_table(report: MutationReport, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=max(180, Console().width))
    table = Table(title=f"rope-harness mutants (profile {report.profile})", show_lines=True,
                  caption="\n".join([NOTE_SECONDS, NOTE_DISPATCH] + ([NOTE_CONTROL] if report.confirm else [])),
                  caption_justify="left")
    columns = (("mutant", {"no_wrap": True}), ("kind", {"max_width": 16}),
               ("harness caught?", {"max_width": 14}), ("s (wall / pytest)", {"max_width": 11}),
               ("baseline caught?", {"max_width": 14}), ("s (wall / pytest)", {"max_width": 11}),
               ("counterexample", {"overflow": "fold", "min_width": 40}))
    for name, kw in columns:
        table.add_column(name, **kw)
    for r in report.results:
        hc, hs = _cell(r.harness, markup=True)
        bc, bs = _cell(r.baseline, markup=True)
        table.add_row(escape(r.mutant.name), escape(_kind(r.mutant)), hc, hs, bc, bs,
                      escape(r.harness.excerpt or "; ".join(r.harness.notes[:2])))
    console.print(table)
    for line in _summary_lines(report):
        console.print(line, highlight=False, markup=False)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def markdown(report: MutationReport) -> str:
    lines = [f"# Mutation report ({report.created})", "",
             f"Profile `{report.profile}`; limit {report.limit_s:.0f} s of suite time; budget {report.budget_s:.0f} s "
             f"per suite; {report.jobs} jobs; baseline {'on' if report.baseline else 'off'}; "
             f"parent control {'on' if report.confirm else 'off'}.", ""]
    lines += [f"- {line}" for line in _summary_lines(report)] + [""]
    lines += [f"- {NOTE_SECONDS}", f"- {NOTE_DISPATCH}"] + ([f"- {NOTE_CONTROL}"] if report.confirm else []) + [""]
    lines += ["| mutant | kind | harness caught? | s (wall / pytest) | baseline caught? | s (wall / pytest) | "
              "counterexample |", "|---|---|---|---:|---|---:|---|"]
    for r in report.results:
        hc, hs = _cell(r.harness, markup=False)
        bc, bs = _cell(r.baseline, markup=False)
        lines.append(f"| `{r.mutant.name}` | {_kind(r.mutant)} | {hc} | {hs} | {bc} | {bs} | "
                     f"{_md(r.harness.excerpt or '; '.join(r.harness.notes[:2]))} |")
    lines += ["", "## Details", ""]
    for r in report.results:
        lines += [f"### `{r.mutant.name}` ({_kind(r.mutant)})", "", r.mutant.doc, ""]
        for s in (r.harness, r.baseline):
            if s is None:
                continue
            lines.append(f"- **{s.suite}**: {describe(s)}" + (f" (stage: {s.stage})" if s.stage else ""))
            lines += [f"  - {n}" for n in s.notes]
            if s.assertion or s.falsifying_example:
                lines += ["", "```text", *s.assertion, *s.falsifying_example, "```", ""]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_reports(report: MutationReport, out_dir: Path) -> list[Path]:
    """``mutants.json`` and ``mutants.md`` in ``out_dir``, each written atomically."""
    from rope.harness.atomic import atomic_write
    out_dir = Path(out_dir)
    paths = [out_dir / "mutants.json", out_dir / "mutants.md"]
    atomic_write(paths[0], (json.dumps(report.to_dict(), indent=1) + "\n").encode())
    atomic_write(paths[1], markdown(report).encode())
    return paths


# =========================================================================== command line
def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="ci", choices=PROFILES, help="Hypothesis profile of the suites (default ci)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run this mutant only (kernel:neox_for_gptj, a bare name for every mutant of that name, or "
                        "an import path); repeatable")
    p.add_argument("--no-baseline", action="store_true", help="skip the serving-engine-style baseline suite")
    p.add_argument("--jobs", type=_positive(int), default=2, help="mutant suites run in parallel (default 2)")
    p.add_argument("--out", default=None, help="directory for mutants.json / mutants.md (default ./reports)")
    p.add_argument("--budget", type=_positive(float), default=DEFAULT_BUDGET_S,
                   help=f"wall seconds one mutant's suite may use (default {DEFAULT_BUDGET_S:.0f})")
    p.add_argument("--limit", type=_positive(float), default=DEFAULT_LIMIT_S,
                   help=f"a catch slower than this many seconds of suite time is flagged "
                        f"(default {DEFAULT_LIMIT_S:.0f})")
    p.add_argument("--no-confirm", action="store_true",
                   help="count every failure naming the mutant as a catch, without rerunning it on the parent")
    p.add_argument("--logs", action="store_true", help="keep every pytest output under OUT/mutants-logs/")
    p.add_argument("--list", action="store_true", help="list the mutants and their suites, run nothing")


def cmd_mutants(args) -> int:
    """The ``mutants`` sub-command (``args`` from :func:`add_arguments`); returns the exit status."""
    from rich.console import Console
    console = Console(width=max(180, Console().width))
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        mutants = select_mutants(discover_mutants(), args.only)
    except ValueError as exc:
        err.print(f"rope-harness mutants: {exc}", markup=False)
        return 2
    if args.list:
        for m in mutants:
            console.print(f"{m.name}  [{_kind(m)}]  {m.doc}", highlight=False, markup=False)
            for stage in harness_stages(m) + baseline_stages(m):
                tests = " ".join(stage.tests[:2]) + (" ..." if len(stage.tests) > 2 else "")
                when = "a test fails" if stage.caught_when == "fail" else "the test passes"
                console.print(f"    {stage.label}: {tests} {' '.join(stage.options)} (caught when {when})",
                              highlight=False, markup=False)
        return 0
    from rope.harness.report import reports_dir
    out = Path(args.out) if args.out else reports_dir()
    err.print(f"rope-harness mutants: {len(mutants)} mutants, profile {args.profile}, {args.jobs} jobs, baseline "
              f"{'off' if args.no_baseline else 'on'}; dispatch mutants run through their dedicated tests in "
              f"{DISPATCH_TESTS}")
    report = run([m.name for m in mutants], profile=args.profile, baseline=not args.no_baseline, jobs=args.jobs,
                 budget_s=args.budget, limit_s=args.limit, confirm=not args.no_confirm,
                 log_dir=out / "mutants-logs" if args.logs else None,
                 progress=lambda line: err.print(line, markup=False))
    print_table(report, console)
    for path in write_reports(report, out):
        console.print(f"wrote {path}", highlight=False, markup=False)
    return exit_code(report)


def add_mutants_parser(sub) -> None:
    """Register ``mutants`` on the CLI's sub-parsers (``args.func(args)`` returns the exit status)."""
    p = sub.add_parser("mutants", help="run the property suite (and the baseline) against every mutant",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_mutants)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rope-harness mutants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """``rope-harness mutants`` as a function: ``main(["--only", "key_unrotated", "--no-baseline"])``."""
    args = build_parser().parse_args(argv)
    import rope  # noqa: F401  (Triton interpreter switch before the kernel mutants are imported)
    return cmd_mutants(args)


# =========================================================================== pytest plugin
# Loaded with ``-p rope.harness.mutation`` in the dedicated tests' runs only: while a test runs,
# ``pytest.raises`` echoes what it caught (message and notes, where Hypothesis puts its failing
# example) between markers, so a test that passes by catching the property's failure still shows
# the counterexample (in -rA's captured output).
class _EchoRaises:
    def __init__(self, context):
        self._context = context

    def __enter__(self):
        return self._context.__enter__()

    def __exit__(self, exc_type, exc, tb):
        handled = self._context.__exit__(exc_type, exc, tb)
        if handled and exc is not None:
            text = "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
            print(f"{MARK} {type(exc).__name__}:\n{text}\n{MARK_END}", flush=True)
        return handled

    def __getattr__(self, name):
        return getattr(self._context, name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    original = pytest.raises

    def raises(expected_exception=None, *args, **kwargs):
        if args:                                  # the function-call form: nothing to echo
            return original(expected_exception, *args, **kwargs)
        return _EchoRaises(original(expected_exception, **kwargs))

    pytest.raises = raises
    try:
        return (yield)
    finally:
        pytest.raises = original


if __name__ == "__main__":
    sys.exit(main())
