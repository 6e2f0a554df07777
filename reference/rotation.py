"""Reference rotation in float64 (docs/spec.md §2-3).

Written to be read, not to be fast: gather the cos/sin rows the spec's axis map selects,
then rotate each (a, b) pair of every head.  It reads the very cache the implementation
receives (upcast to float64), so its only own error is one float64 rounding per output.
"""

from __future__ import annotations

import torch

from reference.table import attention_factor, inv_freq
from rope.spec import RopeSpec, check_rotation_inputs


def pair_indices(spec: RopeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Channels (a_i, b_i) rotated by frequency i: NeoX (i, i + rd/2), GPT-J (2i, 2i + 1)."""
    i = torch.arange(spec.num_freqs)
    if spec.is_neox_style:
        return i, i + spec.num_freqs
    return 2 * i, 2 * i + 1


def select_cos_sin(spec: RopeSpec, positions: torch.Tensor, cos_sin_cache: torch.Tensor, axis_map=None):
    """cos, sin as float64 [num_tokens, rotary_dim/2]: cos[t, i] = cache[positions[axis(i), t], i].
    ``axis_map`` (default ``spec.axis_map()``): the position row of each frequency."""
    rows = positions.long().reshape(spec.num_dims, -1)          # [num_dims, T]
    half = spec.num_freqs
    axes = torch.tensor(spec.axis_map() if axis_map is None else axis_map, dtype=torch.long)
    pos = rows[axes.to(rows.device)].T                            # [T, half]: the row frequency i reads
    i = torch.arange(half, device=cos_sin_cache.device)
    cos = cos_sin_cache[pos, i].to(torch.float64)                 # gather, then upcast (exact)
    sin = cos_sin_cache[pos, half + i].to(torch.float64)
    return cos, sin


def exact_frequencies(spec: RopeSpec) -> torch.Tensor:
    """float64 [rotary_dim/2]: ``effective_base ** -(2i / rotary_dim)``, or for a scaled spec the
    scaled frequencies of the float64 table (reference.table.inv_freq, at the spec's length)."""
    if spec.scaling is not None:
        return inv_freq(spec)
    rd = spec.rotary_dim
    return float(spec.effective_base) ** (-torch.arange(0, rd, 2, dtype=torch.float64) / rd)


def exact_angles(spec: RopeSpec, positions: torch.Tensor) -> torch.Tensor:
    """float64 [num_tokens, rotary_dim/2]: ``positions[axis(i), t] * f_i`` (:func:`exact_frequencies`)."""
    rows = positions.long().reshape(spec.num_dims, -1).cpu()
    axes = torch.tensor(spec.axis_map(), dtype=torch.long)
    return rows[axes].T.to(torch.float64) * exact_frequencies(spec)


def exact_attention_factor(spec: RopeSpec) -> float:
    """The factor a scaled spec's cos and sin carry (YaRN's mscale, LongRoPE's attention factor;
    reference.table.attention_factor), 1.0 for a plain spec."""
    if spec.scaling is None:
        return 1.0
    return float(attention_factor(spec))


def exact_cos_sin(spec: RopeSpec, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin as float64 [num_tokens, rotary_dim/2] of :func:`exact_angles` times the spec's
    attention factor, all in float64: what an implementation that computes its own angles (no
    cache) is compared against."""
    theta = exact_angles(spec, positions)
    m = exact_attention_factor(spec)
    if m == 1.0:
        return theta.cos(), theta.sin()
    return theta.cos() * m, theta.sin() * m


def rotate_heads(spec: RopeSpec, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [T, H * head_size] in float64; channels >= rotary_dim are copied unchanged."""
    num_tokens = x.shape[0]
    heads = x.to(torch.float64).reshape(num_tokens, x.shape[1] // spec.head_size, spec.head_size)
    out = heads.clone()
    a_idx, b_idx = pair_indices(spec)
    a, b = heads[..., a_idx], heads[..., b_idx]                   # [T, H, rd/2]
    c, s = cos[:, None, :], sin[:, None, :]
    out[..., a_idx] = a * c - b * s
    out[..., b_idx] = b * c + a * s
    return out.reshape(x.shape)


def rotate(spec: RopeSpec, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
           cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference rotation: float64 (query_out, key_out or None) on the inputs' device."""
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, may_write=False, check_values=True)
    cos, sin = select_cos_sin(spec, positions, cos_sin_cache)
    q_out = rotate_heads(spec, query, cos, sin)
    k_out = rotate_heads(spec, key, cos, sin) if key is not None else None
    return q_out, k_out
