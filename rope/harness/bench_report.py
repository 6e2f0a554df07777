"""``rope-harness bench``'s reports: the JSON a run returns (rope.harness.bench.run) written as
bench.json, rendered as bench.md (the race, every contender) and drawn as bench.png.  Rendering
reads the JSON only, so a committed report is re-rendered from its JSON and compared
(tests/harness/test_generated_tables.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rope.harness.atomic import atomic_write
from rope.harness.bench import COPY_QUOTED_FROM, HOST_CALLS, HOST_ROUNDS
from rope.triton.rotary import ONE_WAVE_TOKENS, PDL_MAX_TOKENS

__all__ = ["floor_race_markdown", "markdown", "plot", "race_markdown", "write_reports"]


def write_reports(data: dict, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    paths = [out_dir / "bench.json", out_dir / "bench.md", out_dir / "bench.png"]
    atomic_write(paths[0], json.dumps(data, indent=1).encode())
    atomic_write(paths[1], markdown(data).encode())
    atomic_write(paths[2], plot(data))
    return paths


def _pdl_note(data: dict) -> str:
    pdl = data.get("empty_launch_pdl_ms", float("nan"))
    if pdl != pdl:                      # NaN: no PDL on this device
        return ""
    return (f" ({pdl * 1e3:.1f} us launched with programmatic dependent launch, as the Triton rotation "
            f"is up to {PDL_MAX_TOKENS} tokens and from {ONE_WAVE_TOKENS[0]} to {ONE_WAVE_TOKENS[1]} here)")


def _us(ms: float) -> str:
    return "-" if ms != ms else f"{ms * 1e3:.1f}"


def race_markdown(data: dict) -> list[str]:
    """Our unchecked launch against the fastest peer, per model and size: under the timer, then
    launched from Python with the host's time per call."""
    if not data.get("race"):
        if data["device"] == "cpu":
            return ["Our Triton kernels run under the interpreter here: checked, not raced. "
                    "`rope-harness bench --device cuda` races them.", ""]
        return []
    if any("floor_ms" in r for r in data["race"]):
        return floor_race_markdown(data)
    lines = ["## Ours against the fastest peer", "",
             "`triton` (our unchecked launch) against the fastest other contender whose output passed its "
             "check, at each size: below 1 we are faster.", "",
             "| model | tokens | dtype | ours (us) | fastest peer | its time (us) | ours / peer |",
             "|---|---:|---|---:|---|---:|---:|"]
    for r in data["race"]:
        lines.append(f"| {r['model']} | {r['tokens']} | {r['dtype']} | {_us(r['ours_ms'])} | {r['best_peer']} | "
                     f"{_us(r['best_peer_ms'])} | {r['ratio']:.2f} |")

    def copied(r):
        ms = r.get("copy_eager_ms", math.nan)
        return [_us(ms), f"{100 * r['copy_eager_frac']:.1f}" if ms == ms else "-"]
    lines += _eager_table(data, "Eager: `triton.testing.do_bench` (each call launched from Python after its L2 flush, "
                          "median), ours unchecked against the fastest peer's; % of copy of ours; the same bytes moved "
                          "by a device copy under the same timer (`same_bytes_copy`: half read, half written), what "
                          "the flush leaves any kernel of this size.",
                          [("% of copy", "---:", lambda r: [f"{100 * r['ours_eager_frac']:.1f}"]),
                           ("same bytes copied (us) | its % of copy", "---:|---:", copied)])
    return lines + [""]


def _eager_table(data: dict, intro: str, middle) -> list[str]:
    """The race launched from Python, one row per model and size: ours eagerly, then ``middle``'s
    columns ((headers, alignments, cells of a row) each, ``|``-joined), the fastest peer eagerly and
    the host's time per call of ours and of each peer; [] where nothing was timed eagerly."""
    eager = [r for r in data["race"] if "eager_ratio" in r]
    if not eager:
        return []
    peers = sorted({name for r in eager for name in r["peers_host_us"]})
    lines = ["", "## Launched from Python, and the host's time per call", "",
             intro + "  Host: microseconds of the host per call, "
             f"{HOST_CALLS} calls back to back ({HOST_ROUNDS} rounds in which the contenders of a row take turns, "
             "the median): ours unchecked, the public entry, the same kernel through Triton's own "
             "`kernel[grid](...)` (`triton-bare`), and each peer.", "",
             "| model | tokens | ours eager (us) | " + " | ".join(h for h, _, _ in middle)
             + " | fastest peer | its time (us) | ours / peer | host: ours | public | bare | " + " | ".join(peers) + " |",
             "|---|---:|---:|" + "".join(a + "|" for _, a, _ in middle) + "---|---:|---:|---:|---:|---:|"
             + "---:|" * len(peers)]
    for r in eager:
        cells = [c for _, _, row_cells in middle for c in row_cells(r)]
        lines.append(f"| {r['model']} | {r['tokens']} | {_us(r['ours_eager_ms'])} | " + " | ".join(cells)
                     + f" | {r['best_eager_peer']} | {_us(r['best_eager_peer_ms'])} | {r['eager_ratio']:.2f} | "
                     + " | ".join(_host_cells(r, peers)) + " |")
    return lines


def _host_cells(r: dict, peers: list[str]) -> list[str]:
    """A race row's host times: ours unchecked, public and bare, then each peer's ('-' where not timed)."""
    host = r["host_us"]
    cells = [f"{host[name]:.1f}" if name in host else "-" for name in ("triton", "triton-public", "triton-bare")]
    return cells + [f"{r['peers_host_us'][name]:.1f}" if name in r["peers_host_us"] else "-" for name in peers]


def _frac(r: dict, key: str) -> str:
    return f"{r[key]:.3f}" if key in r else "-"


# The floor as measured: the same-bytes streams, the channels-only stream beside them, or (older
# runs) the channels-only stream as the floor.
_SAME_BYTES_FLOOR = ("the fastest stream that moves a rotation's bytes in its pattern and does nothing else "
                     "(`rope/harness/bench_floor.py`; floor / ours of 1: as fast as the floor): the rotation "
                     "kernel with its STREAM switch on (`kernel`: the rotation's plan, each pair stored back as "
                     "x1 * cos, x2 * sin; `kernel,block_t=N`: N tokens a program) or a gathering stream written "
                     "apart from it (`tile=TxH`); beside it the fastest stream over the rotated channels of q and k "
                     "alone (`mul_`, `rows=R`), which moves fewer bytes (no positions, no cos/sin) and is never the "
                     "floor")
_STREAM_FLOOR = ("the fastest stream that moves the rotated channels of q and k in place and does nothing else "
                 "(`rope/harness/bench_floor.py`; floor / ours of 1: as fast as the stream)")


def floor_race_markdown(data: dict) -> list[str]:
    """The race where each row's in-place floor was measured: every contender of a row timed the
    same way (one chain mode under the graph timer, the flushed timer eagerly), ours against the
    fastest peer and against the floor; the 1 GiB copy quoted from COPY_QUOTED_FROM tokens only."""
    chained = any(r.get("ours_chain") == "no overlap" for r in data["race"])
    same_bytes = any("channels_ms" in r for r in data["race"])
    chain = ("every call of the chain waits for the one before (ours launched without programmatic dependent "
             "launch, as no peer overlaps its calls either; ours with it, its calls overlapping, in the last column)"
             if chained else "every call of the chain waits for the one before")
    lines = ["## Ours against the fastest peer and the floor", "",
             "Under the timer (`cudagraph` up to 256 tokens, `rotating+graph` above), calls back to back: " + chain
             + ".  `triton` (our unchecked launch) against the fastest other contender whose output passed its "
             "check (below 1 we are faster), and against the row's floor: "
             + (_SAME_BYTES_FLOOR if same_bytes else _STREAM_FLOOR)
             + ", timed in the same run by the same timer.  The device copy's bandwidth is quoted from "
             f"{COPY_QUOTED_FROM} tokens only, where a stream of this size reaches it.", "",
             "| model | tokens | dtype | ours, no overlap (us) | fastest peer | its time (us) | ours / peer "
             "| floor (us) | floor variant | floor / ours | "
             + ("channels only (us) | channels / ours | " if same_bytes else "")
             + "% of copy | ours, overlapping (us) |",
             "|---|---:|---|---:|---|---:|---:|---:|---|---:|" + ("---:|---:|" if same_bytes else "") + "---:|---:|"]
    for r in data["race"]:
        copy = f"{100 * r['copy_frac']:.1f}" if "copy_frac" in r and r["tokens"] >= COPY_QUOTED_FROM else "-"
        channels = (f"{_us(r.get('channels_ms', math.nan))} | {_frac(r, 'channels_frac')} | " if same_bytes else "")
        lines.append(f"| {r['model']} | {r['tokens']} | {r['dtype']} | {_us(r['ours_ms'])} | {r['best_peer']} | "
                     f"{_us(r['best_peer_ms'])} | {r['ratio']:.2f} | {_us(r.get('floor_ms', math.nan))} | "
                     f"{r.get('floor_how', '-')} | {_frac(r, 'floor_frac')} | {channels}{copy} | "
                     f"{_us(r.get('ours_pdl_ms', math.nan))} |")
    floor_cells = [("floor (us) | floor variant | floor / ours", "---:|---|---:",
                    lambda r: [_us(r.get("floor_eager_ms", math.nan)), r.get("floor_eager_how", "-"),
                               _frac(r, "floor_eager_frac")])]
    if same_bytes:
        floor_cells.append(("channels only (us) | channels / ours", "---:|---:",
                            lambda r: [_us(r.get("channels_eager_ms", math.nan)), _frac(r, "channels_eager_frac")]))
    lines += _eager_table(data, "Eager: `triton.testing.do_bench` for every contender and the floor (each call launched "
                          "from Python after its L2 flush, median): ours unchecked against the fastest peer's, and "
                          "against the row's floor under the same timer.", floor_cells)
    return lines + [""]


# The fused race's contenders in its table's column order (rope.harness.bench_fused.CONTENDERS).
FUSED_COLUMNS = ("triton", "unfused", "flashinfer", "flashinfer-unfused")


def fused_markdown(data: dict) -> list[str]:
    """The fused ops' race (rope.harness.bench_fused): per op, model, tokens and cache, each contender's
    time, the unfused sequence's over the fused kernel's, and the row's memory floor."""
    rows = data.get("fused") or []
    if not rows:
        return []
    lines = ["## Fused ops against the unfused sequence and the memory floor", "",
             "Every contender launched from Python back to back (cycling through input sets that leave each "
             "call's inputs in DRAM), device events, median of 7; each first held to the float64 reference on "
             "the row's shape (up to 1024 tokens: past 10,240 token x heads on every model).  `unfused`: torch's norm or cache write beside our rotation "
             "kernel, one launch after another.  Floor: the row's bytes at the copy bandwidth measured in the "
             "same run.  `flashinfer` (FP8 caches, 1-D) also quantizes q, so it moves fewer bytes; `flashinfer "
             "unfused` (activation-dtype caches, 1-D, heads of 64-512) is FlashInfer's in-place rotation then its "
             "paged append.  The host's time per call beside: where it passes the timed figure the row measures "
             "the host, not the kernel.", "",
             "| op | model | tokens | cache | ours (us) | unfused (us) | unfused / ours | flashinfer (us) "
             "| flashinfer unfused (us) | floor (us) | floor / ours "
             "| host, ours / unfused / flashinfer / flashinfer unfused (us per call) | check |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    keys = []
    for r in rows:
        key = (r["op"], r["model"], r["tokens"], r["cache"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        by = {r["impl"]: r for r in rows if (r["op"], r["model"], r["tokens"], r["cache"]) == key}
        ours, unfused, fi, fi_unfused = (by.get(n, {}).get("ms", math.nan) for n in FUSED_COLUMNS)
        floor = next(iter(by.values()))["floor_ms"]
        checks = "; ".join(f"{n}: {r['checked']}" for n, r in by.items() if r["checked"] != "ok") or "all ok"
        ratio = f"{unfused / ours:.2f}" if ours == ours and unfused == unfused else "-"
        frac = f"{floor / ours:.3f}" if ours == ours and floor == floor else "-"
        hosts = (by.get(n, {}).get("host_us", math.nan) for n in FUSED_COLUMNS)
        host = " / ".join("-" if us != us else f"{us:.1f}" for us in hosts)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {_us(ours)} | {_us(unfused)} | {ratio} | "
                     f"{_us(fi)} | {_us(fi_unfused)} | {_us(floor)} | {frac} | {host} | {checks} |")
    return lines + [""]


def markdown(data: dict) -> str:
    lines = [f"# Benchmark on {data['device_name']} ({data['device']})", "",
             f"Copy bandwidth (measured): {data['copy_gbps']:.0f} GB/s; empty Triton launch: "
             f"{_us(data['empty_launch_ms'])} us{_pdl_note(data)}; torch {data['torch']}.", "",
             "Timing: `cudagraph` = triton's do_bench_cudagraph on one input set (<= 256 tokens); "
             "`rotating+graph` = back-to-back calls cycling through copies of the inputs (one pass moves "
             "four L2 caches of bytes), one round captured in a CUDA graph (`rotating`: launched from Python where "
             "capture failed), device events, median of 7; `wall` = host clock (CPU); `interpreter: checked, not "
             "timed` = a Triton kernel run by the CPU interpreter: its output is checked, its time would mean nothing.", ""]
    for name, why in data.get("absent", {}).items():
        lines.append(f"- not raced: `{name}`: {why}")
    for name, whys in data.get("skipped", {}).items():
        lines.append(f"- `{name}` skipped {'; '.join(whys)}")
    lines += ["", *race_markdown(data), *fused_markdown(data), "## Every contender", "",
              "| model | tokens | impl | time (us) | GB/s | % of copy | vs native | eager (us) | host (us/call) "
              "| timing | check |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in data["results"]:
        sp = f"{r['speedup_vs_native']:.2f}x" if r["speedup_vs_native"] else "-"
        timed = r["ms"] == r["ms"]
        gbps, frac = (f"{r['gbps']:.0f}", f"{100 * r['frac_copy']:.1f}") if timed else ("-", "-")
        timing = r["timing"] + (f"; {r['note']}" if r.get("note") else "")
        host = r.get("host_us", math.nan)
        lines.append(f"| {r['model']} | {r['tokens']} | {r['impl']} | {_us(r['ms'])} | {gbps} | "
                     f"{frac} | {sp} | {_us(r.get('eager_ms', math.nan))} | {'-' if host != host else f'{host:.1f}'} "
                     f"| {timing} | {r['checked']} |")
    return "\n".join(lines) + "\n"


def _plot_race(ax, race_rows: list[dict]) -> None:
    """Our time over the fastest peer's, per model against tokens, each point labelled with that peer."""
    for i, model in enumerate(dict.fromkeys(r["model"] for r in race_rows)):
        pts = sorted((r["tokens"], r["ratio"], r["best_peer"]) for r in race_rows if r["model"] == model)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=model, color=f"C{i}")
        for x, y, peer in pts:
            ax.annotate(peer, (x, y), textcoords="offset points", xytext=(0, 5), fontsize=6, ha="center",
                        color=f"C{i}")
        eager = sorted((r["tokens"], r["eager_ratio"]) for r in race_rows if r["model"] == model and "eager_ratio" in r)
        if eager:
            ax.plot([p[0] for p in eager], [p[1] for p in eager], marker="x", linestyle=":", color=f"C{i}",
                    label=f"{model}, launched from Python (do_bench)")
    ax.axhline(1.0, color="k", linestyle="--", label="as fast as the fastest peer")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("our time / fastest peer's time (below 1: faster)")
    ax.set_title("ours against the fastest peer")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _plot_positions(ax, pos: list[dict], data: dict, colors: dict) -> None:
    """Time per ragged step, per implementation, against the empty launch: these steps move a few
    MB at most, so the launch, not the bandwidth, is their floor."""
    steps = list(dict.fromkeys(r["model"] for r in pos))
    names = sorted({r["impl"] for r in pos})
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        times = {r["model"]: r["ms"] * 1e3 for r in pos if r["impl"] == name}
        ax.bar([s + i * width for s in range(len(steps))], [times.get(step, float("nan")) for step in steps],
               width, label=name, color=colors[name])
    empty = data.get("empty_launch_ms")
    if empty is not None and not math.isnan(empty):            # NaN: not measured (CPU)
        ax.axhline(empty * 1e3, color="k", linestyle=":", label="empty launch")
    ax.set_xticks([s + width * (len(names) - 1) / 2 for s in range(len(steps))],
                  [f"{step}\n(requests x tokens)" for step in steps], fontsize=8)
    ax.set_yscale("log")
    timed = [r["ms"] * 1e3 for r in pos if r["ms"] == r["ms"]]
    if timed:
        ax.set_ylim(top=max(timed) * 8)                        # room for the legend above the bars
    ax.set_ylabel("us per step")
    ax.set_title("position step")
    ax.grid(True, which="both", axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncol=3)


def plot(data: dict) -> bytes:
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rot = [r for r in data["results"] if r["kind"] == "rotation"]
    pos = [r for r in data["results"] if r["kind"] == "positions"]
    models = sorted({r["model"] for r in rot})
    impls = sorted({r["impl"] for r in rot} | {r["impl"] for r in pos})
    palette = plt.get_cmap("tab20").colors
    colors = {impl: palette[i % len(palette)] for i, impl in enumerate(impls)}   # one colour per implementation
    race_rows = data.get("race") or []
    panels = max(1, len(models) + bool(race_rows) + bool(pos))
    cols = min(4, panels)                                   # rows of at most four panels
    rows = math.ceil(panels / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[panels:]:
        ax.set_visible(False)
    if pos:
        _plot_positions(axes[panels - 1], pos, data, colors)
    if race_rows:
        _plot_race(axes[len(models)], race_rows)
    for ax, model in zip(axes, models):
        for impl in sorted({r["impl"] for r in rot if r["model"] == model}):
            pts = sorted((r["tokens"], r["gbps"]) for r in rot
                         if r["model"] == model and r["impl"] == impl and r["ms"] == r["ms"])
            if pts:                         # interpreter rows are checks without a time
                ours = any(r["ours"] for r in rot if r["impl"] == impl)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl, color=colors[impl],
                        linewidth=2.5 if ours else 1.2)
        ax.axhline(data["copy_gbps"], color="k", linestyle="--", label="measured copy bandwidth")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("achieved GB/s (bytes of the floor / time)")
        ax.set_title(model)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Rotary kernels vs the memory floor on {data['device_name']}"
                 + (" (last: the position step vs the launch floor)" if pos else ""))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
