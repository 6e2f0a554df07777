"""Decode-size latency with and without programmatic dependent launch (PDL), on a CUDA GPU of
compute capability >= 9 (lab/perf-notes.md §7).

Each row is a chain of back-to-back launches of one kernel captured in a CUDA graph, timed like the
benchmark (rope.harness.bench._timer): the per-launch time.  With PDL a launch may start while the one
before it runs and waits (griddepcontrol.wait) before reading memory, so its launch overlaps the
previous body.  Rows: an empty kernel (the benchmark's "empty launch"), the same with PDL (wait +
trigger), the position -> cache row -> store chain with and without, and launch_rotary (Qwen2.5-VL-72B,
bf16, in place) with pdl off and on.  Every PDL rotation is checked bit-identical to the non-PDL one.

    python -m lab.bench.pdl_latency
"""
import torch
import triton

import rope
from rope.harness import bench
from rope.models import get_model
from rope.triton.targets import pdl_available
from rope.triton.rotary import launch_rotary

from lab.bench.latency_floor import chain_ms
dev = "cuda"
assert pdl_available(torch.device(dev)), "needs CUDA cc >= 9 and a Triton with launch_pdl"
timer = bench._timer(dev, target_ms=30.0)


def best_us(fn, repeats=3):
    return 1e3 * min(timer([fn], 1)[0] for _ in range(repeats))


rows = {}
for pdl in (False, True):
    rows[f"empty kernel{' +PDL' if pdl else ''}"] = 1e3 * min(bench.empty_launch_ms(dev, pdl=pdl) for _ in range(3))
    rows[f"pos -> cache -> store{' +PDL' if pdl else ''}"] = 1e3 * chain_ms(dev, pdl=pdl, repeats=3)

m = get_model("qwen2.5-vl-72b")
spec = m.spec
nq, nk = m.sharded(1)
cache = rope.cos_sin_cache(spec, torch.bfloat16, dev)
for tokens in (1, 16, 64, 127):
    g = torch.Generator(device=dev).manual_seed(0)
    pos = torch.randint(0, spec.max_position, (spec.num_dims, tokens), device=dev, generator=g)
    q = torch.randn(tokens, nq * spec.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(tokens, nk * spec.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    outs = []
    for pdl in (False, True):
        qq, kk = q.clone(), k.clone()
        launch_rotary(spec, pos, qq, kk, cache, pdl=pdl)
        outs.append((qq.clone(), kk.clone()))       # the timing below keeps rotating qq/kk in place
        rows[f"rotary {tokens} tok{' +PDL' if pdl else ''}"] = best_us(
            lambda: launch_rotary(spec, pos, qq, kk, cache, pdl=pdl))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), tokens

empty = rows["empty kernel"]
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
print(f"{'kernel chain (CUDA graph)':32s} {'us/launch':>9s} {'x empty':>8s}")
for name, us in rows.items():
    print(f"{name:32s} {us:9.2f} {us / empty:8.2f}")
