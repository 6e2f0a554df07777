"""What a campaign example costs before the harness does anything: Hypothesis's engine per example
(a test that draws one integer) and the draws of a rotation case (``rotation_cases`` of a chunked
and a mapped layout), on this host's CPU, in one process or in ``--processes`` at once (as a
campaign's workers share the host).  A campaign's rate is bounded by the host's cores over these
figures (lab/perf-notes.md §28).

    python -m lab.bench.hypothesis_cost [--examples 3000] [--processes 1,16]
"""
from __future__ import annotations

import argparse
import multiprocessing
import time


def _per_example_ms(examples: int) -> dict[str, float]:
    from hypothesis import HealthCheck, Phase, given, settings, strategies as st

    from properties.strategies import rotation_cases
    quiet = settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
                     suppress_health_check=list(HealthCheck))
    strategies = {"engine (one integer)": st.integers(0, 2 ** 32 - 1),
                  "rotation case, chunked3 bf16": rotation_cases(dtype="bfloat16", kind="chunked3"),
                  "rotation case, mapped bf16": rotation_cases(dtype="bfloat16", kind="mapped")}
    out = {}
    for name, strategy in strategies.items():
        count = [0]

        @quiet
        @given(strategy)
        def run(_):
            count[0] += 1
        started = time.perf_counter()
        run()
        out[name] = 1e3 * (time.perf_counter() - started) / count[0]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=3000)
    parser.add_argument("--processes", default="1", help="comma-separated process counts to run at once")
    args = parser.parse_args(argv)
    for n in (int(p) for p in args.processes.split(",")):
        with multiprocessing.get_context("spawn").Pool(n) as pool:
            results = pool.map(_per_example_ms, [args.examples] * n)
        for name in results[0]:
            ms = sorted(r[name] for r in results)
            print(f"{n:>3} processes  {name:<30} {ms[len(ms) // 2]:.3f} ms an example (median; {ms[0]:.3f}-{ms[-1]:.3f})"
                  f"  -> at most {1e3 * n / ms[len(ms) // 2]:,.0f} examples/s on {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
