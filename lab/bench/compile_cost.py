"""What a first launch of a new kernel specialization costs on a GPU: a compile, or a load from
Triton's cache, in one process or in many at once (a campaign's workers).

Each process makes 48 launches of the rotation kernel (four layouts x three dtypes x 1 and 16
tokens x speculating or not: 48 specializations on the launcher of perf-notes §24, fewer since the
speculating band shares one tile, §25) and times each.  Two phases,
each with --processes processes started together: first on an empty Triton cache (every process
compiles every specialization, as the workers of a run did before rope/harness/compile_lock.py),
then on the cache the first phase filled (loads).  One line per process: the median, mean and
largest first launch, and their sum (lab/perf-notes.md §24).

    python -m lab.bench.compile_cost [--processes 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


MODELS = ("qwen2.5-vl-72b", "qwen3-vl-30b-a3b", "hunyuan-ocr", "glm-4.1v-9b")


def first_launches() -> list[float]:
    """Seconds of each first launch (launch and synchronize) in this process."""
    import torch

    import rope.triton.rotary as rotary
    from rope.models import load_models
    table = load_models()
    seconds = []
    for name in MODELS:
        model = table[name]
        spec = model.spec
        num_q, num_kv = model.sharded(1)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for tokens in (1, 16):
                for options in ({}, {"speculate_positions": False}):
                    shape = (spec.num_dims, tokens) if spec.num_dims > 1 else (tokens,)
                    positions = torch.zeros(shape, dtype=torch.int64, device="cuda")
                    query = torch.randn(tokens, num_q * spec.head_size, dtype=dtype, device="cuda")
                    key = torch.randn(tokens, num_kv * spec.head_size, dtype=dtype, device="cuda")
                    cache = torch.randn(4096, spec.rotary_dim, dtype=dtype, device="cuda")
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    rotary.launch_rotary(spec, positions, query, key, cache, **options)
                    torch.cuda.synchronize()
                    seconds.append(time.perf_counter() - start)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        ms = sorted(1e3 * s for s in first_launches())
        print(f"{args.worker}: {len(ms)} first launches, ms: median {statistics.median(ms):.1f}, "
              f"mean {statistics.mean(ms):.1f}, largest {ms[-1]:.1f}, sum {sum(ms) / 1e3:.2f} s", flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="compile-cost-") as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        for phase in ("empty cache", "warm cache"):
            start = time.perf_counter()
            procs = [subprocess.Popen([sys.executable, "-m", "lab.bench.compile_cost", "--worker", f"{phase}, process {i}"], env=env)
                     for i in range(args.processes)]
            failed = sum(p.wait() != 0 for p in procs)
            print(f"{phase}: {args.processes} processes in {time.perf_counter() - start:.1f} s"
                  f"{f', {failed} failed' if failed else ''}", flush=True)
            if failed:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
