"""Every layout against its memory limit, under both timers, in one run (notes: lab/perf-notes.md).

For the layouts the kernel must serve (Qwen2.5-VL-72B chunked, Qwen3-VL-30B-A3B and Qwen3-VL-8B
interleaved, HunyuanOCR XD-RoPE with 4 rows, GLM-4.1V-9B GPT-J partial) at each token count, it
checks then times:

* ours: the unchecked launch and the public entry (``get_implementation("triton")``), and, where
  the launch uses programmatic dependent launch (up to 256 tokens), the unchecked launch that reads
  the positions before its PDL wait (``positions_before_wait=True``: valid when the kernel before it
  does not write them, as in an engine's decode step);
* the in-place stream of the same access pattern, in one launch: every rotated channel of q and
  k read and written once, nothing else (the whole q and k for whole-head rotary, the first ``rotary_dim``
  channels of every head for partial rotary): what an in-place kernel of that pattern can reach;
* Liger's M-RoPE kernel with cos/sin gathered outside the timed call, on the layouts it runs;
* the floor under a one-token rotation: the empty launch and the dependent chain alone
  (lab/bench/latency_floor.py: a position, then the cache row it selects, stored), each also launched
  with programmatic dependent launch, as the rotation is at one token.

Each is timed with the project's timer (rope.harness.bench: a CUDA graph up to 256 tokens, input
rotation above) and with triton's ``do_bench`` (median; its CUDA-graph variant up to 256 tokens;
the L2 flushed by a memset before each call otherwise).  Fractions are of the copy bandwidth
(bench.copy_bandwidth) over ``bench.rotation_bytes`` (rotated channels read and written, cos/sin,
positions) for the rotations and over the streamed bytes for the stream.  Writes layout_limits.md
and .json to --out.

    . lab/offline/gpu_peers_env.sh; python -m lab.bench.layout_limits --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton


from rope.cache import cos_sin_cache
from rope.devices import synchronize, torch_device
from rope.harness import bench
from rope.harness.bench_contenders import Contender, contenders
from rope.models import load_models
from rope.triton.rotary import ONE_WAVE_TOKENS, launch_rotary    # PDL's range ends at ONE_WAVE_TOKENS[1]

from lab.bench.inplace_ceiling import scale_qk_row_prefix_inplace
from lab.bench.latency_floor import chain_ms

LAYOUTS = (("qwen2.5-vl-72b", "chunked"), ("qwen3-vl-30b-a3b", "interleaved"), ("qwen3-vl-8b", "interleaved"),
           ("hunyuan-ocr", "XD-RoPE 4 rows"), ("glm-4.1v-9b", "GPT-J partial"))
TOKENS = (1, 256, 4096, 16384, 65536)


def stream_calls(q, k, head_size: int, rotary_dim: int):
    """One call streaming the rotated channels of q and k in place, in one launch (as the rotation
    launches: at 1 and 256 tokens a second launch would be most of the time), per input set."""
    prefix = triton.next_power_of_2(rotary_dim)
    assert prefix == rotary_dim, "the stream reads power-of-two row prefixes"
    block_rows = max(1, 4096 // prefix)
    q_rows, k_rows = q.numel() // head_size, k.numel() // head_size
    grid = (triton.cdiv(q_rows, block_rows) + triton.cdiv(k_rows, block_rows),)

    def call():
        scale_qk_row_prefix_inplace[grid](q, k, q_rows, k_rows, ROW=head_size, PREFIX=prefix, BLOCK_ROWS=block_rows,
                                           num_warps=8)
    return call


def do_bench_ms(fn, tokens: int, device: str) -> float:
    if device != "cuda":            # a smoke run on the CPU interpreter: the wall clock, like bench's timer
        return bench._timer(device)([fn], tokens)[0]
    import triton.testing as tt
    if tokens <= bench.GRAPH_MAX_TOKENS:
        try:
            return tt.do_bench_cudagraph(fn, rep=50, return_mode="median")
        except Exception:        # noqa: BLE001 - a capture that fails is timed launched
            pass
    return tt.do_bench(fn, warmup=10, rep=100, return_mode="median")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--models", default=",".join(m for m, _ in LAYOUTS))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=os.environ.get("OUT", "reports"))
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"     # cpu: a smoke run (TRITON_INTERPRET=1)
    dev = torch_device(device)
    dtype = getattr(torch, args.dtype)
    tokens = [int(t) for t in args.tokens.split(",")]
    layouts = dict(LAYOUTS)
    models = load_models()
    timer = bench._timer(device)
    copy = bench.copy_bandwidth(device)
    empty, empty_pdl = bench.empty_launch_ms(device), bench.empty_launch_ms(device, pdl=True)
    chain = chain_ms(device)
    chain_pdl = chain_ms(device, pdl=True) if empty_pdl == empty_pdl else float("nan")    # NaN: no PDL here
    print(f"copy {copy:.0f} GB/s, empty launch {empty * 1e3:.2f} us ({empty_pdl * 1e3:.2f} with PDL), "
          f"position -> cache row -> store {chain * 1e3:.2f} us ({chain_pdl * 1e3:.2f} with PDL)", flush=True)
    found, absent = contenders(("triton", "triton-public", "liger-pregathered"))
    by_name = {c.name: c for c in found}
    if "triton" in by_name:      # the unchecked launch (inputs here are contiguous), positions read before the PDL wait
        by_name["triton-early"] = Contender(
            "triton-early", True, lambda spec, positions, q, k, cache: lambda: launch_rotary(
                spec, positions, q, k, cache, positions_before_wait=True),
            "float32", by_name["triton"].reason, triton=True)
    rows = []
    for key in args.models.split(","):
        model = models[key]
        spec = model.spec
        nq, nkv = model.sharded(1)
        cache = cos_sin_cache(spec, dtype, dev)
        for t in tokens:
            positions, q, k = bench._inputs(spec, t, nq, nkv, dtype, device)
            nbytes = bench.rotation_bytes(spec, t, nq, nkv, dtype.itemsize)
            sets = bench.input_sets(device, nbytes, t)
            row = {"model": key, "layout": layouts.get(key, spec.layout), "tokens": t, "bytes": nbytes}
            for name in ("triton", "triton-early", "triton-public", "liger-pregathered"):
                c = by_name.get(name)
                why = absent.get(name) if c is None else c.reason(spec, dtype, device)
                if name == "triton-early" and not why and t > ONE_WAVE_TOKENS[1]:
                    why = "the default's launch (no PDL at this size)"
                if why:
                    row[name] = {"skipped": why}
                    continue
                timed = bench.race_rotation(c, spec, positions, q, k, cache, device, timer, t, nbytes)
                ms, how, checked = timed["ms"], timed["timing"], timed["checked"]
                flushed = do_bench_ms(c.bind(spec, positions, q.clone(), k.clone(), cache), t, device)
                row[name] = {"us": ms * 1e3, "frac": nbytes / (ms * 1e-3) / 1e9 / copy, "timing": how,
                             "do_bench_us": flushed * 1e3, "do_bench_frac": nbytes / (flushed * 1e-3) / 1e9 / copy,
                             "checked": checked}
            streamed = 2 * t * (nq + nkv) * spec.rotary_dim * dtype.itemsize
            calls = [stream_calls(q.clone(), k.clone(), spec.head_size, spec.rotary_dim) for _ in range(sets)]
            ms, how = timer(calls, t)
            flushed = do_bench_ms(calls[0], t, device)
            row["stream"] = {"us": ms * 1e3, "frac": streamed / (ms * 1e-3) / 1e9 / copy, "timing": how,
                             "do_bench_us": flushed * 1e3, "do_bench_frac": streamed / (flushed * 1e-3) / 1e9 / copy}
            del calls, q, k
            synchronize(device)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"copy_gbps": copy, "empty_launch_us": empty * 1e3, "empty_launch_pdl_us": empty_pdl * 1e3,
            "chain_us": chain * 1e3, "chain_pdl_us": chain_pdl * 1e3,
            "device": torch.cuda.get_device_name() if device == "cuda" else device,
            "torch": torch.__version__, "triton": triton.__version__, "rows": rows}
    (out / "layout_limits.json").write_text(json.dumps(data, indent=1))
    (out / "layout_limits.md").write_text(markdown(data))
    print(markdown(data))
    return 0


def _cell(r: dict | None, frac: bool = True) -> str:
    if r is None:
        return "-"
    if "skipped" in r:
        return "n/s"
    if str(r.get("checked", "")).startswith("MISMATCH"):
        return "**mismatch** (not a valid time)"
    if frac:
        return f"{r['us']:.2f} us = {r['frac']:.3f} / {r['do_bench_us']:.2f} us = {r['do_bench_frac']:.3f}"
    return f"{r['us']:.2f} / {r['do_bench_us']:.2f} us"


def markdown(data: dict) -> str:
    lines = [f"# Layouts at their limit ({data['device']}, torch {data['torch']}, Triton {data['triton']})", "",
             f"Copy {data['copy_gbps']:.0f} GB/s, empty launch {data['empty_launch_us']:.2f} us "
             f"({data['empty_launch_pdl_us']:.2f} us with PDL), the one-token floor (a position, then the cache row "
             f"it selects, stored) {data['chain_us']:.2f} us ({data['chain_pdl_us']:.2f} us with PDL). Each cell: the "
             "project's timer, then triton's do_bench; a fraction is of the copy bandwidth.", "",
             "| model (layout) | tokens | ours, unchecked | ours, unchecked, positions read before the PDL wait | ours, public entry "
             "| in-place stream of the pattern | Liger, cos/sin pre-gathered | ours / Liger (timer) |",
             "|---|---:|---|---|---|---|---|---:|"]
    for r in data["rows"]:
        liger, ours = r.get("liger-pregathered"), r.get("triton")
        ratio = f"{ours['us'] / liger['us']:.2f}" if liger and "us" in liger and ours and "us" in ours else "-"
        lines.append(f"| {r['model']} ({r['layout']}) | {r['tokens']} | {_cell(ours)} | {_cell(r.get('triton-early'))} "
                     f"| {_cell(r.get('triton-public'))} "
                     f"| {_cell(r.get('stream'))} | {_cell(liger)} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
