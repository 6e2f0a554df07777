"""``rope-harness campaign``: a time-boxed hunt for mismatches across every GPU.

The campaign is pytest-xdist doing what it does best, in rounds:

* every round runs each Hypothesis test of the equivalence properties with a fresh seed and
  more examples than the last (20, 80, 320, ... up to ``--max-examples``, the ``deep``
  profile's 2000 by default), so a short budget still covers every test and a long one digs
  deep; the fixed cases (known-bug triggers, real model configurations) run once;
* the rounds run inside one ``pytest -n W`` session (the plugin gives each Hypothesis test one
  copy per round, ordered by round): the workers, their compiled Triton kernels and memoized
  tables live through every round (a session per round spent most of a short campaign starting
  processes and compiling kernels again); a session that ends before the deadline is followed by
  another, with new seeds;
* the workers spread over the GPUs (rope.harness.placement: each GPU test is assigned a GPU, each worker
  has its own default GPU);
* all workers and rounds share one Hypothesis example database (``<out>/hypothesis-db``): a
  failure one worker finds is saved there, and every later run of that test - on any worker, GPU
  or implementation, in the next round - replays it first; campaigns on several hosts share theirs
  through a Redis server (``--shared-db``, rope.harness.shared_db);
* every comparison is appended to one record directory (rope.harness.report) as it happens, so when the
  deadline comes the running round is interrupted (SIGINT, as Ctrl-C: pytest stops cleanly) and
  nothing already checked is lost; the merged report, the case files and ``campaign.json``
  (examples per GPU and per second) are written at the end.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rope.harness import case_files, profiling, report, table_store
from rope.harness.atomic import atomic_write
from rope.harness.campaign_settings import CAMPAIGN_ENV, DATABASE_ENV, EXAMPLES_ENV, ROUNDS_ENV, SHARED_DATABASE_ENV
from rope.harness.suite import NOTHING_COMPARED_EXIT, suite_path

ROUNDS_PER_RUN = 8
# The suite's sub-packages a campaign searches by default, and the tests it leaves out there by
# marker: the prefill sizes (their float64 reference of a 16k-token batch holds gigabytes of host
# memory per worker, a campaign's many workers at once).
DEFAULT_TESTS = ("rotation", "position_step")
DEFAULT_SELECTION = "not prefill"
GRACE_S = 30.0                                 # after SIGINT, how long a round may take to wind down


def examples_schedule(max_examples: int, start: int = 20, factor: int = 4):
    """Examples per test for round 0, 1, 2, ...: start, start*factor, ... capped at max_examples."""
    n = min(start, max_examples)
    while True:
        yield n
        n = min(n * factor, max_examples)


@dataclass
class Run:
    """One pytest session of the campaign: its rounds' seeds and examples per test."""
    seeds: list[int]
    examples_per_test: list[int]
    exit_code: int | None = None
    wall_s: float = 0.0
    interrupted: bool = False
    log: str = ""


@dataclass
class Campaign:
    minutes: float
    devices: list[str]
    workers: str
    tests: list[str]
    out: str
    select: str | None = None      # a -m expression every session takes (the default tests' DEFAULT_SELECTION)
    runs: list[Run] = field(default_factory=list)
    wall_s: float = 0.0
    examples: int = 0
    failures: int = 0
    test_failures: bool = False     # a session's exit said a test failed (an interrupted one's cannot say)
    failed_tests: int = 0           # tests whose failure the records hold: an interrupted session's too
    per_device: dict = field(default_factory=dict)
    case_files: list[str] = field(default_factory=list)
    host: str = ""                  # the host's CPUs: most of a case's cost is host work (host_description)

    def to_dict(self) -> dict:
        return asdict(self)


def host_description(cpuinfo: str | None = None) -> str:
    """The host's CPUs, e.g. "16 CPUs (Intel(R) Xeon(R) Processor)": a campaign's rate is mostly host
    work (Hypothesis, building inputs, launches, compiles), so two GPUs of one kind on different hosts
    differ by up to twice; the rate is read with this beside it.  ``cpuinfo``: /proc/cpuinfo's text
    (read where there is one); no CUDA call, so the campaign's own process holds no GPU memory."""
    import platform
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 0
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.split(":", 1)[0].strip() == "model name" and ":" in line), "")
    model = " ".join(model.split()) or platform.processor() or platform.machine() or "unknown"
    return f"{count} CPUs ({model})"


def _pytest_command(c: Campaign, run: Run, extra: list[str], *, searches_only: bool = False) -> list[str]:
    """One session's pytest command.  ``searches_only``: only the Hypothesis tests (pytest's
    ``hypothesis`` marker): the fixed cases (known-bug triggers, real model configurations) are
    the same in every session, so the sessions after the first leave them out (unless the user's
    own ``-m`` says otherwise)."""
    cmd = [sys.executable, "-m", "pytest", *c.tests, "-q", "-p", "no:cacheprovider",
           "--hypothesis-profile=campaign", f"--hypothesis-seed={run.seeds[0]}"]
    own_marks = any(a == "-m" or a.startswith("-m") for a in extra)
    marks = [] if own_marks else [f"({c.select})"] if c.select else []
    if searches_only and not own_marks:
        marks.append("hypothesis")
    if marks:
        cmd += ["-m", " and ".join(marks)]
    if c.workers != "0":
        cmd += ["-n", c.workers]
    for d in c.devices:
        cmd += ["--rope-device", d]
    return cmd + extra


class RecordCounter:
    """Counts comparison records, and failed tests, as they are appended (reads only the new bytes of
    each file)."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.offsets, self.examples, self.failures, self.failed_tests = run_dir, {}, 0, 0, 0

    def poll(self) -> None:
        for path in self.run_dir.glob("*.jsonl"):
            start = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1       # a line still being written is read next time
            self.offsets[path] = start + end
            for line in chunk[:end].splitlines():
                if b'"kind": "comparison"' in line:
                    self.examples += 1
                    self.failures += b'"ok": false' in line
                elif b'"kind": "failure"' in line:
                    self.failed_tests += 1

    def failed_words(self) -> str:
        """The live line's failures: comparisons, and tests that failed outside them."""
        if not self.failed_tests:
            return f"{self.failures}"
        return (f"{self.failures} comparison{'s' if self.failures != 1 else ''} + {self.failed_tests} "
                f"test{'s' if self.failed_tests != 1 else ''}")


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C for the round's whole process group; harder signals if it does not wind down."""
    for sig, wait in ((signal.SIGINT, GRACE_S), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_campaign(minutes: float, *, devices: list[str] | None = None, workers: str = "auto",
                 tests: list[str] | None = None, out: Path | None = None, max_examples: int = 2000,
                 seed: int | None = None, pytest_args: list[str] | None = None, show_progress: bool = True,
                 shared_db: str | None = None) -> Campaign:
    if not minutes > 0:
        raise ValueError(f"minutes={minutes!r}: must be positive")
    if max_examples < 1:
        raise ValueError(f"max_examples={max_examples!r}: must be at least 1")
    from rope.devices import available_devices
    found = available_devices()
    if not devices:
        devices = [d for d in found if d != "cpu"] or ["cpu"]   # every GPU; the CPU where there is none
    out = Path(out or report.reports_dir() / "campaign")
    out.mkdir(parents=True, exist_ok=True)
    select = None if tests else DEFAULT_SELECTION
    tests = [str(suite_path(t)) if suite_path(t).exists() else t
             for t in (tests or DEFAULT_TESTS)]
    c = Campaign(minutes=minutes, devices=list(devices), workers=str(workers), tests=tests, out=str(out), select=select,
                 host=host_description())
    run_dir = report.reports_dir() / ".records" / f"campaign-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, CAMPAIGN_ENV: "1", report.RUN_ENV: str(run_dir), DATABASE_ENV: str(out / "hypothesis-db"),
           "PYTHONUNBUFFERED": "1"}
    env.pop(SHARED_DATABASE_ENV, None)
    if shared_db is not None:
        from rope.harness.shared_db import shared_database
        shared_database(shared_db)             # a bad URL or a missing redis package: before any round
        env[SHARED_DATABASE_ENV] = shared_db
    env.pop(report.DISABLE_ENV, None)
    rng = random.Random(seed)
    counter = RecordCounter(run_dir)
    start = time.monotonic()
    deadline = start + minutes * 60.0
    progress = _Progress(minutes * 60.0, devices) if show_progress else None
    schedule = examples_schedule(max_examples)
    # The workers' cos/sin tables, each built once on this host (rope.harness.table_store).
    tables = table_store.make_store()
    env[table_store.STORE_ENV] = str(tables)
    try:
        n = 0
        while time.monotonic() < deadline - 1.0:
            rounds = [(next(schedule), rng.randrange(2**32)) for _ in range(ROUNDS_PER_RUN)]
            run = Run(seeds=[s for _, s in rounds], examples_per_test=[e for e, _ in rounds],
                      log=str(out / f"session-{n:02d}.log"))
            c.runs.append(run)
            run_env = {**env, EXAMPLES_ENV: str(rounds[0][0]), ROUNDS_ENV: ",".join(f"{e}:{s}" for e, s in rounds)}
            began = time.monotonic()
            with open(run.log, "wb") as log:
                proc = subprocess.Popen(_pytest_command(c, run, list(pytest_args or []), searches_only=n > 0),
                                        env=run_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                while proc.poll() is None:
                    if time.monotonic() >= deadline:
                        run.interrupted = True
                        _stop(proc)
                        break
                    time.sleep(0.5)
                    counter.poll()
                    if progress:
                        progress.update(time.monotonic() - start, n, counter)
            run.exit_code, run.wall_s = proc.returncode, time.monotonic() - began
            # pytest: 0 passed, 1 some test failed; an interrupted session exits 2 and is not a failure.
            c.test_failures |= run.exit_code == 1 or (run.exit_code not in (0, 1, 2, 5) and not run.interrupted)
            n += 1
    finally:
        table_store.remove_store(tables)
        c.wall_s = time.monotonic() - start
        counter.poll()
        if progress:
            progress.update(c.wall_s, max(len(c.runs) - 1, 0), counter)
            progress.stop()
        _finish(c, run_dir, out)
    return c


def _finish(c: Campaign, run_dir: Path, out: Path) -> None:
    """The merged report, and campaign.json: examples per device and per second."""
    records = report.load_records(run_dir)
    report.write_report(records, out, run=run_dir.name)
    summary = json.loads((out / "summary.json").read_text())
    # A failure outside the comparisons (a test that raised: out of memory, an error in the harness) is a
    # failed test in the records, whatever the session's exit code: the last session is always stopped
    # at the deadline (exit 2), so its exit cannot say whether a test failed.
    c.examples, c.failures, c.failed_tests = summary["examples"], summary["failures"], summary["failed_tests"]
    wall = max(c.wall_s, 1e-9)
    c.per_device = {p["device"]: {"examples": p["examples"], "examples_per_s": round(p["examples"] / wall, 2),
                                  "workers": p["workers"]} for p in summary["placement"]}
    c.case_files = sorted({f for cell in summary["matrix"] for f in cell["case_files"]})
    data = c.to_dict()
    data["examples_per_s"] = round(c.examples / wall, 2)
    data["profile"] = summary.get("profile")
    atomic_write(out / "campaign.json", (json.dumps(data, indent=1) + "\n").encode())
    atomic_write(out / "campaign.md", markdown(data).encode())


def _failed_tests_words(data: dict) -> str:
    """What failed besides the comparisons, as the campaign's line goes on: tests failed (their causes in
    summary.md), or a session's exit that said so."""
    n = data.get("failed_tests", 0)
    if n:
        return f"; {n} test{'s' if n != 1 else ''} failed (causes: summary.md)"
    return "; some tests failed (see the session logs)" if data["test_failures"] else ""


def markdown(data: dict) -> str:
    lines = ["# rope-harness campaign", "",
             f"{data['minutes']} minutes on {', '.join(data['devices'])} with `-n {data['workers']}`: "
             f"{len(data['runs'])} pytest sessions, {data['examples']} comparisons against the float64 reference "
             f"({data['examples_per_s']}/s), {data['failures']} failed" + _failed_tests_words(data) + ".", ""]
    if data.get("host"):
        lines += [f"Host: {data['host']}. Most of a case's cost is the host's work, so a rate is read beside its "
                  f"host: the same GPU on another host may check half as many or twice as many.", ""]
    lines += ["| device | examples | examples/s | workers |", "|---|---:|---:|---|"]
    for device, p in data["per_device"].items():
        lines.append(f"| {device} | {p['examples']} | {p['examples_per_s']} | {report.worker_ranges(p['workers'])} |")
    lines += ["", "| session | rounds: examples per test | seeds | wall s | exit | interrupted |",
              "|---:|---|---|---:|---:|---|"]
    for i, r in enumerate(data["runs"]):
        lines.append(f"| {i} | {', '.join(map(str, r['examples_per_test']))} | {', '.join(map(str, r['seeds']))} | "
                     f"{r['wall_s']:.1f} | {r['exit_code']} | {'yes' if r['interrupted'] else ''} |")
    if data.get("profile"):
        lines += ["", "## Where the time went", "",
                  f"Summed over the {data['profile']['processes']} test processes of all sessions; "
                  f"{sum(r['wall_s'] for r in data['runs']):.0f} s of sessions:", ""]
        lines += profiling.markdown_rows(data["profile"])
    if data["case_files"]:
        lines += ["", "## Case files", ""] + [f"- `{f}`: replay with `{case_files.replay_command(f)}`" for f in data["case_files"]]
    lines += ["", "Matrix and plots: summary.md beside this file."]
    return "\n".join(lines) + "\n"


class _Progress:
    """Live line: time used of the budget, round, comparisons so far, failures, rate."""

    def __init__(self, budget_s: float, devices: list[str]):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        self.progress = Progress(TextColumn(f"[bold]campaign on {', '.join(devices)}"), BarColumn(),
                                 TextColumn("session {task.fields[session]}"),
                                 TextColumn("{task.fields[examples]} examples, {task.fields[rate]}/s"),
                                 TextColumn("[red]{task.fields[failures]} failed"), TimeElapsedColumn())
        self.progress.start()
        self.task = self.progress.add_task("campaign", total=budget_s, session=0, examples=0, rate="0", failures=0)

    def update(self, elapsed: float, session: int, counter: RecordCounter) -> None:
        self.progress.update(self.task, completed=elapsed, session=session,
                             examples=counter.examples, failures=counter.failed_words(),
                             rate=f"{counter.examples / max(elapsed, 1e-9):.1f}")

    def stop(self) -> None:
        self.progress.stop()


def add_campaign_parser(sub) -> None:
    p = sub.add_parser("campaign", help="a time-boxed hunt for mismatches across every GPU")
    p.add_argument("--minutes", type=float, required=True, help="the budget; the running round stops at the deadline")
    p.add_argument("--gpus", default="all", help="'all' (default) or comma-separated GPU indices, e.g. 0,1")
    p.add_argument("--device", action="append", default=[], help="device kinds or labels instead of --gpus (repeatable)")
    p.add_argument("--workers", default="auto", help="pytest-xdist workers (default auto: one per GPU plus CPU workers)")
    p.add_argument("--max-examples", type=int, default=2000, help="examples per test in the deepest round")
    p.add_argument("--seed", type=int, default=None, help="seed of the round seeds (default: random)")
    p.add_argument("--out", default=None, help="directory for the report (default reports/campaign)")
    p.add_argument("--tests", action="append", default=[],
                   help="test files or directories of the suite (default: its rotation and position_step "
                        "sub-packages, the prefill sizes left out)")
    p.add_argument("--shared-db", default=None, metavar="URL",
                   help="a Redis server campaigns on several hosts share their examples through "
                        "(redis://host:6379/0, rediss://..., unix:///path/redis.sock; pip install redis)")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    p.set_defaults(func=cmd_campaign)


def _devices_for(gpus: str) -> list[str]:
    from rope.devices import gpu_backend
    from rope.harness.placement import gpu_count
    kind = gpu_backend()
    if gpus == "all":
        return [kind] if kind else ["cpu"]
    if kind is None:
        raise ValueError(f"gpus={gpus!r}: no GPU here")
    try:
        indices = [int(g) for g in gpus.split(",")]
    except ValueError:
        raise ValueError(f"gpus={gpus!r}: must be 'all' or comma-separated GPU indices") from None
    bad = [i for i in indices if not 0 <= i < gpu_count(kind)]
    if bad:
        raise ValueError(f"gpus={gpus!r}: {bad} not among the {gpu_count(kind)} visible {kind} GPUs")
    return [f"{kind}:{i}" for i in indices]


def cmd_campaign(args) -> int:
    try:
        devices = args.device or _devices_for(args.gpus)
        c = run_campaign(args.minutes, devices=devices, workers=args.workers, tests=args.tests or None,
                         out=Path(args.out) if args.out else None, max_examples=args.max_examples, seed=args.seed,
                         pytest_args=args.pytest_args, shared_db=args.shared_db)
    except ValueError as exc:
        print(f"rope-harness campaign: {exc}", file=sys.stderr)
        return 2
    wall = max(c.wall_s, 1e-9)
    print(f"campaign: {c.examples} examples in {c.wall_s:.0f} s ({c.examples / wall:.1f}/s), {c.failures} failed, "
          f"{len(c.runs)} pytest sessions" + _failed_tests_words(c.to_dict()))
    for device, p in c.per_device.items():
        print(f"  {device}: {p['examples']} examples, {p['examples_per_s']}/s")
    print(f"  host: {c.host}")
    print(f"report: {Path(c.out) / 'campaign.md'} (summary.md, plots and case files beside it)")
    if c.failures or c.failed_tests or c.test_failures:
        return 1
    if not c.examples:
        print(f"campaign: FAILED: nothing compared, so nothing checked ({len(c.runs)} pytest sessions made no "
              f"comparison: every case unsupported or skipped, or no session reached a test; their logs: "
              f"{Path(c.out)}/session-*.log)")
        return NOTHING_COMPARED_EXIT
    return 0
