"""The runner: each mutant's stages as pytest subprocesses (threads, ``--jobs`` at a time), each
run judged from the records its pytest wrote (rope.harness.mutation.records), never from its
terminal output.

* A failure counts as a catch only if the failing test's id names the mutant and (unless
  ``confirm=False``) the same test passes on the mutant's unmutated parent; a failure the parent
  shares is a *false alarm*, recorded, and the stage goes on with the tests after it.
* A dedicated test (``caught_when="pass"``) catches the mutant by passing; what its
  ``pytest.raises`` caught is the counterexample.
* Each mutant's suite gets ``budget_s`` of wall time; past it, the run is killed (its process
  group) and the mutant counts as not caught (timeout).
* A process that dies (a segfault, a kill) is judged from the records written before it died: a
  failure (or a passing dedicated test) recorded first still counts; otherwise the run is a crash,
  with the test that was running, and no catch.
"""

from __future__ import annotations

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
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from rope.harness.mutation.catalogue import Mutant, discover_mutants, select_mutants, unmet_need
from rope.harness.mutation.outcome import PytestRun, excerpt
from rope.harness.mutation.records import RECORDS_ENV, read_records
from rope.harness.mutation.results import Control, MutantResult, MutationReport, RunRecord, SuiteResult, describe
from rope.harness.mutation.stages import (Stage, baseline_stages, build_pytest_args, command_line, drawn_stages,
                                          harness_stages, suite_root)

PROFILES = ("ci", "dev")
DEFAULT_LIMIT_S = 60.0          # a mutant must be caught within this much suite time
DEFAULT_BUDGET_S = 300.0        # wall time one mutant's suite may use before it counts as a timeout


@dataclass
class RawRun:
    """How a pytest subprocess ended; ``output`` (stdout and stderr) is kept for the logs only."""
    returncode: int
    output: str
    wall_s: float
    timed_out: bool = False


Executor = Callable[[list, float, dict], RawRun]


def execute_pytest(args: list[str], timeout_s: float, env: dict) -> RawRun:
    """``python -m pytest ARGS`` in the suite's root, stdout and stderr together; killed (its
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


def _death(raw: RawRun) -> str:
    """How a process that did not finish its session ended."""
    if raw.returncode < 0:
        try:
            return f"killed by {signal.Signals(-raw.returncode).name} ({signal.strsignal(-raw.returncode)})"
        except ValueError:
            return f"killed by signal {-raw.returncode}"
    return f"exit {raw.returncode} before pytest finished"


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
    """Runs mutants' suites (``execute`` is the subprocess call; tests replace it with a fake, which
    writes its records to the file named by ``env[RECORDS_ENV]``)."""

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
        for name in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_WORKER", report.RUN_ENV,
                     RECORDS_ENV):
            env.pop(name, None)
        self.env = env

    # ------------------------------------------------------------------ one pytest run
    def _pytest(self, args: list[str], timeout_s: float, log_name: str | None) -> tuple[RawRun, PytestRun]:
        """Run pytest with a fresh records file; the records are read back (and kept with the log
        under ``log_dir``), the file removed."""
        fd, path = tempfile.mkstemp(prefix="rope-mutation-", suffix=".jsonl")
        os.close(fd)
        try:
            raw = self.execute(args, timeout_s, {**self.env, RECORDS_ENV: path})
            records = read_records(path)
            if self.log_dir is not None and log_name is not None:
                from rope.harness.atomic import atomic_write
                name = re.sub(r"[^\w.-]+", "_", log_name)
                atomic_write(Path(self.log_dir) / f"{name}.log", (f"$ pytest {' '.join(args)}\n" + raw.output).encode())
                atomic_write(Path(self.log_dir) / f"{name}.jsonl", Path(path).read_bytes())
        finally:
            os.unlink(path)
        return raw, PytestRun.from_records(records)

    # ------------------------------------------------------------------ one suite
    def run_suite(self, m: Mutant, suite: str) -> SuiteResult | None:
        stages = {"harness": harness_stages, "drawn": drawn_stages, "baseline": baseline_stages}[suite](m)
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
            if status in ("caught", "timeout"):
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

    @staticmethod
    def _account(result: SuiteResult, raw: RawRun, run: PytestRun) -> None:
        result.wall_s += raw.wall_s
        if run.pytest_s is not None:
            result.pytest_s = (result.pytest_s or 0.0) + run.pytest_s
        result.suite_s += run.pytest_s if run.pytest_s is not None else raw.wall_s

    def _run_stage(self, m: Mutant, stage: Stage, result: SuiteResult, remaining: float) -> str:
        tests = list(stage.tests)
        collected = None
        while True:
            args = build_pytest_args(stage, tests, self.profile)
            raw, run = self._pytest(args, remaining, f"{m.name}.{result.suite}.{len(result.runs)}")
            self._account(result, raw, run)
            remaining -= raw.wall_s
            record = RunRecord(stage.label, command_line(args, len(tests)), raw.returncode, round(raw.wall_s, 3),
                               run.pytest_s, run.summary, "", len(run.ran))
            result.runs.append(record)
            if collected is None:
                collected = run.collected               # the stage's whole collection, in run order
            outcome, node = self._judge(m, stage, raw, run, result)
            record.outcome, record.failing_test = outcome, node
            if outcome == "caught":
                result.stage, result.test = stage.label, node
                assertion, falsifying = (run.failure_text(node) if stage.caught_when == "fail"
                                         else run.caught_text(node))
                result.assertion, result.falsifying_example = assertion[:12], falsifying[:60]
                return "caught"
            if outcome in ("false-alarm", "unrelated-failure"):
                # Go on with the tests after the one that stopped -x.
                if raw.timed_out:
                    result.notes.append(f"{stage.label}: budget of {self.budget_s:.0f} s spent after {node}")
                    return "timeout"
                if node not in collected:
                    result.notes.append(f"{stage.label}: cannot continue past {node} (not in the collection)")
                    return "error"
                tests = collected[collected.index(node) + 1:]
                if not tests:
                    return "survived"
                if remaining <= 0:
                    result.notes.append(f"{stage.label}: budget of {self.budget_s:.0f} s spent "
                                        f"after {len(run.ran)} tests")
                    return "timeout"
                continue
            if outcome == "timeout":
                result.notes.append(f"{stage.label}: budget of {self.budget_s:.0f} s spent after "
                                    f"{len(run.ran)} tests ({run.running or (run.ran[-1] if run.ran else 'none')} "
                                    f"last)")
            return {"passed": "survived", "crashed": "crashed", "timeout": "timeout"}.get(outcome, "error")

    def _judge(self, m: Mutant, stage: Stage, raw: RawRun, run: PytestRun, result: SuiteResult):
        """(outcome, node) of one run, from its records."""
        died = not raw.timed_out and (raw.returncode < 0 or (run.started and not run.finished))
        after = f" (the process then died: {_death(raw)})" if died else (
            " (then the budget ran out)" if raw.timed_out and not run.finished else "")
        if stage.caught_when == "pass":
            if run.passed and not run.failed and not run.errors:
                if after:
                    result.notes.append(f"{stage.label}: {run.passed[0]} passed{after}")
                return "caught", run.passed[0]
            if run.failed:
                assertion, _ = run.failure_text(run.failed[0])
                result.notes.append(f"{stage.label}: the dedicated test failed (the property did not reject the "
                                    f"mutant): {assertion[0] if assertion else run.summary}")
                return "passed", run.failed[0]
        elif run.failed:
            node = run.failed[0]
            if after:
                result.notes.append(f"{stage.label}: {node} failed{after}")
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
        if died:
            node = run.running
            result.notes.append(f"{stage.label}: the process crashed ({_death(raw)}) in {node or 'an unknown test'}; "
                                f"a crash gives no counterexample and is not counted as a catch")
            return "crashed", node
        if raw.timed_out:
            return "timeout", None
        if stage.caught_when == "fail" and raw.returncode == 0 and run.finished:
            if not run.ran:
                result.notes.append(f"{stage.label}: no test ran ({run.summary})")
                return "error", None
            return "passed", None
        message = run.first_message()
        tail = "" if run.started else next((line for line in reversed(raw.output.splitlines()) if line.strip()), "")
        result.notes.append(f"{stage.label}: pytest exit {raw.returncode} ({run.summary or 'no summary'})"
                            f"{': ' + message if message else ''}"
                            f"{'; errors: ' + ', '.join(run.errors[:3]) if run.errors else ''}"
                            f"{'; ' + tail.strip() if tail else ''}")
        return "error", None

    def _control(self, m: Mutant, stage: Stage, node: str) -> Control:
        """Rerun the failing test on the parent: does the unmutated implementation fail it too?"""
        parent_node = node.replace(m.target, m.parent)
        options = list(stage.options)
        if stage.impl_option in options:
            options[options.index(stage.impl_option) + 1] = m.parent

        def compute() -> Control:
            args = build_pytest_args(stage, [parent_node], self.profile, options)
            raw, run = self._pytest(args, max(self.budget_s, 60.0), None)
            if parent_node in run.failed:
                failed = True
            elif raw.returncode == 0 and run.ran:
                failed = False
            else:
                failed = None
            return Control(node, parent_node, failed, round(raw.wall_s, 3), run.summary or f"exit {raw.returncode}")

        control = self._controls.get((tuple(options), parent_node), compute)
        return Control(node, control.parent_test, control.parent_failed, control.wall_s, control.summary)

    # ------------------------------------------------------------------ all mutants
    def run(self, mutants: list[Mutant], *, baseline: bool = True, drawn: bool = True,
            progress: Callable[[str], None] | None = None) -> list[MutantResult]:
        items = [(m, "harness") for m in mutants]
        if drawn:
            items += [(m, "drawn") for m in mutants if drawn_stages(m)]
        if baseline:
            items += [(m, "baseline") for m in mutants if baseline_stages(m)]
        # Longest first (kernel mutants under the interpreter; the baseline's 8192-token examples).
        cost = {("rotation-kernel", "baseline"): 0, ("rotation-kernel", "harness"): 1, ("rotation-kernel", "drawn"): 1,
                ("positions", "harness"): 2, ("positions", "drawn"): 2}
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
        return [MutantResult(m, done[m.name, "harness"], done.get((m.name, "baseline")), done.get((m.name, "drawn")))
                for m in mutants]

    def _safe_suite(self, m: Mutant, suite: str) -> SuiteResult | None:
        try:
            return self.run_suite(m, suite)
        except Exception as exc:         # one mutant's runner failure must not lose the others
            return SuiteResult(suite, status="error",
                               notes=[f"runner failed: {type(exc).__name__}: {exc}",
                                      *traceback.format_exc().splitlines()[-6:]])


def run(only: list[str] | None = None, *, profile: str = "ci", baseline: bool = True, drawn: bool = True, jobs: int = 2,
        budget_s: float = DEFAULT_BUDGET_S, limit_s: float = DEFAULT_LIMIT_S, confirm: bool = True,
        log_dir: Path | None = None, progress: Callable[[str], None] | None = None,
        execute: Executor = execute_pytest) -> MutationReport:
    """Run the harness (and the baseline) against the mutants selected by ``only`` (all by
    default); returns the report, prints nothing, writes only logs (when ``log_dir`` is given)."""
    selected = select_mutants(discover_mutants(), list(only or []))
    # Mutants this machine cannot show (a GPU-only bug on a CPU box) are listed, not run or counted.
    not_run = [(m.name, why) for m in selected if (why := unmet_need(m))]
    mutants = [m for m in selected if not unmet_need(m)]
    runner = MutationRunner(profile=profile, budget_s=budget_s, limit_s=limit_s, confirm=confirm, jobs=jobs,
                            execute=execute, log_dir=log_dir)
    start = time.perf_counter()
    results = runner.run(mutants, baseline=baseline, drawn=drawn, progress=progress)
    return MutationReport(results, profile, limit_s, budget_s, jobs, baseline, confirm,
                          time.perf_counter() - start, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          not_run, drawn)
