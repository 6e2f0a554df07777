"""The run report: every comparison a test makes is recorded, and at the end of a run the
records are merged into ``reports/summary.md`` + ``summary.json`` and PNG plots.

Safe under ``pytest -n auto``: each process appends JSON lines to its own file in the run's
record directory (one ``write`` per record, flushed, so a crashed worker loses nothing already
written); only the controller merges, and every report file is written atomically.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
import uuid
from collections import defaultdict
from pathlib import Path

from rope.harness.atomic import atomic_write
from rope.harness.output_dir import reports_dir
from rope.harness import case_files, causes, profiling
from rope.harness.suite import CHECKED_THINGS

RUN_ENV = "ROPE_REPORT_RUN"          # the record directory of the current run
DISABLE_ENV = "ROPE_NO_REPORT"       # set to skip recording (e.g. nested runs of deliberate mutants)


STALE_AFTER_S = 24 * 3600   # record directories of runs older than this are removed


def start_run() -> Path:
    """Create a fresh record directory and publish it to worker processes via the environment
    (xdist workers start after this and inherit it).  Directories of runs older than a day are
    removed; never younger ones, which may belong to a run still going on beside this one."""
    root = reports_dir() / ".records"
    run_dir = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ[RUN_ENV] = str(run_dir)
    now = time.time()
    for old in root.iterdir():
        try:
            if old.is_dir() and old != run_dir and now - old.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            continue
    return run_dir


def _record_file() -> Path | None:
    run = os.environ.get(RUN_ENV)
    if not run or os.environ.get(DISABLE_ENV):
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return Path(run) / f"{worker}-{os.getpid()}.jsonl"


# Comparisons this process made (a test's share goes on its report, for the progress bar of
# rope-harness check).
COMPARISONS = [0]


def record(**fields) -> None:
    """Append one record (a comparison, a skip, a failure) to this process's file.  A comparison
    is counted even where no report is written (the count says whether a test checked anything)."""
    record_many([fields])


def record_many(records: list[dict]) -> None:
    """:func:`record` of each of ``records``, in order, in one append (a batch's cases: one write
    instead of an open, a write and a close each)."""
    COMPARISONS[0] += sum(1 for r in records if r.get("kind") == "comparison")
    path = _record_file()
    if path is None or not records:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    data = b"".join((json.dumps(r if "worker" in r else {**r, "worker": worker}, default=float) + "\n").encode()
                    for r in records)
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:         # the run's folder not made yet (or removed): once more after making it
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, flags, 0o644)
        try:
            view = memoryview(data)
            while view:                   # a regular file takes it all at once; a short write goes on
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except OSError:   # the report is best effort: it never fails a test run
        pass


def record_comparison(*, test: str, impl: str, device: str, dtype: str, variant: str, comparison,
                      case_file: str | None = None, tokens: int | None = None) -> None:
    record(**comparison_fields(test=test, impl=impl, device=device, dtype=dtype, variant=variant,
                               comparison=comparison, case_file=case_file, tokens=tokens))


def comparison_fields(*, test: str, impl: str, device: str, dtype: str, variant: str, comparison,
                      case_file: str | None = None, tokens: int | None = None) -> dict:
    """The record :func:`record_comparison` appends (for :func:`record_many`)."""
    heat = None
    if not comparison.ok and comparison.bounds:
        heat = _heat_map(comparison)
    return dict(kind="comparison", test=test, impl=impl, device=device, dtype=dtype, variant=variant,
                ok=comparison.ok, worst_ratio=_finite(comparison.worst_ratio), mismatched=comparison.num_mismatched,
                elements=comparison.num_elements, problems=comparison.problems, case_file=case_file, heat=heat,
                tokens=tokens)


def record_exact_check(*, test: str, impl: str, device: str, what: str, ok: bool, elements: int,
                       problem: str | None = None, tokens: int | None = None) -> None:
    """One check held to exact equality (the position step's positions against the reference):
    a comparison record like a rotation's, so the matrix and a campaign's example count include it
    (dtype int64; the worst ratio is 0, or inf where a value differs)."""
    record(kind="comparison", test=test, impl=impl, device=device, dtype="int64", variant=what, ok=ok,
           worst_ratio=0.0 if ok else "inf", mismatched=0 if ok else None, elements=elements,
           problems=[problem] if problem else [], case_file=None, heat=None, tokens=tokens)


def _finite(x: float):
    return x if math.isfinite(x) else "inf"


def _heat_map(comparison) -> dict:
    """Max error/bound over tokens, per tensor: [heads][channels] (inf capped at 1e6 for plotting)."""
    import torch
    out = {}
    head_size = comparison.spec.head_size
    for name, err in comparison.errors.items():
        bound = comparison.bounds[name]
        ratio = torch.where(bound > 0, err / bound, torch.where(err == 0, 0.0, 1e6)).clamp(max=1e6)
        if ratio.numel() == 0:
            continue
        out[name] = ratio.reshape(ratio.shape[0], -1, head_size).amax(0).tolist()
    return out


def load_records(run_dir: Path) -> list[dict]:
    records = []
    for path in sorted(Path(run_dir).glob("*.jsonl")):
        records += load_records_file(path)
    return records


def load_records_file(path: Path) -> list[dict]:
    records = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue   # a torn last line of a crashed worker: keep everything before it
    return records


def summarize(records: list[dict]) -> dict:
    """Matrix implementation x device x dtype x variant, plus skips with reasons."""
    cells = defaultdict(lambda: {"examples": 0, "failures": 0, "worst_ratio": 0.0, "case_files": []})
    skips = defaultdict(int)
    rejected = defaultdict(int)                # (test, reason) -> Hypothesis draws rejected, over its copies
    declared = {}                              # (impl, device) -> switch token counts
    tokens = defaultdict(set)                  # (impl, device) -> token counts compared
    placed = defaultdict(lambda: {"examples": 0, "workers": set()})
    profiles = {}                              # process -> its last profile (recorded as it went, then at its end)
    # Tests that failed as expected (xfail: a pinned upstream mismatch): their comparisons are not
    # the run's failures; they are listed apart with the reason.
    expected = {r["test"]: r.get("reason", "") for r in records if r.get("kind") == "expected_failure"}
    expected_counts = defaultdict(lambda: [0, 0])          # test -> [comparisons, failed]
    failed_tests = []                          # each failed test with its cause (rope.harness.causes)
    compared = defaultdict(lambda: [0, 0])     # checked thing -> [comparisons, failed]
    for r in records:
        if r.get("kind") == "profile":
            profiles[r.get("process") or len(profiles)] = r     # one without a process name stands alone
            continue
        if r.get("kind") == "failure":
            failed_tests.append({k: v for k, v in r.items() if k not in ("kind", "worker")})
            continue
        if r.get("kind") == "skip":
            skips[(r.get("test", ""), skip_reason(r.get("reason", "")))] += 1
            continue
        if r.get("kind") == "rejected":
            rejected[(r.get("test", ""), r.get("reason", ""))] += int(r.get("draws", 0))
            continue
        if r.get("kind") == "switches":
            declared[(r["impl"], r["device"].split(":")[0])] = tuple(r["thresholds"])
            continue
        if r.get("kind") != "comparison":
            continue
        if r.get("test") in expected:
            expected_counts[r["test"]][0] += 1
            expected_counts[r["test"]][1] += 0 if r["ok"] else 1
            continue
        if r.get("tokens") is not None:
            tokens[(r["impl"], r["device"].split(":")[0])].add(r["tokens"])
        key = (r["impl"], r["device"], r["dtype"], r["variant"])
        compared[checked_thing(r)][0] += 1
        compared[checked_thing(r)][1] += 0 if r["ok"] else 1
        placed[r["device"]]["examples"] += 1
        placed[r["device"]]["workers"].add(r.get("worker", "main"))
        cell = cells[key]
        cell["examples"] += 1
        ratio = float("inf") if r["worst_ratio"] == "inf" else r["worst_ratio"]
        cell["worst_ratio"] = max(cell["worst_ratio"], ratio)
        if not r["ok"]:
            cell["failures"] += 1
            if r.get("case_file"):
                cell["case_files"].append(r["case_file"])
    matrix = [{"impl": k[0], "device": k[1], "dtype": k[2], "variant": k[3], **v,
               "worst_ratio": _finite(v["worst_ratio"])} for k, v in sorted(cells.items())]
    switches = []
    for (impl, device), thresholds in sorted(declared.items()):
        seen = tokens.get((impl, device), set())
        for t in thresholds:
            below = max((n for n in seen if n < t), default=None)
            above = min((n for n in seen if n >= t), default=None)
            switches.append({"impl": impl, "device": device, "switch": t, "below": below, "above": above,
                             "crossed": below is not None and above is not None})
    failed_by_thing = defaultdict(int)
    for f in failed_tests:
        failed_by_thing[checked_thing(f, default="other")] += 1
    totals = [{"thing": thing, "comparisons": compared[thing][0], "failed": compared[thing][1],
               "failed_tests": failed_by_thing[thing]}
              for thing in [*CHECKED_THINGS, "other"] if thing in compared or thing in failed_by_thing]
    examples, failures = sum(c["examples"] for c in cells.values()), sum(c["failures"] for c in cells.values())
    return {"verdict": "failed" if failures or failed_tests else "passed" if examples else "nothing compared",
            "totals": totals, "failed_tests": len(failed_tests),
            "matrix": matrix, "switches": switches,
            "skips": [{"test": t, "reason": why, "count": n} for (t, why), n in sorted(skips.items())],
            "rejected": [{"test": t, "reason": why, "draws": n} for (t, why), n in sorted(rejected.items())],
            "placement": [{"device": d, "examples": p["examples"], "workers": sorted(p["workers"], key=_worker_order)}
                          for d, p in sorted(placed.items())],
            "expected_failures": [{"test": t, "reason": expected[t], "comparisons": expected_counts[t][0],
                                   "failed": expected_counts[t][1]} for t in sorted(expected)],
            "causes": causes.group(failed_tests),
            "examples": examples, "failures": failures,
            "profile": profiling.combine(list(profiles.values()))}


def checked_thing(record: dict, *, default: str = "rotation") -> str:
    """The checked thing a record belongs to (rope.harness.suite.CHECKED_THINGS): a position
    step's or position ids' comparison by its variant, else the suite directory its test lives in
    (``properties/position_step/...``); a comparison of no such directory is a rotation's."""
    variant = str(record.get("variant") or "")
    if variant.startswith("positions-"):
        return "position_step"
    if variant.startswith("position-ids-"):
        return "position_ids"
    parts = str(record.get("test") or "").split("::", 1)[0].replace("\\", "/").split("/")
    return next((thing for thing in CHECKED_THINGS if thing in parts), default)


# What Hypothesis appends to the message of an exception raised in an example it replays (a skip
# raised in an @example's call: "Failing explicit example: test(...)" over many lines).
_HYPOTHESIS_APPENDIX = re.compile(r"\n\s*(Failing explicit example|Falsifying (explicit )?example|Trying example)")


def skip_reason(text: str) -> str:
    """A skip's reason on one line: pytest's ``Skipped:`` prefix and the example Hypothesis appends
    left out, the rest's whitespace collapsed (one table row per reason, however it was raised)."""
    text = str(text)
    appendix = _HYPOTHESIS_APPENDIX.search(text)
    text = causes.one_line(text[:appendix.start()] if appendix else text)
    return text[len("Skipped:"):].lstrip() if text.startswith("Skipped:") else text


def totals_line(summary: dict) -> str:
    """summary.md's second line: the verdict, then per checked thing its comparisons against the
    float64 reference and how many failed (``rotation: 830 comparisons, 94 failed; ...``)."""
    verdict = summary.get("verdict", "failed" if summary["failures"] else "passed" if summary["examples"]
                          else "nothing compared")
    parts = []
    for t in summary.get("totals", ()):
        label = t["thing"].replace("_", " ")
        if t["comparisons"]:
            parts.append(f"{label}: {t['comparisons']} comparison{'s' if t['comparisons'] != 1 else ''}, "
                         f"{t['failed']} failed")
        elif t["failed_tests"]:
            parts.append(f"{label}: {t['failed_tests']} test{'s' if t['failed_tests'] != 1 else ''} failed")
    line = f"**{verdict.capitalize()}.** " + ("; ".join(parts) if parts else
                                              "No comparison against the float64 reference was made")
    failed = summary.get("failed_tests", 0)
    if failed:
        n = len(summary.get("causes", ()))
        line += f"; {failed} test{'s' if failed != 1 else ''} failed, {n} cause{'s' if n != 1 else ''}"
    expected = len(summary.get("expected_failures", ()))
    if expected:
        line += f"; {expected} expected failure{'s' if expected != 1 else ''}, not counted"
    return line + "."


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _worker_order(name: str):
    return (0, int(name[2:])) if name.startswith("gw") and name[2:].isdigit() else (1, name)


# What the variant names of the table mean (rope.spec.RopeSpec.variant, the position step's rows).
VARIANT_LEGEND = ("Variants: `1d` 1-D RoPE; `chunkedN` sections in consecutive runs over N position rows "
                  "(`chunked3` M-RoPE, `chunked4` XD-RoPE, `chunked1` one row); `interleaved` Qwen3-VL's "
                  "interleaved map; `neox` / `gptj` the pairing, (i, i + rotary_dim/2) or (2i, 2i + 1); "
                  "`partial` rotary_dim < head_size (the rest passes through); `positions-Nrows` the "
                  "runner's position step with N rows.")


def markdown(summary: dict, plots: list[str]) -> str:
    """The report opens with the verdict: the title, the totals line, the causes of the failures
    (one item each, the sentence never cut, the replay command); the tables follow."""
    lines = ["# rope-harness run report", "", totals_line(summary)]
    if summary.get("causes"):
        lines += [""] + causes.markdown_lines(summary["causes"])
    if summary["matrix"]:
        lines += ["", "## Comparisons by variant", "",
                  "| implementation | device | dtype | variant | examples | worst error/bound | failures |",
                  "|---|---|---|---|---:|---:|---:|"]
    for c in summary["matrix"]:
        wr = c["worst_ratio"]
        wr = wr if isinstance(wr, str) else f"{wr:.3g}"
        lines.append(f"| {c['impl']} | {c['device']} | {c['dtype']} | {c['variant']} | {c['examples']} | {wr} | "
                     f"{c['failures']} |")
    if summary["matrix"]:
        lines += ["", VARIANT_LEGEND]
    if summary.get("expected_failures"):
        lines += ["", "## Expected failures", "",
                  "Pinned upstream mismatches (strict xfail): not counted above, and no case files.", "",
                  "| test | comparisons | failed | why |", "|---|---:|---:|---|"]
        lines += [f"| {e['test']} | {e['comparisons']} | {e['failed']} | {_cell(causes.one_line(e['reason']))} |"
                  for e in summary["expected_failures"]]
    if summary.get("placement"):
        lines += ["", "## Where it ran", "", "| device | examples | workers |", "|---|---:|---|"]
        lines += [f"| {p['device']} | {p['examples']} | {worker_ranges(p['workers'])} |" for p in summary["placement"]]
    if summary.get("switches"):
        lines += ["", "## Declared path switches", "",
                  "Token counts where an implementation declares it changes path (`switch_tokens`), and the "
                  "compared token counts nearest below and at or above each.", "",
                  "| implementation | device | switch at | nearest below | nearest at/above | crossed |",
                  "|---|---|---:|---:|---:|---|"]
        lines += [f"| {s['impl']} | {s['device']} | {s['switch']} | {s['below'] if s['below'] is not None else '-'} | "
                  f"{s['above'] if s['above'] is not None else '-'} | {'yes' if s['crossed'] else '**no**'} |"
                  for s in summary["switches"]]
    if summary["skips"]:
        lines += ["", "## Skipped", "", "| test | reason | count |", "|---|---|---:|"]
        lines += [f"| {s['test']} | {_cell(skip_reason(s['reason']))} | {s['count']} |" for s in summary["skips"]]
    if summary.get("rejected"):
        lines += ["", "## Draws rejected", "",
                  "Hypothesis draws the implementation does not run (unsupported, a known fault, or a known "
                  "defect the run avoids), summed over the test's copies; the search went on with the others.", "",
                  "| test | reason | draws |", "|---|---|---:|"]
        lines += [f"| {s['test']} | {_cell(causes.one_line(s['reason']))} | {s['draws']} |" for s in summary["rejected"]]
    if summary.get("profile"):
        lines += ["", "## Where the time went", "",
                  f"Summed over {summary['profile']['processes']} test processes "
                  f"({summary['profile']['calls']} implementation calls):", ""]
        lines += profiling.markdown_rows(summary["profile"])
    if summary.get("causes"):
        lines += [""] + causes.markdown_detail_lines(summary["causes"])
    # Case files no failed test names (a worker that crashed before its report came back).
    named = {Path(f["case_file"]).name for g in summary.get("causes", ()) for f in [g["representative"], *g["others"]]
             if f.get("case_file")}
    orphans = {f: c["impl"] for c in summary["matrix"] for f in c["case_files"] if Path(f).name not in named}
    if orphans:
        lines += ["", "## Other case files", ""] + [f"- `{f}`: replay with `{case_files.replay_command(f, orphans[f])}`"
                                                    for f in sorted(orphans)]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def worker_ranges(workers: list[str]) -> str:
    """``gw0, gw1, gw2, gw5`` -> ``gw0-gw2, gw5`` (a 128-worker run stays one line)."""
    out, run = [], []
    for w in workers + [None]:
        n = int(w[2:]) if w and w.startswith("gw") and w[2:].isdigit() else None
        if n is not None and run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"gw{run[0]}" if len(run) == 1 else f"gw{run[0]}-gw{run[-1]}")
        run = [n] if n is not None else []
        if w is not None and n is None:
            out.append(w)
    return ", ".join(out)


def _png(fig) -> bytes:
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def plots(records: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    by_impl = defaultdict(list)
    for r in records:
        if r.get("kind") == "comparison":
            ratio = 1e6 if r["worst_ratio"] == "inf" else r["worst_ratio"]
            by_impl[f"{r['impl']} ({r['device']})"].append(max(ratio, 1e-6))
    if by_impl:
        fig, ax = plt.subplots(figsize=(7, 4))
        bins = [10 ** (e / 4) for e in range(-24, 25)]
        for name, ratios in sorted(by_impl.items()):
            ax.hist(ratios, bins=bins, histtype="step", label=f"{name}: {len(ratios)}")
        ax.axvline(1.0, color="r", linestyle="--", label="bound")
        ax.set_xscale("log")
        ax.set_xlabel("worst error / bound per example (exact results drawn at 1e-6)")
        ax.set_ylabel("examples")
        ax.set_title("Error relative to the per-element bound")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / "error_bound.png"
        atomic_write(path, _png(fig))
        plt.close(fig)
        written.append(path)
    failures = [r for r in records if r.get("kind") == "comparison" and not r["ok"] and r.get("heat")]
    for i, r in enumerate(failures[:12]):
        tensors = list(r["heat"].items())
        fig, axes = plt.subplots(1, len(tensors), figsize=(6 * len(tensors), 3.5), squeeze=False)
        for ax, (name, grid) in zip(axes[0], tensors):
            import numpy as np
            data = np.log10(np.maximum(np.array(grid, dtype=float), 1e-3))
            im = ax.imshow(data, aspect="auto", cmap="magma", vmin=-3, vmax=6, interpolation="nearest")
            ax.set_xlabel("channel")
            ax.set_ylabel("head")
            ax.set_title(f"{name}: log10 max error/bound")
            fig.colorbar(im, ax=ax)
        fig.suptitle(f"{r['impl']} on {r['device']} {r['dtype']} {r['variant']}", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"failure_{i:02d}_heatmap.png"
        atomic_write(path, _png(fig))
        plt.close(fig)
        written.append(path)
    return written


def write_summary(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Merge the run's records into summary.json, summary.md, records.jsonl and plots; returns
    the paths (summary.md first)."""
    return write_report(load_records(run_dir), out_dir, run=Path(run_dir).name)


def write_report(records: list[dict], out_dir: Path | None = None, *, run: str | list[str] = "") -> list[Path]:
    out_dir = Path(out_dir or reports_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(records)
    summary["run"] = run
    plot_paths = plots(records, out_dir)
    # The raw records travel with the report, so reports of several runners can be merged.
    atomic_write(out_dir / RECORDS_FILE, "".join(json.dumps(r) + "\n" for r in records).encode())
    atomic_write(out_dir / "summary.json", json.dumps(summary, indent=1).encode())
    atomic_write(out_dir / "summary.md", markdown(summary, [str(p) for p in plot_paths]).encode())
    return [out_dir / "summary.md", out_dir / "summary.json", out_dir / RECORDS_FILE, *plot_paths]


RECORDS_FILE = "records.jsonl"


def merge(inputs: list[Path], out_dir: Path) -> list[Path]:
    """One report from the reports of several runners or hosts (``pytest --rope-shard I/N`` on
    each, then ``rope-harness merge OUT DIR...``): the records are concatenated, the case files
    copied (the same id is the same mismatch), and the summary and plots rebuilt."""
    out_dir = Path(out_dir)
    records, runs = [], []
    for directory in map(Path, inputs):
        source = directory / RECORDS_FILE
        if not source.is_file():
            raise ValueError(f"input={str(directory)!r}: no {RECORDS_FILE} (a reports/ directory of a finished run)")
        for r in load_records_file(source):
            if r.get("case_file"):   # point into the merged cases/ directory
                r["case_file"] = str(out_dir / "cases" / Path(r["case_file"]).name)
            records.append(r)
        previous = directory / "summary.json"
        if previous.is_file():
            try:
                run = json.loads(previous.read_text()).get("run")
                runs += run if isinstance(run, list) else [run]
            except json.JSONDecodeError:
                pass
        cases = directory / "cases"
        if cases.is_dir():
            (out_dir / "cases").mkdir(parents=True, exist_ok=True)
            for case in sorted(cases.glob("*.json")):
                target = out_dir / "cases" / case.name
                if not target.exists():
                    atomic_write(target, case.read_bytes())
    return write_report(records, out_dir, run=runs)
