"""Reference gradients of the rotation in float64 (docs/spec.md §3): the vector-Jacobian product of
:func:`reference.rotate` with respect to query, key and the cos/sin cache.

Derivation.  Frequency i of token t rotates the pair (a, b) of every head by the angle θ whose
cosine and sine are c = cache[p, i] and s = cache[p, F + i], p = positions[axis(i), t] (§2):

    a' = a c - b s,        b' = b c + a s.

Given the upstream gradients g_a = dL/da' and g_b = dL/db', the chain rule gives

    dL/da = g_a c + g_b s  = g_a c - g_b (-s)
    dL/db = g_b c - g_a s  = g_b c + g_a (-s)

which is the forward's formula with s replaced by -s: the upstream gradient rotated by -θ, the
inverse (transpose) of the rotation.  Channels R .. D-1 pass through (a' = a), so their gradient
is the upstream gradient itself, bit for bit.  NeoX pairs (i, i + F) and GPT-J pairs (2i, 2i + 1)
differ only in which channels a and b are; the axis map only in which row p is, which the
gradient reads from the same place as the forward.  Nothing of q or k enters dL/dq or dL/dk: the
backward needs the positions and the cache alone, never the activations (so a forward that
rotates q and k in place loses nothing its backward needs).

The cache is a table the forward gathers from, so its gradient scatters back: the same element
cache[p, i] is read by every head of every token whose row axis(i) holds position p, and each
read contributes

    dL/dc = g_a a + g_b b,        dL/ds = g_b a - g_a b

(a and b the forward's *inputs*), accumulated into d cache[p, i] and d cache[p, F + i] with
index_add semantics (the sum over all reads, heads, tokens, query and key).  Rows and columns
never read get 0.  This gradient does need the activations: an implementation that rotates q and k
in place and computes it from the tensors it was handed reads its outputs instead of its inputs.

Positions are integers and get no gradient.
"""

from __future__ import annotations

import re

import torch

from reference.rotation import pair_indices, rotate_heads, select_cos_sin
from rope.spec import RopeSpec, check_rotation_inputs


def rotate_grad(spec: RopeSpec, positions: torch.Tensor, cos_sin_cache: torch.Tensor, grad_query: torch.Tensor,
                grad_key: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gradients of the rotation's loss with respect to query and key, float64 (dq, dk or None):
    ``grad_query`` / ``grad_key`` (the upstream gradients, shaped like query and key) rotated by -θ;
    pass-through channels carry the upstream gradient unchanged."""
    try:
        check_rotation_inputs(spec, positions, grad_query, grad_key, cos_sin_cache, may_write=False, check_values=True)
    except ValueError as exc:       # its messages name query and key: here they are the gradients
        raise ValueError(re.sub(r"\b(query|key)\b", r"grad_\1", str(exc))) from None
    cos, sin = select_cos_sin(spec, positions, cos_sin_cache)
    dq = rotate_heads(spec, grad_query, cos, -sin)
    dk = rotate_heads(spec, grad_key, cos, -sin) if grad_key is not None else None
    return dq, dk


def pair_products(spec: RopeSpec, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [T, rotary_dim/2] each: per token and frequency, summed over the heads of ``x``,
    ``g_a a + g_b b`` (the cosine's gradient) and ``g_b a - g_a b`` (the sine's)."""
    num_tokens = x.shape[0]
    heads = x.to(torch.float64).reshape(num_tokens, x.shape[1] // spec.head_size, spec.head_size)
    g = grad.to(torch.float64).reshape(heads.shape)
    a_idx, b_idx = pair_indices(spec)
    a, b, g_a, g_b = heads[..., a_idx], heads[..., b_idx], g[..., a_idx], g[..., b_idx]
    return (g_a * a + g_b * b).sum(dim=1), (g_b * a - g_a * b).sum(dim=1)


def cos_sin_cache_grad(spec: RopeSpec, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                       cos_sin_cache: torch.Tensor, grad_query: torch.Tensor,
                       grad_key: torch.Tensor | None) -> torch.Tensor:
    """The gradient with respect to the cos/sin cache, float64 shaped like the cache: each read of
    cache[p, i] (cos) and cache[p, F + i] (sin) adds its pair products (:func:`pair_products`) of the
    forward's inputs ``query`` / ``key`` and the upstream gradients, over every head of every token
    that reads it."""
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, may_write=False, check_values=True)
    for name, x, g in (("grad_query", query, grad_query), ("grad_key", key, grad_key)):
        if (x is None) != (g is None) or (g is not None and (g.shape != x.shape or not g.dtype.is_floating_point
                                                             or g.device != x.device)):
            got = "None" if g is None else f"{tuple(g.shape)} {g.dtype} on {g.device}"
            want = "None" if x is None else f"{tuple(x.shape)}, floating point, on {x.device}"
            raise ValueError(f"{name}={got}: must be shaped and placed like {name[5:]} ({want})")
    d_cos, d_sin = pair_products(spec, query, grad_query)
    if key is not None:
        k_cos, k_sin = pair_products(spec, key, grad_key)
        d_cos, d_sin = d_cos + k_cos, d_sin + k_sin
    half = spec.num_freqs
    rows = positions.long().reshape(spec.num_dims, -1)
    axes = torch.tensor(spec.axis_map(), dtype=torch.long, device=rows.device)
    pos = rows[axes].T.to(cos_sin_cache.device)                    # [T, half]: the row frequency i reads
    i = torch.arange(half, device=cos_sin_cache.device)
    grad = torch.zeros(cos_sin_cache.shape, dtype=torch.float64, device=cos_sin_cache.device)
    flat = grad.view(-1)
    width = cos_sin_cache.shape[1]
    flat.index_add_(0, (pos * width + i).flatten(), d_cos.to(grad.device).flatten())
    flat.index_add_(0, (pos * width + half + i).flatten(), d_sin.to(grad.device).flatten())
    return grad
