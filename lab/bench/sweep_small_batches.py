"""Launch options of the rotation kernel where one wave holds the whole grid (1 and 256 tokens),
on every layout, on a GPU (notes: lab/perf-notes.md).

At these sizes a call's time is the launch, the CTAs' ramp onto the SMs and one program's
dependent chain (positions -> cache row -> rotate -> store), not bandwidth: the tile sizes tuned
at 4096+ tokens need not be the best here.  For each layout and token count, every configuration
is resolved to the launch it makes (grid, constexprs, warps, PDL; duplicates of another are timed
once), checked bit for bit against the default launch, then timed with the project's timer
(rope.harness.bench: CUDA graphs at these sizes) over rounds in alternating order, best of
--rounds; the default and the fastest few are timed again, interleaved, --confirm times.  The
empty launch and the position -> cache row -> store chain (lab/bench/latency_floor.py), with and
without PDL, give the floor.

Compiles come first, spread over --jobs worker processes that each launch their share once
(Triton's on-disk cache keeps the binaries), so the timing process only loads them.  Writes
sweep_small_batches.json and .md to --out.

    python -m lab.bench.sweep_small_batches --out $OUT [--tokens 1,256] [--models a,b] [--jobs 14]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path


LAYOUTS = {"qwen2.5-vl-72b": "chunked", "qwen3-vl-30b-a3b": "interleaved", "qwen3-vl-8b": "interleaved",
           "hunyuan-ocr": "XD-RoPE 4 rows", "glm-4.1v-9b": "GPT-J partial"}


def previous_defaults(spec, tokens: int, num_q: int, num_kv: int) -> dict:
    """The launcher's defaults before the one-wave tiles (lab/perf-notes.md §18), as options."""
    small = tokens < 128
    block_h = min(1 << max(0, (max(num_q, num_kv) - 1).bit_length()), 4 if small else 8)
    block_f = 1 << max(0, (spec.num_freqs - 1).bit_length())
    block_t = 1 if small else max(1, min(8, 1024 // (block_f * block_h)))
    return {"block_t": block_t, "block_h": block_h, "num_warps": 4, "pdl": tokens <= 64}


def candidate_options(tokens: int, num_kv: int, candidates: str = "full", spec=None, num_q: int = 0) -> list[dict]:
    """The launch options tried at ``tokens`` (the empty dict is the default launch).  ``full``: every
    tile, warp count and switch at 1 and 256 tokens; ``wide``: the front runners of ``full`` at any
    token count, to place the launcher's switches; ``previous``: the defaults before the one-wave
    tiles, beside the launcher's defaults (and 4 x 8 tiles above 4096 tokens, where the per-lane gather keeps MAX_TILE);
    ``none``: the default alone (with --extra: the default and those)."""
    opts = [{}]
    if candidates == "none":
        return opts
    small = tokens < 128        # the launcher's small-batch path: one token per program
    if candidates == "previous":
        return opts + [previous_defaults(spec, tokens, num_q, num_kv)] + (
            [{"block_t": 4, "block_h": 8}] if tokens > 4096 else [])
    if candidates == "wide":
        for pdl in (False, True):
            if small:
                opts += [{"pdl": pdl, "block_h": h} for h in (1, 2, 4, 8)]
            else:
                opts += [{"pdl": pdl, "block_t": bt, "block_h": bh, "num_warps": w}
                         for bt, bh, w in ((2, 8, 4), (4, 8, 4), (8, 4, 4), (1, 8, 2), (2, 16, 4), (2, 4, 2))]
        return opts
    if small:
        opts += [{"block_h": h} for h in (1, 2, 8, 16, 32)]
        opts += [{"num_warps": w} for w in (1, 2, 8)]
        opts += [{"block_h": h, "num_warps": w} for h, w in ((2, 1), (2, 2), (8, 1), (8, 2), (16, 2), (16, 8))]
        opts += [{"gather_3d": g} for g in (False, True)] + [{"gather_3d": g, "block_h": 8} for g in (False, True)]
        opts += [{"split_qk": False}, {"pdl": False}]
        return opts
    for pdl in (False, True):
        for bt, bh in ((1, 8), (2, 8), (4, 8), (8, 8), (1, 16), (2, 16), (4, 16), (2, 4), (4, 4), (8, 4)):
            opts.append({"pdl": pdl, "block_t": bt, "block_h": bh})
        for bt, bh, w in ((4, 8, 8), (2, 16, 8), (1, 8, 2), (2, 4, 2)):
            opts.append({"pdl": pdl, "block_t": bt, "block_h": bh, "num_warps": w})
        opts += [{"pdl": pdl, "evict_first": False}, {"pdl": pdl, "heads_fastest": False},
                 {"pdl": pdl, "gather_3d": True}, {"pdl": pdl, "gather_3d": False},
                 {"pdl": pdl, "block_hk": 1 << max(0, (num_kv - 1).bit_length())}]
    return opts


def _shape(model_key: str):
    """(spec, q heads, kv heads) of ``model`` or ``model@tp`` (one rank of tensor parallelism tp)."""
    from rope.models import get_model
    name, _, tp = model_key.partition("@")
    model = get_model(name)
    return model.spec, *model.sharded(int(tp or 1))


def resolved_launch(spec, positions, q, k, cache, options: dict):
    """What launch_rotary launches with ``options``: (grid, constexprs, compile options), the
    kernel call intercepted."""
    import rope.triton.rotary as rotary
    calls = []
    kernel = rotary._rotary_kernel
    rotary._rotary_kernel = type("Rec", (), {"__getitem__": lambda self, grid: (
        lambda *a, **kw: calls.append((grid, {n: v for n, v in kw.items()})))})()
    try:
        rotary.launch_rotary(spec, positions, q, k, cache, **options)
    finally:
        rotary._rotary_kernel = kernel
    (grid, kwargs), = calls
    return json.dumps({"grid": list(grid), **{n: v for n, v in sorted(kwargs.items())}}, sort_keys=True)


def launch_kernel(spec, positions, q, k, cache, options: dict):
    """Launch once; the compiled kernel Triton ran (None under the interpreter)."""
    import rope.triton.rotary as rotary
    kernel, ran = rotary._rotary_kernel, []

    class _Proxy:
        def __getitem__(self, grid):
            return lambda *a, **kw: ran.append(kernel[grid](*a, **kw))
    rotary._rotary_kernel = _Proxy()
    try:
        rotary.launch_rotary(spec, positions, q, k, cache, **options)
    finally:
        rotary._rotary_kernel = kernel
    return ran[0] if ran else None


def _inputs(model_key: str, tokens: int, device: str):
    import torch
    import rope
    from rope.harness import bench
    spec, nq, nk = _shape(model_key)
    cache = rope.cos_sin_cache(spec, torch.bfloat16, device)
    positions, q, k = bench._inputs(spec, tokens, nq, nk, torch.bfloat16, device)
    return spec, nq, nk, cache, positions, q, k


def _compile_share(jobs: list[tuple[str, int, dict, str]]) -> int:
    """Worker process: launch each (model, tokens, options) once, so its binary is compiled and cached."""
    from rope.triton.rotary import launch_rotary
    done = 0
    for model_key, tokens, options, device in jobs:
        spec, _, _, cache, positions, q, k = _inputs(model_key, tokens, device)
        launch_rotary(spec, positions, q, k, cache, **options)
        done += 1
    from rope.devices import synchronize
    synchronize(device)
    return done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1,256")
    p.add_argument("--candidates", choices=("full", "wide", "previous", "none"), default="full")
    p.add_argument("--extra", default="[]", help="JSON list of option dicts tried besides the candidates")
    p.add_argument("--floor-programs", default="1,18", help="program counts of the in-place chain (the floor)")
    p.add_argument("--models", default=",".join(LAYOUTS), help="model keys, model@tp for one rank of tp")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--confirm", type=int, default=3, help="extra interleaved rounds for the default and the best few")
    p.add_argument("--out", default=os.environ.get("OUT", "reports"))
    p.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (wall-clock times)")
    args = p.parse_args(argv)
    device = args.device

    import torch
    from rope.devices import synchronize
    from rope.harness import bench
    from rope.triton.rotary import launch_rotary
    from latency_floor import chain_ms

    tokens_list = [int(t) for t in args.tokens.split(",")]
    models = args.models.split(",")
    # 1. Every distinct launch, resolved on the host.
    cases = []      # (model, tokens, [(options, launch_key)])
    for key in models:
        for t in tokens_list:
            spec, nq, nk, cache, positions, q, k = _inputs(key, t, device)
            seen, opts = {}, []
            for o in candidate_options(t, nk, args.candidates, spec, nq) + json.loads(args.extra):
                launch = resolved_launch(spec, positions, q, k, cache, o)
                if launch in seen:
                    continue
                seen[launch] = o
                opts.append((o, launch))
            cases.append((key, t, opts))
    jobs = [(key, t, o, device) for key, t, opts in cases for o, _ in opts]
    start = time.perf_counter()
    shares = [jobs[i::args.jobs] for i in range(args.jobs)]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        compiled = sum(pool.map(_compile_share, [s for s in shares if s]))
    print(f"{compiled} distinct launches compiled in {time.perf_counter() - start:.1f} s on {args.jobs} processes",
          flush=True)

    # 2. The floor.
    timer = bench._timer(device, target_ms=30.0)
    pdl = device == "cuda"
    floor = {"empty_us": bench.empty_launch_ms(device) * 1e3,
             "empty_pdl_us": bench.empty_launch_ms(device, pdl=True) * 1e3 if pdl else float("nan"),
             "chain_us": chain_ms(device) * 1e3, "chain_pdl_us": chain_ms(device, pdl=True) * 1e3 if pdl else float("nan")}
    if pdl:     # the chain as an in-place rotation runs it, on 1 and 18 programs (Qwen2.5-VL-72B's decode grid)
        for programs in [int(n) for n in args.floor_programs.split(",")]:
            floor[f"chain_pdl_{programs}_programs_us"] = chain_ms(device, pdl=True, programs=programs) * 1e3
            floor[f"chain_pdl_in_place_{programs}_programs_us"] = chain_ms(
                device, pdl=True, programs=programs, in_place=True) * 1e3
    print(json.dumps(floor), flush=True)

    # 3. Check, then time, per case.
    rows = []
    for key, t, opts in cases:
        spec, nq, nk, cache, positions, q, k = _inputs(key, t, device)
        q0, k0 = q.clone(), k.clone()
        ref_q, ref_k = launch_rotary(spec, positions, q0.clone(), k0.clone(), cache)
        entries = []
        for o, launch in opts:
            out_q, out_k = q0.clone(), k0.clone()
            kernel = launch_kernel(spec, positions, out_q, out_k, cache, o)
            same = bool(torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k))
            qt, kt = q0.clone(), k0.clone()
            compiled = {n: getattr(kernel, n, None) for n in ("n_regs", "n_spills")}
            compiled["shared"] = getattr(getattr(kernel, "metadata", None), "shared", None)
            entries.append({"options": o, "launch": json.loads(launch), "same_bits": same, "times_us": [],
                            "compiled": compiled,
                            "call": (lambda o=o, qt=qt, kt=kt: launch_rotary(spec, positions, qt, kt, cache, **o))})
        for r in range(args.rounds):
            for e in (entries if r % 2 == 0 else entries[::-1]):
                e["times_us"].append(timer([e["call"]], t)[0] * 1e3)
        ranked = sorted((e for e in entries if e["same_bits"]), key=lambda e: statistics.median(e["times_us"]))
        confirm = [entries[0]] + [e for e in ranked[:4] if e is not entries[0]]
        for r in range(args.confirm):
            for e in (confirm if r % 2 == 0 else confirm[::-1]):
                e["times_us"].append(timer([e["call"]], t)[0] * 1e3)
        for e in entries:
            e.pop("call")
            e["best_us"] = min(e["times_us"])
            e["median_us"] = statistics.median(e["times_us"])
        default = entries[0]["median_us"]
        best = min((e for e in entries if e["same_bits"]), key=lambda e: e["median_us"])
        row = {"model": key, "layout": LAYOUTS.get(key.partition("@")[0], spec.layout), "tokens": t, "default_us": default,
               "best_us": best["median_us"], "best_options": best["options"], "entries": entries}
        rows.append(row)
        print(f"{key} {t} tokens: default {default:.3f} us, best {best['median_us']:.3f} us with {best['options']} "
              f"({len(entries)} launches, {sum(not e['same_bits'] for e in entries)} differing bits)", flush=True)
        del q, k, q0, k0
        synchronize(device)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import triton
    data = {"device": torch.cuda.get_device_name() if device == "cuda" else device, "torch": torch.__version__, "triton": triton.__version__,
            "floor": floor, "rows": rows}
    (out / "sweep_small_batches.json").write_text(json.dumps(data, indent=1))
    (out / "sweep_small_batches.md").write_text(markdown(data))
    print(markdown(data))
    return 0


def markdown(data: dict) -> str:
    f = data["floor"]
    lines = [f"# Launch options where one wave holds the grid ({data['device']}, torch {data['torch']}, Triton {data['triton']})", "",
             f"Empty launch {f['empty_us']:.2f} us ({f['empty_pdl_us']:.2f} with PDL); position -> cache row -> store "
             f"{f['chain_us']:.2f} us ({f['chain_pdl_us']:.2f} with PDL). "
             + "".join(f"{k[:-3].replace('_', ' ')}: {v:.2f} us; " for k, v in f.items() if k.startswith("chain_pdl_") and k != "chain_pdl_us")
             + "Times: the project's timer, us; rows ranked by the median of their rounds.", ""]
    for r in data["rows"]:
        lines += [f"## {r['model']} ({r['layout']}), {r['tokens']} tokens: default {r['default_us']:.3f} us, "
                  f"best {r['best_us']:.3f} us ({r['best_options']}), medians", "",
                  "| options | grid | BLOCK_T x BLOCK_H (BLOCK_HK) | warps | PDL | registers | same bits | median us "
                  "| rounds |",
                  "|---|---|---|---:|---|---:|---|---:|---|"]
        for e in sorted(r["entries"], key=lambda e: e["median_us"]):
            L = e["launch"]
            lines.append(f"| {e['options'] or 'default'} | {L['grid']} | {L['BLOCK_T']} x {L['BLOCK_H']} ({L['BLOCK_HK']}) "
                         f"| {L.get('num_warps', '-')} | {L.get('launch_pdl', False)} "
                         f"| {e['compiled'].get('n_regs') or '-'} | {e['same_bits']} "
                         f"| {e['median_us']:.3f} | {', '.join(f'{x:.3f}' for x in e['times_us'])} |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
