"""The dependent-load chain a 1-token rotation cannot go under: load a position, then that cache
row, then store it (no q/k at all), as one tiny kernel.  Shared by tools/sweep_rotary.py and
tools/pdl_latency.py; the empty launch it is compared with is rope.harness.bench.empty_launch_ms.
"""
import torch
import triton
import triton.language as tl

from rope.harness import bench
from rope.triton.pdl import HAS_PDL

if HAS_PDL:     # _chain_kernel's PDL variant calls these by their global names
    from rope.triton.pdl import gdc_launch_dependents, gdc_wait  # noqa: F401


@triton.jit
def _chain_kernel(pos_ptr, cache_ptr, out_ptr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    p = tl.load(pos_ptr)
    c = tl.load(cache_ptr + p * 128 + tl.arange(0, 64))
    tl.store(out_ptr + tl.arange(0, 64), c)


def chain_ms(device: str = "cuda", pdl: bool = False, repeats: int = 2) -> float:
    """Best of ``repeats`` times of the chain kernel under the benchmark's small-size timer."""
    pos = torch.zeros(1, dtype=torch.int64, device=device)
    cache = torch.randn(4096, 128, device=device, dtype=torch.bfloat16)
    out = torch.empty(64, device=device, dtype=torch.bfloat16)
    extra = {"launch_pdl": True} if pdl else {}
    timer = bench._timer(device, target_ms=30.0)
    return min(timer([lambda: _chain_kernel[(1,)](pos, cache, out, PDL=pdl, **extra)], 1)[0]
               for _ in range(repeats))
