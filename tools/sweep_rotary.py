"""Block-size / warp sweep of the Triton rotation kernel on a GPU (notes: docs/perf-notes.md)."""
import sys

import torch
import triton.testing as tt

import rope
from rope import bench
from rope.models import get_model
from rope.triton.rotary import launch_rotary

dev = "cuda"
ceiling = bench.copy_bandwidth(dev)
empty = bench.empty_launch_ms(dev)
print(f"copy {ceiling:.0f} GB/s, empty launch {empty * 1e3:.2f} us")
for key, tokens in (("qwen2.5-vl-72b", (1, 4096, 65536)), ("glm-4.1v-9b", (4096, 65536))):
    m = get_model(key)
    spec = m.spec
    nq, nk = m.sharded(1)
    cache = rope.cos_sin_cache(spec, torch.bfloat16, "cuda")
    for t in tokens:
        pos, q, k = bench._inputs(spec, t, nq, nk, torch.bfloat16, dev)
        nbytes = bench.rotation_bytes(spec, t, nq, nk, 2)
        best = None
        for bh in (2, 4, 8, 16, 32, 64):
            for nw in (1, 2, 4, 8):
                fn = lambda: launch_rotary(spec, pos, q, k, cache, block_h=bh, num_warps=nw)
                fn()
                ms = tt.do_bench_cudagraph(fn, rep=30, return_mode="median") if t <= 256 else \
                    tt.do_bench(fn, warmup=10, rep=50, return_mode="median")
                frac = nbytes / (ms * 1e-3) / 1e9 / ceiling
                print(f"{key} T={t} block_h={bh} warps={nw}: {ms * 1e3:.2f} us {100 * frac:.1f}% of copy")
                if best is None or ms < best[0]:
                    best = (ms, bh, nw, frac)
        print(f"BEST {key} T={t}: block_h={best[1]} warps={best[2]} {best[0] * 1e3:.2f} us {100 * best[3]:.1f}%")
        sys.stdout.flush()
