"""The "native" implementation: plain torch ops in the activation dtype.

This is how serving engines' ``forward_native`` computes M-RoPE: the cache is cast to the
activation dtype, cos/sin rows are gathered and selected per frequency, and every product and
sum is rounded to the activation dtype (bf16 stays bf16).  Its declared working precision is
therefore "activation", and the tolerance widens accordingly.
"""

from __future__ import annotations

import torch

from rope.cache import axis_table
from rope.spec import RopeSpec, check_rotation_inputs


def select_cos_sin(spec: RopeSpec, positions: torch.Tensor, cache: torch.Tensor, axis: torch.Tensor | None = None):
    """cos, sin [T, rotary_dim/2] in the cache's dtype, each frequency from its axis row.  ``axis``:
    the axis map as a tensor on the cache's device, where the caller holds one (a compiled caller
    passes it in: the cached lookup below is a graph break for Dynamo)."""
    cos, sin = cache[positions.long()].chunk(2, dim=-1)     # [T, half] or [D, T, half]
    if spec.num_dims == 1:
        return cos, sin
    if axis is None:
        axis = axis_table(spec.axis_map(), cache.device)
    index = axis.view(1, 1, -1).expand(1, cos.shape[1], -1)
    return cos.gather(0, index).squeeze(0), sin.gather(0, index).squeeze(0)


def apply_rotation(spec: RopeSpec, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [T, H * head_size] in x's dtype; channels >= rotary_dim pass through."""
    num_tokens = x.shape[0]
    heads = x.reshape(num_tokens, x.shape[1] // spec.head_size, spec.head_size)
    rot, rest = heads[..., : spec.rotary_dim], heads[..., spec.rotary_dim:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    if spec.is_neox_style:
        x1, x2 = rot.chunk(2, dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    if spec.is_neox_style:
        rotated = torch.cat((o1, o2), dim=-1)
    else:
        rotated = torch.stack((o1, o2), dim=-1).flatten(-2)
    return torch.cat((rotated, rest), dim=-1).reshape(x.shape)


def rotate_native(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """Out-of-place rotation in the activation dtype (serving engines' forward_native)."""
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    return rotate_native_unchecked(spec, positions, query, key, cos_sin_cache)


def rotate_native_unchecked(spec: RopeSpec, positions, query, key, cos_sin_cache, axis: torch.Tensor | None = None):
    """The hot path without validation (no host sync): what a serving engine runs, and what
    the benchmark times and torch.compile traces (with ``axis`` passed in: see select_cos_sin)."""
    cache = cos_sin_cache.to(query.dtype)
    cos, sin = select_cos_sin(spec, positions, cache, axis)
    q_out = apply_rotation(spec, query, cos, sin)
    k_out = apply_rotation(spec, key, cos, sin) if key is not None else None
    return q_out, k_out


rotate_native.working_precision = "activation"
# Its input checks read positions' values on the host (a range check per call), which a CUDA-graph
# capture forbids: it is called eagerly and under torch.compile, never captured.
rotate_native.modes = ("eager", "compile")
rotate_native.supports = lambda spec, dtype, device: True
rotate_native.unchecked = rotate_native_unchecked
