"""The q/k eviction hint on and off, under both timers, per layout (notes: lab/perf-notes.md §22).

``evict_first`` on the q/k loads and stores lets the cos/sin rows keep their L2 lines while q/k
stream through.  Whether it pays depends on what else is in L2: the project's timer rotates input
sets (clean lines), triton's ``do_bench`` flushes L2 with a memset before each call (dirty lines that
must be written back while the kernel runs).  For each layout and token count this times the default
launch and the launch with the hint forced off and on, under both, in alternating rounds, and prints
one markdown row per (layout, tokens, option): fraction of copy, timer / do_bench, per round.

    . lab/offline/gpu_peers_env.sh; python -m lab.bench.evict_hint_timers [--tokens 4096,16384] [--rounds 2] > $OUT/evict.md
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton.testing as tt


from rope.cache import cos_sin_cache
from rope.harness import bench
from rope.models import load_models
from rope.triton.rotary import launch_rotary

from lab.bench.layout_limits import LAYOUTS

OPTIONS = ({}, {"evict_first": False}, {"evict_first": True})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="4096,16384")
    p.add_argument("--models", default=",".join(m for m, _ in LAYOUTS))
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (do_bench and the L2 behaviour it probes)")
    timer = bench._timer("cuda")
    copy = bench.copy_bandwidth("cuda")
    print(f"Copy {copy:.0f} GB/s ({torch.cuda.get_device_name()}). Each cell: fraction of copy, the project's "
          f"timer / do_bench, one per round.\n")
    print("| model | tokens | options | rounds |\n|---|---:|---|---|")
    models = load_models()
    for key in args.models.split(","):
        model = models[key]
        spec, (nq, nk) = model.spec, model.sharded(1)
        cache = cos_sin_cache(spec, torch.bfloat16, "cuda")
        for t in (int(x) for x in args.tokens.split(",")):
            positions, q, k = bench._inputs(spec, t, nq, nk, torch.bfloat16, "cuda")
            nbytes = bench.rotation_bytes(spec, t, nq, nk, 2)
            sets = bench.input_sets("cuda", nbytes, t)
            cells = {json.dumps(o): [] for o in OPTIONS}
            for _ in range(args.rounds):
                for options in OPTIONS:
                    inputs = [(q.clone(), k.clone()) for _ in range(sets)]
                    calls = [(lambda qq=qq, kk=kk, o=options: launch_rotary(spec, positions, qq, kk, cache, **o))
                             for qq, kk in inputs]
                    ms, _ = timer(calls, t)
                    flushed = tt.do_bench(calls[0], warmup=10, rep=100, return_mode="median")
                    cells[json.dumps(options)].append(
                        f"{nbytes / (ms * 1e-3) / 1e9 / copy:.3f} / {nbytes / (flushed * 1e-3) / 1e9 / copy:.3f}")
                    del inputs, calls
            for options, rounds in cells.items():
                print(f"| {key} | {t} | {options if options != '{}' else 'default'} | {', '.join(rounds)} |", flush=True)
            del q, k
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
