"""Block x split sweep of the Triton position kernel on a GPU (notes: lab/perf-notes.md §8).

For each of the benchmark's ragged steps (rope.harness.bench.POSITION_SHAPES: 256 decode requests, 64
chunks of 256 tokens, 16 chunks of 4096), every (block, programs-in-all target) is checked equal to
native's output, then timed with the benchmark's timer (CUDA graphs up to 256 tokens, input
rotation above), best of 2; ``target 0`` is one program per request (the kernel before lab/perf-notes.md §8); each
with and without programmatic dependent launch (``--pdl``).

    python -m lab.bench.sweep_positions [--device cuda]
"""
import argparse

import torch

from rope.harness import bench
from rope.runner_positions import launch_positions_native
from rope.triton.positions import default_splits, launch_prepare_positions

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cuda")
parser.add_argument("--blocks", default="128,256,512,1024")
parser.add_argument("--targets", default="0,256,512,1024,2048,4096")
parser.add_argument("--pdl", default="0,1", help="programmatic dependent launch off (0) / on (1)")
opts = parser.parse_args()
dev, dims = opts.device, 3
timer = bench._timer(dev, target_ms=30.0)
empty = bench.empty_launch_ms(dev) if dev == "cuda" else float("nan")
print(f"empty launch {empty * 1e3:.2f} us", flush=True)

for num_reqs, chunk in bench.POSITION_SHAPES:
    args, tokens, nbytes = bench.position_inputs(dev, num_reqs, chunk, dims)
    expected = torch.zeros(dims, tokens, dtype=torch.int64, device=args[0].device)
    launch_positions_native(*args, dims, expected)
    native_sets = [([a.clone() for a in args], expected.clone()) for _ in range(bench.input_sets(dev, nbytes, tokens))]
    native_ms = min(timer([lambda a=a, o=o: launch_positions_native(*a, dims, o) for a, o in native_sets], tokens)[0]
                    for _ in range(2))
    print(f"{num_reqs}x{chunk}: {tokens} tokens, {nbytes / 1e6:.2f} MB, native {native_ms * 1e3:.1f} us", flush=True)
    for block in map(int, opts.blocks.split(",")):
        for target in map(int, opts.targets.split(",")):
            for pdl in map(int, opts.pdl.split(",")):
                splits = 1 if target == 0 else default_splits(num_reqs, tokens, block, target)
                launch = dict(block=block, splits=splits, pdl=bool(pdl))
                o = torch.zeros_like(expected)
                launch_prepare_positions(*args, dims, o, **launch)
                name = f"block {block:>5} target {target:>5} pdl {pdl}"
                if not torch.equal(o, expected):
                    print(f"  {name}: MISMATCH", flush=True)
                    continue
                sets = [([a.clone() for a in args], o.clone()) for _ in range(bench.input_sets(dev, nbytes, tokens))]
                fns = [lambda a=a, o=o: launch_prepare_positions(*a, dims, o, **launch) for a, o in sets]
                ms = min(timer(fns, tokens)[0] for _ in range(2))
                print(f"  {name} ({num_reqs} x {splits} programs): {ms * 1e3:7.2f} us "
                      f"{nbytes / (ms * 1e-3) / 1e9:7.0f} GB/s  {ms / empty:5.2f}x empty launch", flush=True)
