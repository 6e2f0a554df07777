"""The cos/sin table as a checked thing (docs/spec.md §1.2): the contract's built-in implementation.

An implementation of the table is ``fn(spec, max_position, dtype, device) -> cos_sin_cache``: a
``[max_position, rotary_dim]`` tensor of ``dtype`` on ``device`` whose row p is
``m * [cos(p f_0) .. cos(p f_{F-1}) | sin(p f_0) .. sin(p f_{F-1})]``, f the spec's inverse
frequencies and m its attention factor, both at the spec's sequence length ``spec.max_position``
(dynamic NTK's base, LongRoPE's short or long factors), as reference.cos_sin_table gives them.
``max_position`` is the number of rows the caller needs (the positions it admits).

:func:`cos_sin_table_ours` is rope.cache's float32 recipe (what the rotation is handed) under that
signature: the frequencies and the attention factor of rope.cache, positions times frequencies in
float32, cos and sin in float32, multiplied by the factor in float32, then cast.
"""

from __future__ import annotations

import torch

from rope.cache import attention_factor, inv_freq
from rope.spec import MAX_POSITION, RopeSpec

__all__ = ["check_table_call", "cos_sin_table_ours"]


def check_table_call(spec, max_position, dtype) -> None:
    """ValueError naming the field for a call the contract does not admit."""
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec={spec!r}: must be a RopeSpec")
    if not isinstance(max_position, int) or isinstance(max_position, bool) or not 1 <= max_position <= MAX_POSITION:
        raise ValueError(f"max_position={max_position!r}: must be an int in [1, {MAX_POSITION}]")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r}: must be a floating torch.dtype")


def cos_sin_table_ours(spec: RopeSpec, max_position: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """rope.cache's table (rope.cache.cos_sin_cache) with ``max_position`` rows."""
    check_table_call(spec, max_position, dtype)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq(spec))
    cos, sin = freqs.cos(), freqs.sin()
    scale = attention_factor(spec)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return torch.cat((cos, sin), dim=-1).to(dtype=dtype).to(device)
