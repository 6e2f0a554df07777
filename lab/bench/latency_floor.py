"""The dependent-load chain a 1-token rotation cannot go under: load a position, then that cache
row, then store it (no q/k at all), as one tiny kernel.  Shared by lab/bench/sweep_rotary.py,
lab/bench/pdl_latency.py, lab/bench/layout_limits.py and lab/bench/sweep_small_batches.py; the empty launch
it is compared with is rope.harness.bench.empty_launch_ms.

``chain_ms(..., programs=P, in_place=True)`` is the same chain as an in-place rotation runs it:
P programs, each loading the position and the cache row, then its own 64-channel slice of a
tensor that the previous launch wrote, and storing the product back into that slice (the
access pattern of a decode step's q/k update, without the rotation's index arithmetic).
"""
import torch
import triton
import triton.language as tl

from rope.harness import bench
from rope.triton.pdl import HAS_PDL

if HAS_PDL:     # _chain_kernel's PDL variant calls these by their global names
    from rope.triton.pdl import gdc_launch_dependents, gdc_wait  # noqa: F401


@triton.jit
def _chain_kernel(pos_ptr, cache_ptr, out_ptr, PDL: tl.constexpr, IN_PLACE: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    lanes = tl.arange(0, 64)
    p = tl.load(pos_ptr)
    c = tl.load(cache_ptr + p * 128 + lanes)
    out = out_ptr + tl.program_id(0) * 64 + lanes
    if IN_PLACE:
        x = tl.load(out)
        c = (x.to(tl.float32) * c.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out, c)


def chain_ms(device: str = "cuda", pdl: bool = False, repeats: int = 2, programs: int = 1,
             in_place: bool = False) -> float:
    """Best of ``repeats`` times of the chain kernel under the benchmark's small-size timer."""
    pos = torch.zeros(1, dtype=torch.int64, device=device)
    cache = torch.randn(4096, 128, device=device, dtype=torch.bfloat16)
    out = torch.ones(programs * 64, device=device, dtype=torch.bfloat16)
    extra = {"launch_pdl": True} if pdl else {}
    timer = bench._timer(device, target_ms=30.0)
    return min(timer([lambda: _chain_kernel[(programs,)](pos, cache, out, PDL=pdl, IN_PLACE=in_place, **extra)], 1)[0]
               for _ in range(repeats))
