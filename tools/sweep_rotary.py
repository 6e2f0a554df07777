"""Tile sweep of the Triton rotation kernel on a GPU (notes: docs/perf-notes.md).

For each shape, every (tokens per program, head block, warps, q/k split) is checked bit-identical
to the default launch, then timed: do_bench_cudagraph for <= 256 tokens, do_bench (L2 cleared per
call) above.  Also times the dependent-load chain alone (positions -> cache row -> one store),
the floor a 1-token launch cannot go under.

    PYTHONPATH=. python3 tools/sweep_rotary.py [--quick]
"""
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing as tt

import rope
from rope import bench
from rope.models import get_model
from rope.triton.rotary import launch_rotary

dev = "cuda"
ceiling = bench.copy_bandwidth(dev)
empty = bench.empty_launch_ms(dev)
print(f"copy {ceiling:.0f} GB/s, empty launch {empty * 1e3:.2f} us", flush=True)


@triton.jit
def _chain_kernel(pos_ptr, cache_ptr, out_ptr):
    # The latency floor of a 1-token rotation: position -> cache row -> store (no q/k at all).
    p = tl.load(pos_ptr)
    c = tl.load(cache_ptr + p * 128 + tl.arange(0, 64))
    tl.store(out_ptr + tl.arange(0, 64), c)


def time_ms(fn, tokens, repeats=3):
    """Best of ``repeats`` medians: one median still moves by 10-40% between runs at 4096 tokens."""
    fn()
    torch.cuda.synchronize()
    if tokens <= 256:
        return min(tt.do_bench_cudagraph(fn, rep=30, return_mode="median") for _ in range(repeats))
    return min(tt.do_bench(fn, warmup=10, rep=40, return_mode="median") for _ in range(repeats))


pos1 = torch.zeros(1, dtype=torch.int64, device=dev)
cache1 = torch.randn(4096, 128, device=dev, dtype=torch.bfloat16)
out1 = torch.empty(64, device=dev, dtype=torch.bfloat16)
chain = time_ms(lambda: _chain_kernel[(1,)](pos1, cache1, out1), 1)
print(f"dependent chain alone (pos -> cache -> store): {chain * 1e3:.2f} us = {chain / empty:.2f}x empty launch",
      flush=True)

SMALL = [(1, bh, nw, split) for bh in (1, 2, 4, 8) for nw in (1, 2, 4, 8) for split in (False, True)]
LARGE = ([(bt, bh, nw, True) for bt, bh in ((1, 16), (2, 8), (2, 16), (4, 4), (4, 8), (4, 16), (8, 4), (8, 8))
          for nw in (2, 4, 8)]
         + [(bt, bh, 4, False) for bt, bh in ((1, 64), (1, 32), (2, 32), (2, 16), (4, 8), (4, 16))])
shapes = [("qwen2.5-vl-72b", (1, 16, 4096, 65536)), ("glm-4.1v-9b", (4096, 65536))]
if "--quick" in sys.argv:
    shapes = [("qwen2.5-vl-72b", (1, 4096))]
results = []
for key, tokens in shapes:
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
        rows = []
        for bt, bh, nw, split in (SMALL if t <= 256 else LARGE):
            q1, k1 = q_in.clone(), k_in.clone()
            launch_rotary(spec, pos, q1, k1, cache, block_h=bh, num_warps=nw, block_t=bt, split_qk=split)
            if not (torch.equal(q1, q0) and torch.equal(k1, k0)):
                print(f"MISMATCH {key} T={t} {bt, bh, nw, split}", flush=True)
                continue
            ms = time_ms(lambda: launch_rotary(spec, pos, q, k, cache, block_h=bh, num_warps=nw, block_t=bt,
                                               split_qk=split), t)
            frac = nbytes / (ms * 1e-3) / 1e9 / ceiling
            rows.append((ms, bt, bh, nw, split, frac))
            results.append({"model": key, "tokens": t, "block_t": bt, "block_h": bh, "warps": nw, "split_qk": split,
                            "us": ms * 1e3, "frac_copy": frac, "x_empty": ms / empty})
        default_ms = time_ms(lambda: launch_rotary(spec, pos, q, k, cache), t)
        rows.sort()
        print(f"{key} T={t}: default {default_ms * 1e3:.2f} us ({100 * nbytes / (default_ms * 1e-3) / 1e9 / ceiling:.1f}%, "
              f"{default_ms / empty:.2f}x empty); best:", flush=True)
        for ms, bt, bh, nw, split, frac in rows[:5]:
            print(f"   block_t={bt} block_h={bh} warps={nw} split_qk={split}: {ms * 1e3:.2f} us "
                  f"{100 * frac:.1f}% of copy, {ms / empty:.2f}x empty", flush=True)
out = os.environ.get("OUT")
if out:
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump({"copy_gbps": ceiling, "empty_us": empty * 1e3, "chain_us": chain * 1e3, "results": results}, f)
