"""Float64 references of the fused ops RoPE lives in (docs/spec.md, "Fused ops").

Each is composed from the parts, one function per concept: the per-head RMSNorm
(:func:`rms_norm_heads`), the rotation (:func:`reference.rotation.rotate`), the scatter of rows
into a paged cache (:func:`scatter_rows`) and the FP8 store's value (:func:`quantized`).  Every
part reads the very tensors an implementation receives (rounded activations, weights, cos/sin
cache), upcast to float64, so its only own error is float64 rounding.

What the references return, in float64:

* :func:`qk_norm_rope`: the whole qkv after the op (q and k normalized and rotated, v as given).
* :func:`rope_kv_cache` and :func:`mla_rope_kv_cache`: a :class:`CacheWrite`: the rotated q and k
  of every token (padding tokens included: the live k is rotated whatever its slot), the expected
  contents of each cache in its stored units (a written row holds the value, or for an FP8 cache
  ``value / scale`` saturated to the format's largest finite value; any other row holds the cache's
  old contents, upcast), and ``written``, the cache rows this call writes.  An FP8 row's expected
  value is that float64 quotient, not an FP8 code: the implementation's code is held to it within
  half the FP8 spacing at that magnitude plus what its own rounding of the value may move it
  (docs/spec.md, "Fused ops"), since the value it quantizes is its own rounded k, not this one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.rotation import rotate
from rope.fused import (PADDING_SLOT, check_mla_inputs, check_qk_norm_rope_inputs, check_rope_kv_cache_inputs,
                        fp8_max, is_fp8)
from rope.spec import RopeSpec

__all__ = ["CacheWrite", "mla_rope_kv_cache", "qk_norm_rope", "quantized", "rms_norm_heads", "rope_kv_cache",
           "scatter_rows", "slot_rows"]


@dataclass(frozen=True)
class CacheWrite:
    """What a RoPE + cache write leaves, in float64.  ``query``/``key``: the rotated activations
    (MLA: q_pe [T, H, R], k_pe [T, R]); ``caches``: name -> expected contents, shaped like the cache,
    in its stored units; ``written``: bool [num_blocks, block_size], the rows the call writes (every
    head of such a row); every other row must keep its bits."""
    query: torch.Tensor
    key: torch.Tensor
    caches: dict
    written: torch.Tensor


def rms_norm_heads(x: torch.Tensor, weight: torch.Tensor, eps: float, head_size: int) -> torch.Tensor:
    """float64 [T, H * head_size]: each head divided by its root mean square over all head_size
    channels (pass-through channels included), ``eps`` inside the root, times the weight."""
    num_tokens = x.shape[0]
    heads = x.to(torch.float64).reshape(num_tokens, x.shape[1] // head_size, head_size)
    mean_square = heads.square().mean(dim=-1, keepdim=True)
    return (heads / torch.sqrt(mean_square + eps) * weight.to(torch.float64)).reshape(x.shape)


def qk_norm_rope(spec: RopeSpec, positions: torch.Tensor, qkv: torch.Tensor, num_heads_q: int, num_heads_k: int,
                 num_heads_v: int, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """float64 [T, (Hq + Hk + Hv) * D]: q and k heads RMS-normalized with their weights, then
    rotated (1-D or any M-RoPE map, partial rotary: channels >= rotary_dim normalized, not rotated);
    v copied."""
    query, key = check_qk_norm_rope_inputs(spec, positions, qkv, num_heads_q, num_heads_k, num_heads_v, q_weight,
                                           k_weight, eps, cos_sin_cache, may_write=False, check_values=True)
    q = rms_norm_heads(query, q_weight, eps, spec.head_size)
    k = rms_norm_heads(key, k_weight, eps, spec.head_size)
    q, k = rotate(spec, positions, q, k, cos_sin_cache)
    v = qkv[:, (num_heads_q + num_heads_k) * spec.head_size:].to(torch.float64)
    return torch.cat((q, k, v), dim=1)


def quantized(value: torch.Tensor, scale, dtype: torch.dtype) -> torch.Tensor:
    """What a cache of ``dtype`` stores for float64 ``value``, in the stored units, before the
    store's own rounding: for FP8, ``value / scale`` saturated to +-(the largest finite value)
    (NaN stays NaN); else the value itself (such caches are written unscaled)."""
    if not is_fp8(dtype):
        return value
    scale = 1.0 if scale is None else float(scale.reshape(()) if isinstance(scale, torch.Tensor) else scale)
    limit = fp8_max(dtype)
    return (value / scale).clamp(-limit, limit)


def slot_rows(slot_mapping: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, slots) int64 of the tokens that write a cache row: those with a slot other than -1,
    among the first len(slot_mapping) tokens (vLLM V1: tokens past it are CUDA-graph padding)."""
    slots = slot_mapping.to("cpu", torch.int64)
    tokens = torch.arange(min(num_tokens, slots.shape[0]))
    keep = slots[tokens] != PADDING_SLOT
    return tokens[keep], slots[tokens][keep]


def scatter_rows(expected: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, block_size: int,
                 layout: str = "NHD") -> None:
    """Write ``rows`` [n, H, D] (MLA: [n, W]) into the float64 cache image ``expected`` at
    ``slots`` (slot = block * block_size + offset): NHD/latent ``expected[block, offset]``,
    HND ``expected[block, :, offset]``."""
    block, offset = slots // block_size, slots % block_size
    if layout == "HND":
        expected[block, :, offset] = rows
    else:
        expected[block, offset] = rows


def _written(num_blocks: int, block_size: int, slots: torch.Tensor) -> torch.Tensor:
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots] = True
    return written.reshape(num_blocks, block_size)


def rope_kv_cache(spec: RopeSpec, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, cos_sin_cache: torch.Tensor, *, kv_layout: str = "NHD",
                  k_scale=None, v_scale=None) -> CacheWrite:
    """RoPE + KV-cache write in float64: q and k rotated (every token), the rotated k and the
    given v of each token with a slot written to ``key_cache`` / ``value_cache`` (FP8: divided by
    k_scale / v_scale and saturated), every other cache row as it was."""
    k_scale, v_scale = check_rope_kv_cache_inputs(spec, positions, query, key, value, key_cache, value_cache,
                                                  slot_mapping, cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale,
                                                  v_scale=v_scale, may_write=False, check_values=True)
    q, k = rotate(spec, positions, query, key, cos_sin_cache)
    tokens, slots = slot_rows(slot_mapping, query.shape[0])
    block_size = key_cache.shape[1] if kv_layout == "NHD" else key_cache.shape[2]
    heads = (-1, key.shape[1] // spec.head_size, spec.head_size)
    caches = {}
    for name, cache, rows, scale in (("key_cache", key_cache, k, k_scale),
                                     ("value_cache", value_cache, value.to(torch.float64), v_scale)):
        expected = cache.to("cpu", torch.float64)
        scatter_rows(expected, quantized(rows[tokens.to(rows.device)].cpu(), scale, cache.dtype).reshape(heads),
                     slots, block_size, kv_layout)
        caches[name] = expected.to(cache.device)
    written = _written(key_cache.shape[0], block_size, slots).to(key_cache.device)
    return CacheWrite(q, k, caches, written)


def mla_rope_kv_cache(spec: RopeSpec, positions: torch.Tensor, q_pe: torch.Tensor, k_pe: torch.Tensor,
                      kv_c: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      cos_sin_cache: torch.Tensor, *, scale=None) -> CacheWrite:
    """MLA (DeepSeek) in float64: q_pe [T, H, R] and k_pe [T, R] rotated (every token), and for
    each token with a slot the row ``[kv_c | rotated k_pe]`` (FP8: divided by ``scale`` and
    saturated) written to the latent cache [num_blocks, block_size, L + R]; other rows as they were."""
    k_pe, scale = check_mla_inputs(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache,
                                   scale=scale, may_write=False, check_values=True)
    num_tokens, num_heads, r = q_pe.shape
    q, k = rotate(spec, positions, q_pe.reshape(num_tokens, num_heads * r), k_pe, cos_sin_cache)
    tokens, slots = slot_rows(slot_mapping, num_tokens)
    rows = torch.cat((kv_c.to(torch.float64), k), dim=1)[tokens.to(kv_c.device)].cpu()
    expected = kv_cache.to("cpu", torch.float64)
    scatter_rows(expected, quantized(rows, scale, kv_cache.dtype), slots, kv_cache.shape[1])
    written = _written(kv_cache.shape[0], kv_cache.shape[1], slots).to(kv_cache.device)
    return CacheWrite(q.reshape(num_tokens, num_heads, r), k, {"kv_cache": expected.to(kv_cache.device)}, written)
