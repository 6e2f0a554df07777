"""FlashInfer's fused FP8 rope + paged append (rope/backends/flashinfer_fused.py), drawn cases one at a
time: a hunt for a wrong answer or a fault outside what the adapter declares.

The property suite stops at a CUDA fault (it poisons the process's context: every later call in the
worker fails too, and Hypothesis shrinks the wrong thing).  Here each drawn contract-B and MLA case
(within the adapter's declared ``draws``, its unsupported shapes and known defects left out) is
checked alone against the float64 reference and synchronised; run it under CUDA_LAUNCH_BLOCKING=1 so
that a fault raises at the call that made it.  Prints each wrong or raising case in full, stops at
the first fault, and ends with the count of cases checked.  On the GPU box:

    . lab/offline/gpu_peers_env.sh && CUDA_LAUNCH_BLOCKING=1 python -m lab.bench.flashinfer_fused_hunt [EXAMPLES]

(lab/runs/flashinfer-fused-h100-2026-12-07.log: 100 + 100 cases, none wrong, none raised.)
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("ROPE_CASES_DIR", "off")

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from properties.fused.fused_cases import cache_cases, mla_cases  # noqa: E402
from rope.harness.fused.check import check_case  # noqa: E402


def hunt(op: str, fn, strategy, examples: int) -> int:
    """Check ``examples`` derandomized draws of ``strategy`` one by one; returns how many ran."""
    ran = [0]

    @settings(max_examples=examples, derandomize=True, phases=[Phase.generate], deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(case):
        if fn.unsupported_reason(case, "cuda"):
            return
        ran[0] += 1
        try:
            verdict = check_case(op, fn, case, "cuda")
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a fault or a raise is what is hunted
            print(f"RAISED {case!r}\n    {type(exc).__name__}: {str(exc)[:400]}", flush=True)
            if "CUDA error" in str(exc) or "illegal" in str(exc):
                os._exit(3)                  # the context is gone: nothing later would mean anything
            return
        if not verdict.ok:
            print(f"WRONG {case!r}\n    {' | '.join(verdict.problems)[:400]}", flush=True)

    one()
    return ran[0]


def main(argv: list[str]) -> int:
    from rope.backends.flashinfer_fused import _DRAWS, mla_rope_kv_cache_flashinfer, rope_kv_cache_flashinfer
    examples = int(argv[0]) if argv else 100
    for op, fn, strategy in (("rope_kv_cache", rope_kv_cache_flashinfer, cache_cases(draws=_DRAWS)),
                             ("mla_rope_kv_cache", mla_rope_kv_cache_flashinfer, mla_cases(draws=_DRAWS))):
        print(f"{op}: {hunt(op, fn, strategy, examples)} supported cases of {examples} draws checked", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
