"""The cos/sin cache (docs/spec.md §1), exactly the float32 recipe serving engines use.

``cache[p] = [cos(p * inv_freq) | sin(p * inv_freq)]`` with
``inv_freq[i] = base ** -(2i / rotary_dim)``, everything in float32 on the CPU, then cast
to the activation dtype.  Implementations and the reference consume this very (rounded)
cache, so the only legitimate differences between them are the implementations' rounding.
Built on the CPU and moved, so it is bit-identical on every device.
"""

from __future__ import annotations

import functools

import torch

from rope.spec import RopeSpec


def inv_freq(spec: RopeSpec) -> torch.Tensor:
    """float32 [rotary_dim/2]: base' ** -(2i / rotary_dim)."""
    rd = spec.rotary_dim
    return 1.0 / (spec.effective_base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))


def cos_sin_cache(spec: RopeSpec, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """[spec.max_position, rotary_dim] = cos | sin, cast to ``dtype`` and moved to ``device``."""
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec={spec!r}: must be a RopeSpec")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r}: must be a floating torch.dtype")
    t = torch.arange(spec.max_position, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq(spec))
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return cache.to(dtype=dtype).to(device)


@functools.lru_cache(maxsize=256)
def axis_table(axis_map: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A spec's axis map (``RopeSpec.axis_map()``) as an int64 tensor on ``device``, built once per
    (map, device): the native path gathers with it and the Triton kernel reads its rows from it, and
    neither copies it to the device per call (create it before capturing a CUDA graph: a warm-up
    call does)."""
    return torch.tensor(axis_map, dtype=torch.int64, device=device)
