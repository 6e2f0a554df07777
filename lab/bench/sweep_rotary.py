"""Variant and tile sweep of the Triton rotation kernel on a GPU (notes: lab/perf-notes.md).

For each shape, every launch configuration (tile sizes, warps, q/k split, cos/sin gathered in
the tile's 3-D layout or 2-D and broadcast ``gather_3d``) is checked bit-identical to the default
launch, then timed with the benchmark's timer (rope.harness.bench: CUDA graphs for <= 256 tokens, input
rotation above), best of 2.  The default launch is also timed with triton's do_bench (L2 flushed
by a memset before each call) to show what that timing does to these sizes.  Also times the
dependent-load chain alone (lab/bench/latency_floor.py), the floor a 1-token launch cannot go under.

    python -m lab.bench.sweep_rotary [--quick | --evict]
"""
import json
import os
import sys

import torch
import triton
import triton.testing as tt

import rope
from rope.harness import bench
from rope.models import get_model
from rope.triton.rotary import launch_rotary

from lab.bench.latency_floor import chain_ms
dev = "cuda"
ceiling = bench.copy_bandwidth(dev)
_src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
_dst = torch.empty_like(_src)
_graph_ms, _ = bench._time_rotating([lambda: _dst.copy_(_src)])
print(f"copy 1 GiB launched from Python {ceiling:.0f} GB/s; the same copy as a CUDA-graph memcpy node "
      f"{2 * (1 << 30) / (_graph_ms * 1e-3) / 1e9:.0f} GB/s; do_bench "
      f"{2 * (1 << 30) / (tt.do_bench(lambda: _dst.copy_(_src), return_mode='median') * 1e-3) / 1e9:.0f} GB/s",
      flush=True)
del _src, _dst
empty = bench.empty_launch_ms(dev)
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"copy {ceiling:.0f} GB/s, empty launch {empty * 1e3:.2f} us, {sms} SMs", flush=True)


timer = bench._timer(dev, target_ms=30.0)


def time_ms(fns, tokens, repeats=2):
    return min(timer(fns, tokens)[0] for _ in range(repeats))


chain = chain_ms(dev)
print(f"dependent chain alone (pos -> cache -> store): {chain * 1e3:.2f} us = {chain / empty:.2f}x empty launch",
      flush=True)


def cfg(bt, bh, nw=4, split=True, g3=None, ev=False, hf=False):
    return dict(block_t=bt, block_h=bh, num_warps=nw, split_qk=split, gather_3d=g3, evict_first=ev, heads_fastest=hf)


SMALL = [cfg(1, bh, nw, True, g3) for bh in (2, 4, 8) for nw in (2, 4) for g3 in (True, False)]
LARGE = [cfg(bt, bh, 4, True, g3) for g3 in (True, False)
         for bt, bh in ((1, 8), (2, 8), (4, 8), (1, 16), (2, 4), (4, 4), (8, 4))]
shapes = [("qwen2.5-vl-72b", (1, 16, 4096, 65536), LARGE), ("glm-4.1v-9b", (4096, 65536), LARGE),
          ("qwen3-vl-8b", (4096, 65536), LARGE)]
if "--quick" in sys.argv:
    shapes = [("qwen2.5-vl-72b", (1, 4096), LARGE)]
if "--evict" in sys.argv:       # q/k evict_first and the 1-D heads-fastest grid (lab/perf-notes.md §7)
    EVICT = [cfg(bt, 8, 4, True, None, ev, hf) for bt in (2, 4) for ev in (False, True) for hf in (False, True)]
    shapes = [("qwen2.5-vl-72b", (4096, 16384, 65536), EVICT), ("glm-4.1v-9b", (65536,), EVICT),
              ("qwen3-vl-8b", (65536,), EVICT)]
results = []
for key, tokens, large in shapes:
    m = get_model(key)
    spec = m.spec
    nq, nk = m.sharded(1)
    cache = rope.cos_sin_cache(spec, torch.bfloat16, dev)
    for t in tokens:
        pos, q, k = bench._inputs(spec, t, nq, nk, torch.bfloat16, dev)
        q_in, k_in = q.clone(), k.clone()           # timing rotates q/k in place: check from pristine copies
        q0, k0 = q_in.clone(), k_in.clone()
        launch_rotary(spec, pos, q0, k0, cache)
        nbytes = bench.rotation_bytes(spec, t, nq, nk, 2)
        sets = [(pos.clone(), q.clone(), k.clone()) for _ in range(bench.input_sets(dev, nbytes, t))]
        rows = []
        for c in (SMALL if t <= 256 else large):
            q1, k1 = q_in.clone(), k_in.clone()
            try:
                launch_rotary(spec, pos, q1, k1, cache, **c)
            except Exception as e:  # a configuration that does not compile is reported, not fatal
                print(f"FAILED {key} T={t} {c}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            if not (torch.equal(q1, q0) and torch.equal(k1, k0)):
                print(f"MISMATCH {key} T={t} {c}", flush=True)
                continue
            ms = time_ms([lambda s=s, c=c: launch_rotary(spec, *s, cache, **c) for s in sets], t)
            frac = nbytes / (ms * 1e-3) / 1e9 / ceiling
            rows.append((ms, c, frac))
            results.append({"model": key, "tokens": t, **c, "us": ms * 1e3, "frac_copy": frac, "x_empty": ms / empty})
        default_ms = time_ms([lambda s=s: launch_rotary(spec, *s, cache) for s in sets], t)
        if t > 256:
            flushed = [tt.do_bench(lambda: launch_rotary(spec, pos, q, k, cache), warmup=10, rep=40,
                                   return_mode="median") for _ in range(3)]
            print(f"{key} T={t}: default under do_bench (L2 flushed by a memset per call), 3 runs: "
                  + ", ".join(f"{1e3 * ms:.2f} us" for ms in flushed)
                  + f"; rotating {len(sets)} input sets: {default_ms * 1e3:.2f} us", flush=True)
            results.append({"model": key, "tokens": t, "default_do_bench_us": [1e3 * ms for ms in flushed],
                            "default_rotating_us": default_ms * 1e3, "input_sets": len(sets)})
        rows.sort(key=lambda r: r[0])
        print(f"{key} T={t}: default {default_ms * 1e3:.2f} us ({100 * nbytes / (default_ms * 1e-3) / 1e9 / ceiling:.1f}%, "
              f"{default_ms / empty:.2f}x empty); best:", flush=True)
        for ms, c, frac in rows[:6]:
            print(f"   {c}: {ms * 1e3:.2f} us {100 * frac:.1f}% of copy, {ms / empty:.2f}x empty", flush=True)
        by_mode = {}
        for ms, c, frac in rows:
            key_mode = f"evict_first={c['evict_first']} heads_fastest={c['heads_fastest']}"
            by_mode.setdefault(key_mode, (ms, c, frac))
        print("   best per mode: " + "; ".join(
            f"{k}: {v[0] * 1e3:.2f} us {100 * v[2]:.1f}%" for k, v in sorted(by_mode.items())), flush=True)
out = os.environ.get("OUT")
if out:
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump({"copy_gbps": ceiling, "empty_us": empty * 1e3, "chain_us": chain * 1e3, "sms": sms,
                   "results": results}, f)
