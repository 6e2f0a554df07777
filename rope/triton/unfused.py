"""The unfused sequences the fused kernels replace (docs/spec.md §10), as bench baselines: torch for
the norm and the cache write, the project's rotation kernel (rope/triton/rotary.py) for the
rotation, one launch after another, as an engine runs them without the fused op.

* :func:`qk_norm_rope_unfused`: RMSNorm of the q and k heads in fp32 by torch, rounded once to the
  activation dtype and written back into ``qkv``, then ``rotate_triton`` on the q and k column views.
  One rounding more than the fused kernel (the normalized value), as vLLM's unfused path (which
  rounds twice: after the norm and after the weight).
* :func:`rope_kv_cache_unfused`: ``rotate_triton`` on q and k, then the rows of the tokens with a
  slot written by torch indexing (FP8: ``(x.float() / scale)`` clamped to the format's largest finite
  value and cast; torch's cast rounds to nearest even).  Its q, k and caches have the fused kernel's
  bits (tests/kernels/test_unfused.py).

Both check their inputs as the fused entries do (rope/fused.py) and read slot values on the host
(``nonzero``): not for CUDA-graph capture.
"""

from __future__ import annotations

import torch

from rope.fused import check_qk_norm_rope_inputs, check_rope_kv_cache_inputs, fp8_max, is_fp8
from rope.spec import RopeSpec
from rope.triton.rotary import rotate_triton

__all__ = ["qk_norm_rope_unfused", "rope_kv_cache_unfused"]


def _norm_heads(x: torch.Tensor, weight: torch.Tensor, eps: float, head_size: int) -> torch.Tensor:
    """fp32 RMSNorm of each head of ``x`` [T, H * D], rounded once to x's dtype."""
    heads = x.float().reshape(x.shape[0], x.shape[1] // head_size, head_size)
    inv = torch.rsqrt(heads.square().mean(dim=-1, keepdim=True) + eps)
    return (heads * inv * weight.float()).reshape(x.shape).to(x.dtype)


def qk_norm_rope_unfused(spec: RopeSpec, positions, qkv, num_heads_q: int, num_heads_k: int, num_heads_v: int,
                         q_weight, k_weight, eps: float, cos_sin_cache):
    """QK-norm (torch), then the rotation kernel, in place on ``qkv``; returns ``qkv``."""
    query, key = check_qk_norm_rope_inputs(spec, positions, qkv, num_heads_q, num_heads_k, num_heads_v, q_weight,
                                           k_weight, eps, cos_sin_cache)
    query.copy_(_norm_heads(query, q_weight, eps, spec.head_size))
    key.copy_(_norm_heads(key, k_weight, eps, spec.head_size))
    q_out, k_out = rotate_triton(spec, positions, query, key, cos_sin_cache)
    if q_out.data_ptr() != query.data_ptr():       # rotate_triton copied a strided input
        query.copy_(q_out)
        key.copy_(k_out)
    return qkv


# Its declaration (docs/implementations.md): the normalized value is rounded to the activation dtype
# before the rotation, one rounding more than the fused kernel's bound allows.
qk_norm_rope_unfused.rounds_normalized = True


def _write_rows(cache: torch.Tensor, rows: torch.Tensor, blocks, offsets, layout: str, scale) -> None:
    if is_fp8(cache.dtype):
        value = 1.0 if scale is None else scale.reshape(()).float() if isinstance(scale, torch.Tensor) else scale
        limit = fp8_max(cache.dtype)
        rows = (rows.float() / value).clamp(-limit, limit)
    rows = rows.to(cache.dtype)
    if layout == "HND":
        cache[blocks, :, offsets] = rows
    else:
        cache[blocks, offsets] = rows


def rope_kv_cache_unfused(spec: RopeSpec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                          cos_sin_cache, *, kv_layout: str = "NHD", k_scale=None, v_scale=None):
    """The rotation kernel on q and k, then the cache rows written by torch; returns (query, key)."""
    k_scale, v_scale = check_rope_kv_cache_inputs(spec, positions, query, key, value, key_cache, value_cache,
                                                  slot_mapping, cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale,
                                                  v_scale=v_scale)
    query, key = rotate_triton(spec, positions, query, key, cos_sin_cache)
    tokens = (slot_mapping >= 0).nonzero()[:, 0]
    slots = slot_mapping[tokens].long()
    block_size = key_cache.shape[1] if kv_layout == "NHD" else key_cache.shape[2]
    heads = (-1, key.shape[1] // spec.head_size, spec.head_size)
    blocks, offsets = slots // block_size, slots % block_size
    _write_rows(key_cache, key[tokens].reshape(heads), blocks, offsets, kv_layout, k_scale)
    _write_rows(value_cache, value[tokens].reshape(heads), blocks, offsets, kv_layout, v_scale)
    return query, key
