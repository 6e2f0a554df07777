"""``rope-harness``: the command-line entry point.

    rope-harness check [--device D ...] [--impl NAME ...] [--position-step-impl NAME ...]
                       [--position-ids-impl NAME ...] [--profile dev|ci|deep] [-- PYTEST ARGS]
        Run the equivalence suite (every implementation against the float64 reference) on every
        available device, in parallel workers, and print the outcome.
    rope-harness bench [--device cuda] [--models K,...] [--tokens N,...] [--dtype bfloat16,...] [--only C,...] [--fused]
        Race the rotation kernels against the installed peers (vLLM, Liger, SGLang, FlashInfer,
        torch.compile) and time the position kernels, against the measured copy bandwidth; writes
        reports/bench.json, bench.md and bench.png.
    rope-harness devices
        List the devices found and whether Triton runs on each, then the software stack (Python,
        torch, Triton, transformers, Liger) and whether each version is supported.
    rope-harness mutants [--only NAME] [--no-baseline] [--jobs N] [--profile ci|dev]
        Run the property suite (and the serving-engine-style baseline) against every known-bug
        mutant; report caught or not, suite seconds to the first failure and the counterexample.
    rope-harness repro CASE [--device D] [--impl NAME]
        Replay a mismatch case file (reports/cases/<id>.json): exit 0 once it matches, 1 while not.
    rope-harness campaign --minutes N [--gpus all|0,1] [--workers auto] [--max-examples 2000]
        A time-boxed hunt across every GPU: rounds of ever deeper Hypothesis runs through
        pytest-xdist, one shared example database, stopped cleanly at the deadline; writes
        reports/campaign/ (campaign.md/json with examples per GPU and per second, the merged report).
    rope-harness merge OUT DIR [DIR ...]
        One report from the reports/ directories of several runners or hosts (pytest --rope-shard I/N).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest

from rope.harness.suite import COMPARISONS_PROPERTY
from rope.harness.suite import NOTHING_COMPARED_EXIT, suite_dir


def checked_things(args) -> list[str]:
    """What a check covers: the checked things whose implementations are named (``--impl``:
    rotation, ``--position-step-impl``: position_step, ``--position-ids-impl``: position_ids), so
    that ``check --impl mine`` checks mine only; with none named, every checked thing of the
    built-ins, the platform dispatch included."""
    from rope.harness.suite import CHECKED_THINGS
    named = [thing for thing, given in (("rotation", args.impl), ("position_step", args.positions_impl),
                                        ("position_ids", args.position_ids_impl), ("table", args.table_impl))
             if given]
    if args.fused_impl:
        named.append("fused")
    return named or list(CHECKED_THINGS)


def _selection(args) -> list[str]:
    """The suite's tests a check runs: every test that takes an implementation of a checked thing,
    selected by the markers the plugin sets, prefill sizes and the regression corpus included;
    --all: everything."""
    tests = [str(suite_dir())]
    if args.all:
        return tests
    return tests + ["-m", " or ".join(checked_things(args))]


def _pytest_args(args) -> list[str]:
    files = _selection(args)
    # No cache provider: the suite may live in site-packages, which is no place for .pytest_cache.
    # The command imported rope before pytest started, so pytest cannot rewrite its asserts (it
    # needs not: the suite's are rewritten); say nothing of it.
    # The bar draws the progress: pytest's percentages stay out (classic style; the bar blanks the letters).
    # The failures are listed by cause at the end (rope.harness.causes), and the skips in the report:
    # pytest's short summary keeps the errors only.
    out = files + ["-qq", "-rE", "-p", "no:cacheprovider", f"--hypothesis-profile={args.profile}", "-o",
                   "console_output_style=classic",
                   "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if args.workers != "0":
        out += ["-n", args.workers]
    # Every device found, named: the main job checks the CPU beside a GPU (a plain GPU-box pytest run
    # leaves the CPU's parametrizations to CPU CI; naming the CPU keeps them).
    from rope.devices import available_devices
    for d in args.device or available_devices():
        out += ["--rope-device", d]
    for name in args.impl:
        out += ["--rope-impl", name]
    for name in args.positions_impl:
        out += ["--rope-position-step-impl", name]
    for name in args.position_ids_impl:
        out += ["--rope-position-ids-impl", name]
    for name in args.table_impl:
        out += ["--rope-table-impl", name]
    for name in args.fused_impl:
        out += ["--rope-fused-impl", name]
    return out + list(args.pytest_args)


PROGRESS_EVERY_S = 30.0         # a log's progress line: at least this often ($ROPE_PROGRESS_EVERY_S)


class ProgressBar:
    """A pytest plugin showing the check's progress (xdist-aware: the controller sees every
    worker's reports): tests done of all, the comparisons they made and how many failed, the time
    spent and the time left.  On a terminal a rich progress bar; in a log (CI, ``| tee``), where a
    bar would print once at the end, a progress line every PROGRESS_EVERY_S seconds from a
    background thread, so a long test does not silence it.  pytest's own progress letters are left
    out."""

    def __init__(self, every_s: float | None = None):
        import os
        from collections import Counter

        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)
        self.console = Console()
        self.live = self.console.is_terminal
        if not self.live:                    # a log: the whole line, not the 80 columns of no terminal
            self.console = Console(width=160)
        self.progress = Progress(TextColumn("[bold]checking"), BarColumn(bar_width=24), MofNCompleteColumn(),
                                 TextColumn("tests, {task.fields[comparisons]} comparisons, "
                                            "{task.fields[failed]} failed,"),
                                 TimeElapsedColumn(), TextColumn("spent,"), TimeRemainingColumn(), TextColumn("left"),
                                 console=self.console, transient=False, auto_refresh=self.live)
        self.task = None
        self.outcomes = Counter()       # each test's outcome: passed, failed, skipped
        self.comparisons = 0            # made by the tests so far
        self.every_s = every_s or float(os.environ.get("ROPE_PROGRESS_EVERY_S") or PROGRESS_EVERY_S)
        self._stop = None               # the log's ticker: a threading.Event set at the end
        self._started = None

    def _start(self, total: int) -> None:
        if self.task is not None:
            return
        import threading
        import time
        self.task = self.progress.add_task("check", total=total, failed=0, comparisons=0)
        self._started = time.monotonic()
        if self.live:
            self.progress.start()
            return
        self._stop = threading.Event()
        threading.Thread(target=self._tick, name="rope-harness-progress", daemon=True).start()

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            self.console.print(self.log_line(), highlight=False, markup=False)

    def log_line(self) -> str:
        """The progress as one plain line: done of all tests, comparisons, failures, time spent and left."""
        import time
        task = self.progress.tasks[0]
        spent = time.monotonic() - self._started
        done = int(task.completed)
        left = f"{_clock(spent / done * (task.total - done))} left" if done and task.total else "time left unknown"
        return (f"checking: {done}/{int(task.total or 0)} tests, {self.comparisons} comparisons, "
                f"{self.outcomes['failed']} failed, {_clock(spent)} spent, {left}")

    def pytest_collection_finish(self, session):
        self._start(len(session.items))

    def pytest_xdist_node_collection_finished(self, node, ids):
        self._start(len(ids))

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report, config):
        """The bar shows progress: pytest's letters (dots) would draw into it."""
        result = yield
        if isinstance(result, tuple) and len(result) == 3:
            return result[0], "", result[2]
        return result

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes["failed" if report.failed else report.outcome] += 1
        for name, value in getattr(report, "user_properties", ()):
            if name == COMPARISONS_PROPERTY:
                self.comparisons += value
        if self.task is None:
            return
        self.progress.update(self.task, failed=self.outcomes["failed"], comparisons=self.comparisons)
        if report.when == "teardown":
            self.progress.advance(self.task)

    def pytest_sessionfinish(self, session):
        if self.task is None:
            return
        if self.live:
            self.progress.stop()
            return
        self._stop.set()
        self.console.print(self.log_line(), highlight=False, markup=False)


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _import_named(args) -> str | None:
    """Import every implementation the command names before any test runs: the first that cannot
    be imported is the one line returned (the module, the directories searched, the fix)."""
    from rope.harness.position_ids.implementations import get_position_ids_implementation
    from rope.registry import get_implementation, get_positions_implementation, get_table_implementation
    for option, names, get in (("--table-impl", args.table_impl, get_table_implementation),
                               ("--impl", args.impl, get_implementation),
                               ("--position-step-impl", args.positions_impl, get_positions_implementation),
                               ("--position-ids-impl", args.position_ids_impl, get_position_ids_implementation)):
        for name in names:
            try:
                get(name)
            except ValueError as exc:
                return f"{option}: {exc}"
    from rope.registry import get_fused_implementation
    for name in args.fused_impl:
        try:
            get_fused_implementation(name)
        except ValueError as exc:
            return f"--fused-impl: {exc}"
    return None


EXIT_USAGE = 2                  # the command could not start: a bad argument, an implementation not importable


def cmd_check(args) -> int:
    import pytest

    from rope.devices import available_devices
    from rope.harness.suite import COMPARED_PLUGIN_NAME
    devices = args.device or available_devices()
    named = [*args.impl, *args.positions_impl, *args.position_ids_impl, *args.table_impl]
    named += args.fused_impl
    unimportable = _import_named(args)
    if unimportable:
        print(f"rope-harness check: {unimportable}", file=sys.stderr)
        return EXIT_USAGE
    things = "all" if args.all else ", ".join(checked_things(args)).replace("_", " ")
    print(f"rope-harness check: {things}; devices {', '.join(devices)}; implementations "
          f"{', '.join(named) if named else 'all built-in'}; profile {args.profile}", flush=True)
    started, began = time.perf_counter(), time.time()
    bar = ProgressBar()
    verdicts = []

    class _KeepVerdict:
        @pytest.hookimpl(trylast=True)
        def pytest_configure(self, config):
            verdicts.append(config.pluginmanager.get_plugin(COMPARED_PLUGIN_NAME))

    code = int(pytest.main(_pytest_args(args), plugins=[bar, _KeepVerdict()]))
    from rope.harness.report import reports_dir
    verdict = next((v for v in verdicts if v is not None), None)
    collect_only = any(a in ("--collect-only", "--co") for a in args.pytest_args)
    summary = reports_dir() / "summary.json"
    print(closing_line(code, bar.outcomes, summary if _written_since(summary, began) else None,
                       time.perf_counter() - started, comparisons=bar.comparisons,
                       nothing_compared=getattr(verdict, "reason", None),
                       collected=bar.progress.tasks[0].total if bar.task is not None else 0, collect_only=collect_only))
    return code


def _written_since(path: Path, since: float) -> bool:
    """Whether ``path`` was written by this run (a report turned off leaves an older one in place)."""
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def closing_line(code: int, outcomes, summary_json: Path | None, seconds: float, *, comparisons: int | None = None,
                 nothing_compared: str | None = None, collected: float | None = 0, collect_only: bool = False) -> str:
    """The run's last line: the verdict, the tests' outcomes, the comparisons (the report's count,
    with its failures; the tests' own count where this run wrote no report) and the time.  A run
    that compared nothing never says "matches": it names why."""
    if collect_only:
        return (f"rope-harness check: collected only, nothing run: {int(collected or 0)} tests would run "
                f"in {seconds:.0f} s")
    if nothing_compared is not None:
        verdict = f"FAILED: nothing compared, so nothing checked ({nothing_compared})"
    elif code == NOTHING_COMPARED_EXIT:
        verdict = "FAILED: no test selected, so nothing checked"
    elif code == 0:
        verdict = "every implementation checked matches the reference"
    else:
        verdict = f"FAILED (pytest exit code {code}); see the failures above and the report"
    counts = f"{outcomes['passed']} passed, {outcomes['failed']} failed, {outcomes['skipped']} skipped"
    try:
        data = json.loads(summary_json.read_text())
        counts += f"; {data['examples']} comparisons, {data['failures']} failed"
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        if comparisons is not None:
            counts += f"; {comparisons} comparisons (no report written)"
    return f"rope-harness check: {verdict} ({counts}) in {seconds:.0f} s"


def cmd_bench(args) -> int:
    from rope.harness import bench, bench_report
    from rope.devices import available_devices
    device = args.device or available_devices()[-1]
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else None    # None: the device's
    models = tuple(args.models.split(",")) if args.models else None                      # None: the device's
    dtypes = tuple(args.dtype.split(","))
    only = tuple(args.only.split(",")) if args.only else bench.CONTENDERS
    unknown = sorted(set(only) - set(bench.CONTENDERS))
    if unknown:
        print(f"rope-harness bench: --only: unknown contender(s) {', '.join(unknown)} "
              f"(known: {', '.join(bench.CONTENDERS)})", file=sys.stderr)
        return 2
    data = bench.run(models=models, tokens=tokens, dtypes=dtypes, device=device, extra_impls=args.impl,
                     positions=() if args.no_positions else None, only=only)
    if args.fused:
        from rope.harness import bench_fused
        data["fused"] = bench_fused.run_fused(models=models, tokens=tokens, device=device,
                                              copy_gbps=data["copy_gbps"])
    from rope.harness.report import reports_dir
    for path in bench_report.write_reports(data, Path(args.out) if args.out else reports_dir()):
        print(f"wrote {path}")
    return 0


def cmd_merge(args) -> int:
    from rope.harness import report
    try:
        paths = report.merge([Path(p) for p in args.inputs], Path(args.out))
    except ValueError as exc:
        print(f"rope-harness merge: {exc}", file=sys.stderr)
        return 2
    summary = json.loads(paths[1].read_text())
    print(f"merged {len(args.inputs)} reports: {summary['examples']} comparisons, {summary['failures']} failed")
    print(f"report: {paths[0]}")
    return 1 if summary["failures"] else 0


def cmd_devices(args) -> int:
    from rope.devices import available_devices, is_interpreter, triton_runs_on
    from rope.harness.stack import describe, stack
    for d in available_devices():
        note = " (Triton interpreter)" if d == "cpu" and is_interpreter() else ""
        print(f"{d}: triton {'yes' if triton_runs_on(d) else 'no'}{note}")
    print("stack found:")
    for line in describe(stack()):
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rope-harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run the equivalence suite on every available device")
    check.add_argument("--device", action="append", default=[], help="restrict to this device (repeatable)")
    check.add_argument("--impl", action="append", default=[], help="implementation name or module:callable (repeatable)")
    check.add_argument("--position-step-impl", "--positions-impl", action="append", default=[], metavar="NAME",
                       dest="positions_impl",
                       help="the runner's position step (name or module:callable; repeatable; alias: "
                            "--positions-impl)")
    check.add_argument("--position-ids-impl", action="append", default=[], metavar="NAME",
                       help="position-id implementation: transformers, vllm, sglang or module:callable (repeatable)")
    check.add_argument("--table-impl", action="append", default=[], metavar="NAME",
                       help="cos/sin table implementation: ours, transformers, vllm, sglang or module:callable (repeatable)")
    check.add_argument("--fused-impl", action="append", default=[], metavar="NAME",
                       help="fused-op implementation: triton, unfused or module:callable declaring fused_op (repeatable)")
    check.add_argument("--profile", default="dev", choices=["dev", "ci", "deep"], help="Hypothesis profile")
    check.add_argument("--workers", default="auto", help="pytest-xdist workers ('0' for none)")
    check.add_argument("--all", action="store_true", help="run the whole property suite, not only the equivalence suite")
    check.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    check.set_defaults(func=cmd_check)
    bench = sub.add_parser("bench", help="time the kernels against the memory floor")
    bench.add_argument("--device", default=None, help="device to time on (default: the GPU, else cpu)")
    bench.add_argument("--models", default=None, help="comma-separated models.yaml keys")
    bench.add_argument("--tokens", default=None, help="comma-separated token counts (default 1,16,256,4096,16384,65536 "
                       "on a GPU, 1,16,256 on the CPU)")
    bench.add_argument("--only", default=None, help="comma-separated contenders to race (default all installed: "
                       "triton, triton-public, vllm-cuda, liger, liger-pregathered, sglang-triton, flashinfer, "
                       "torch-compile, native, transformers)")
    bench.add_argument("--dtype", default="bfloat16", help="comma-separated dtypes (bfloat16, float16, float32)")
    bench.add_argument("--impl", action="append", default=[], help="extra implementation (module:callable)")
    bench.add_argument("--no-positions", action="store_true", help="skip the position-step kernels")
    bench.add_argument("--fused", action="store_true",
                       help="also race the fused ops (QK-norm + RoPE, RoPE + KV-cache write) against the unfused "
                            "sequence and the memory floor of their bytes")
    bench.add_argument("--out", default=None, help="directory for bench.json/.md/.png (default ./reports)")
    bench.set_defaults(func=cmd_bench)
    devices = sub.add_parser("devices", help="list the devices found and the software stack, and whether it is supported")
    devices.set_defaults(func=cmd_devices)
    from rope.harness.repro import add_repro_parser
    add_repro_parser(sub)
    from rope.harness.mutation import add_mutants_parser
    add_mutants_parser(sub)
    from rope.harness.campaign import add_campaign_parser
    add_campaign_parser(sub)
    merge = sub.add_parser("merge", help="merge the reports of several runners or hosts")
    merge.add_argument("out", help="directory for the merged report")
    merge.add_argument("inputs", nargs="+", help="reports/ directories (each with records.jsonl, cases/)")
    merge.set_defaults(func=cmd_merge)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import rope  # noqa: F401  (Triton interpreter switch before any kernel import)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
