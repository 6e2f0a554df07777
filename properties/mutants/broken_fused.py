"""Broken fused implementations: each the built-in kernel (rope/triton/fused_qk_norm_rope.py,
rope/triton/rope_kv_cache.py, its MLA form too) with one bug the field has shipped, wrapped as an
implementation of its contract (``fused_op``), for ``rope-harness mutants`` (kind ``fused``: the
properties of properties/fused/ must reject each)."""

from __future__ import annotations

import torch

from rope.fused import fp8_max, is_fp8
from rope.triton.fused_qk_norm_rope import qk_norm_rope_triton
from rope.triton.rope_kv_cache import mla_rope_kv_cache_triton, rope_kv_cache_triton
from rope.triton.rotary import rotate_triton

__all__ = ["BROKEN_FUSED", "fp8_scale_multiplied", "latent_k_pe_unrotated", "live_key_unrotated",
           "norm_after_rotation", "padding_slots_written", "partner_lost_past_10240", "pos_ids_swapped_with_slots",
           "partner_lost_past_10240_in_cache_write", "q_pe_heads_read_packed"]

PARTNER_SWITCH = 10240


def _fused(op: str):
    def mark(fn):
        fn.fused_op = op
        return fn
    return mark


def _sin_dropped(cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """The table with its sin half zero: a rotation through it drops each pair's partner term."""
    table = cos_sin_cache.clone()
    table[:, table.shape[1] // 2:] = 0
    return table


def _past_switch(num_tokens: int, heads_before: int, num_heads: int, heads_total: int, device) -> torch.Tensor:
    """bool [T, num_heads]: the heads whose token x head index t * heads_total + heads_before + h is
    past the switch."""
    t = torch.arange(num_tokens, device=device)[:, None]
    h = torch.arange(num_heads, device=device)[None, :]
    return t * heads_total + heads_before + h >= PARTNER_SWITCH


def _splice(out: torch.Tensor, broken: torch.Tensor, mask: torch.Tensor, head_size: int) -> None:
    """out's heads where ``mask`` [T, H] from ``broken`` (both [T, H * head_size])."""
    heads = out.view(out.shape[0], -1, head_size) if out.is_contiguous() else None
    if heads is None:
        full = out.reshape(out.shape[0], -1, head_size).clone()
        full[mask] = broken.reshape(full.shape)[mask]
        out.copy_(full.reshape(out.shape))
        return
    heads[mask] = broken.reshape(heads.shape)[mask]


# ------------------------------------------------------------------------------- A: QK-norm + RoPE
@_fused("qk_norm_rope")
def norm_after_rotation(spec, positions, qkv, num_heads_q, num_heads_k, num_heads_v, q_weight, k_weight, eps,
                        cos_sin_cache):
    """q and k rotated first, then normalized (fp32, rounded once): the weights meet the wrong channels."""
    d = spec.head_size
    q_end, k_end = num_heads_q * d, (num_heads_q + num_heads_k) * d
    query, key = qkv[:, :q_end], qkv[:, q_end:k_end]
    q, k = rotate_triton(spec, positions, query.contiguous(), key.contiguous(), cos_sin_cache)
    for view, rotated, weight in ((query, q, q_weight), (key, k, k_weight)):
        heads = rotated.float().reshape(rotated.shape[0], -1, d)
        normed = heads * torch.rsqrt(heads.square().mean(dim=-1, keepdim=True) + eps) * weight.float()
        view.copy_(normed.reshape(view.shape).to(view.dtype))
    return qkv


@_fused("qk_norm_rope")
def partner_lost_past_10240(spec, positions, qkv, num_heads_q, num_heads_k, num_heads_v, q_weight, k_weight, eps,
                            cos_sin_cache):
    """vllm#51049: with partial rotary, the heads past 10240 token x heads rotated without their pairs'
    partner term (a warp handling several heads reads the wrong partner there)."""
    before = qkv.clone()
    qk_norm_rope_triton(spec, positions, qkv, num_heads_q, num_heads_k, num_heads_v, q_weight, k_weight, eps,
                        cos_sin_cache)
    total = num_heads_q + num_heads_k
    if spec.rotary_dim == spec.head_size or qkv.shape[0] * total <= PARTNER_SWITCH:
        return qkv
    qk_norm_rope_triton(spec, positions, before, num_heads_q, num_heads_k, num_heads_v, q_weight, k_weight, eps,
                        _sin_dropped(cos_sin_cache))
    d, k_end = spec.head_size, total * spec.head_size
    mask = _past_switch(qkv.shape[0], 0, total, total, qkv.device)
    _splice(qkv[:, :k_end], before[:, :k_end].contiguous(), mask, d)
    return qkv


# ------------------------------------------------------------------------------- B: RoPE + KV cache
@_fused("rope_kv_cache")
def live_key_unrotated(spec, positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache, *,
                       kv_layout="NHD", k_scale=None, v_scale=None):
    """sglang#19636: the rotated k written to the cache, the live k left as it came in."""
    key_in = key.clone()
    q, k = rope_kv_cache_triton(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    k.copy_(key_in)
    return q, k


def _stored(rows: torch.Tensor, cache: torch.Tensor, scale) -> torch.Tensor:
    if is_fp8(cache.dtype):
        value = 1.0 if scale is None else float(scale.reshape(())) if isinstance(scale, torch.Tensor) else scale
        limit = fp8_max(cache.dtype)
        rows = (rows.float() / value).clamp(-limit, limit)
    return rows.to(cache.dtype)


@_fused("rope_kv_cache")
def padding_slots_written(spec, positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache, *,
                          kv_layout="NHD", k_scale=None, v_scale=None):
    """flashinfer#2792: a padding slot (-1) taken as an index: its token's k and v written to the
    cache's last row."""
    q, k = rope_kv_cache_triton(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    heads = (key.shape[1] // spec.head_size, spec.head_size)
    for t in (slot_mapping == -1).nonzero().flatten().tolist():
        for cache, rows, scale in ((key_cache, k, k_scale), (value_cache, value, v_scale)):
            row = _stored(rows[t].reshape(heads), cache, scale)
            if kv_layout == "HND":
                cache[-1, :, -1] = row
            else:
                cache[-1, -1] = row
    return q, k


@_fused("rope_kv_cache")
def pos_ids_swapped_with_slots(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                               cos_sin_cache, *, kv_layout="NHD", k_scale=None, v_scale=None):
    """FlashInfer's op takes two index arrays, ``pos_ids`` (the rotation's positions) and
    ``positions`` (a token's place in its request's pages: its cache slot here); passed the other way
    round, q and k rotate by each token's slot (within the table) while the cache write still lands
    at the slot.  Tokens with no slot keep their positions."""
    slots = slot_mapping.to(positions.dtype)
    n = slots.shape[0]
    swapped = positions.clone()
    swapped[..., :n] = torch.where(slots >= 0, slots % cos_sin_cache.shape[0], swapped[..., :n])
    return rope_kv_cache_triton(spec, swapped, query, key, value, key_cache, value_cache, slot_mapping,
                                cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)


def _inverse(scale):
    if scale is None:
        return None
    return 1.0 / scale


@_fused("rope_kv_cache")
def fp8_scale_multiplied(spec, positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache, *,
                         kv_layout="NHD", k_scale=None, v_scale=None):
    """An FP8 cache stored as value * scale instead of value / scale."""
    return rope_kv_cache_triton(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                cos_sin_cache, kv_layout=kv_layout, k_scale=_inverse(k_scale),
                                v_scale=_inverse(v_scale))


@_fused("rope_kv_cache")
def partner_lost_past_10240_in_cache_write(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                           cos_sin_cache, *, kv_layout="NHD", k_scale=None, v_scale=None):
    """vllm#51049 inside the fused cache write: with partial rotary, the live q and k heads past 10240
    token x heads rotated without their pairs' partner term."""
    q_in, k_in = query.clone(), key.clone()
    q, k = rope_kv_cache_triton(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    hq, hk = query.shape[1] // spec.head_size, key.shape[1] // spec.head_size
    total = hq + hk
    if spec.rotary_dim == spec.head_size or query.shape[0] * total <= PARTNER_SWITCH:
        return q, k
    q2, k2 = rotate_triton(spec, positions, q_in, k_in, _sin_dropped(cos_sin_cache))
    _splice(q, q2, _past_switch(query.shape[0], 0, hq, total, q.device), spec.head_size)
    _splice(k, k2, _past_switch(query.shape[0], hq, hk, total, k.device), spec.head_size)
    return q, k


# ------------------------------------------------------------------------------- C: MLA
@_fused("mla_rope_kv_cache")
def q_pe_heads_read_packed(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache, *, scale=None):
    """aiter#3841: q_pe's heads read as if packed in the token's row (head stride = token stride /
    heads), right for a token-major q, wrong for a heads-major one (a transposed batched-matmul
    output, whose heads are T rows apart); the results stored at the right places."""
    num_heads = q_pe.shape[1]
    read = q_pe.as_strided(q_pe.shape, (q_pe.stride(0), q_pe.stride(0) // num_heads, q_pe.stride(2))).clone()
    q, k = mla_rope_kv_cache_triton(spec, positions, read, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache,
                                    scale=scale)
    q_pe.copy_(q)
    return q_pe, k


@_fused("mla_rope_kv_cache")
def latent_k_pe_unrotated(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache, *, scale=None):
    """The latent cache written with k_pe as it came in (the cache write before the rotation): q_pe
    and the live k_pe rotated, the rope columns of each written row not."""
    k_in = k_pe.reshape(k_pe.shape[0], -1).clone()
    q, k = mla_rope_kv_cache_triton(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache,
                                    scale=scale)
    slots = slot_mapping.long()
    tokens = (slots >= 0).nonzero().flatten()
    slots = slots[tokens]
    block_size, lora = kv_cache.shape[1], kv_c.shape[1]
    kv_cache[slots // block_size, slots % block_size, lora:] = _stored(k_in[tokens], kv_cache, scale)
    return q, k


BROKEN_FUSED = {fn.__name__: fn for fn in (live_key_unrotated, padding_slots_written, fp8_scale_multiplied,
                                            pos_ids_swapped_with_slots,
                                            norm_after_rotation, partner_lost_past_10240,
                                            partner_lost_past_10240_in_cache_write, q_pe_heads_read_packed,
                                            latent_k_pe_unrotated)}
