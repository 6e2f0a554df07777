"""RoPE + paged KV-cache write, one Triton kernel (docs/spec.md, "Fused ops"): q and k rotated in
place (the live k too, whatever its slot), and for each token with a slot the rotated k and the
given v written to ``key_cache`` / ``value_cache`` at slot = block * block_size + offset, in the NHD
([num_blocks, block_size, H, D]) or HND ([num_blocks, H, block_size, D]) layout, any block, slot and
head strides; slot -1 (CUDA-graph padding) and tokens past ``slot_mapping``'s length write nothing,
and every other cache row keeps its bits.  A slot outside the cache (a value the entry does not read
on a GPU, rope.spec.checks_values) writes nothing either: the kernel stays inside the caches whatever
the slots.

A cache of the activations' dtype holds the very bits of the live k (and of v).  An FP8 cache
(e4m3fn, e5m2) holds ``fp8(fl32(x / scale))`` with x the activation-dtype value (the rotated k as
rounded for the live k; v as given), per-tensor ``k_scale`` / ``v_scale`` (vLLM's convention: the
scale dequantizes, stored = value / scale), rounded to nearest even and saturated to the largest
finite value by integer arithmetic (rope/triton/fused_tiles.py: the interpreter's fp8 convert is
wrong, and the same code compiled gives the same bits on any backend).

MLA (DeepSeek, contract C) is the same kernel with its LATENT switch: q_pe's heads read and written
at q_pe's own head stride (token- or heads-major q, aiter#3841), one k head (k_pe), and the latent
row [kv_c | rotated k_pe] written as two caches of one head each: kv_c the value head of
kv_lora_rank channels at column 0, the rotated k_pe at column kv_lora_rank; one FP8 scale for both.

Entry points: :func:`rope_kv_cache_triton` and :func:`mla_rope_kv_cache_triton` (checks, then
launches), :func:`launch_rope_kv_cache` and :func:`launch_mla_rope_kv_cache` (the launch alone, tile
options exposed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope.devices import device_name, triton_runs_on
from rope.fused import check_mla_inputs, check_rope_kv_cache_inputs
from rope.spec import RopeSpec
from rope.triton.checked import CheckedCalls
from rope.triton.fused_qk_norm_rope import tile
from rope.triton.fused_tiles import head_tile, program_heads, rotate_pairs, store_pairs, to_fp8
from rope.triton.grid import cdiv, next_power_of_2
from rope.triton.launcher import launch
from rope.triton.rotary_kernel import gather_cos_sin, load_positions, load_tile, round_for_store
from rope.triton.rotary_plan import cache_offsets_need_64, lane_block, map_table
from rope.triton.targets import launch_target

__all__ = ["SUPPORTED_DTYPES", "cache_strides", "launch_mla_rope_kv_cache", "launch_rope_kv_cache",
           "mla_rope_kv_cache_triton", "rope_kv_cache_triton"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FP8 = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}


@triton.jit
def _store_heads(cache_rows, slot_ok, heads, num_heads, cache_head_stride, head_size, src_rows, src_head_stride,
                 scale, FIRST_CHANNEL, FP8: tl.constexpr, BLOCK_D: tl.constexpr):
    """Copy channels >= FIRST_CHANNEL of whole heads from ``src_rows`` (activation dtype, heads
    src_head_stride apart) to the cache rows of the tokens with a slot, as they are or as the FP8
    codes of value / scale."""
    src, _, chan = head_tile(src_rows, slot_ok, heads, num_heads, src_head_stride, head_size, BLOCK_D)
    dst, dst_mask, _ = head_tile(cache_rows, slot_ok, heads, num_heads, cache_head_stride, head_size, BLOCK_D)
    keep = (chan >= FIRST_CHANNEL)[None, None, :]
    x = tl.load(src, mask=dst_mask & keep, other=0.0)
    if FP8:
        x = to_fp8(x, scale, FP8 == 2)
    tl.store(dst, x, mask=dst_mask & keep)


@triton.jit(do_not_specialize=["num_tokens", "num_slots", "cache_slots", "num_q_heads", "num_kv_heads",
                               "pos_row_stride", "cache_rows", "sec0", "sec1", "sec2"])
def _rope_kv_cache_kernel(
    q_ptr, k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr, cache_ptr, pos_ptr,
    map_ptr, q_row_stride, k_row_stride, v_row_stride, q_head_stride, k_head_stride, v_width, cache_row_stride,
    pos_row_stride, cache_rows, kc_block_stride, kc_slot_stride, kc_head_stride, vc_block_stride, vc_slot_stride, vc_head_stride,
    block_size, cache_slots, num_slots, num_tokens, num_q_heads, num_kv_heads, head_size, half, sec0, sec1, sec2,
    NUM_DIMS: tl.constexpr, INTERLEAVED: tl.constexpr, MAP_TABLE: tl.constexpr, IS_NEOX: tl.constexpr,
    ROUND_BF16: tl.constexpr, FP8: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, CACHE_I64: tl.constexpr,
    PASS_THROUGH: tl.constexpr, LATENT: tl.constexpr,
):
    # (1) The tile: BLOCK_T tokens x BLOCK_H heads of q (head blocks first) or of k.  A head of q
    #     (of k) starts q_head_stride (k_head_stride) elements after the previous one: head_size in
    #     a packed row; any stride for MLA's q_pe, a view of q [T, H, nope + R] token- or
    #     heads-major (aiter#3841: a heads-major q's heads are T rows apart, not adjacent).
    token, heads, is_k = program_heads(num_q_heads, num_kv_heads, BLOCK_T, BLOCK_H)
    token_ok = token < num_tokens
    x_ptr = tl.where(is_k, k_ptr, q_ptr)
    x_heads = tl.where(is_k, num_kv_heads, num_q_heads)
    x_head_stride = tl.where(is_k, k_head_stride, q_head_stride).to(tl.int64)
    rows = x_ptr + token * tl.where(is_k, k_row_stride, q_row_stride).to(tl.int64)
    out_ty = q_ptr.dtype.element_ty
    # (2) Rotate in place, exactly as the rotation kernel does (load, fp32, one rounding at the store).
    freq = tl.arange(0, BLOCK_F)
    x1, x2 = load_tile(rows, token_ok, heads, x_heads, x_head_stride, freq, half, IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F,
                       "")
    pos_0, pos_1, pos_2, pos_3 = load_positions(pos_ptr, pos_row_stride, token, num_tokens, NUM_DIMS)
    cos, sin = gather_cos_sin(cache_ptr, cache_row_stride, cache_rows, pos_0, pos_1, pos_2, pos_3, pos_0, pos_1, pos_2,
                              pos_3, freq, half, map_ptr, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE, BLOCK_T,
                              BLOCK_H, BLOCK_F, 1, False, CACHE_I64, False)
    o1, o2 = rotate_pairs(x1, x2, cos, sin)
    v1 = round_for_store(o1, ROUND_BF16).to(out_ty)
    v2 = round_for_store(o2, ROUND_BF16).to(out_ty)
    store_pairs(rows, token_ok, heads, x_heads, x_head_stride, freq, half, v1, v2, IS_NEOX, BLOCK_T, BLOCK_H,
                BLOCK_F)
    if is_k:
        # (3) The cache rows of the tile's tokens: slot -1, a token past slot_mapping, or a slot
        #     outside the cache's num_blocks * block_size rows (unchecked on a GPU) writes none.
        slot = tl.load(slot_ptr + token, mask=token_ok & (token < num_slots), other=-1).to(tl.int64)
        slot_ok = token_ok & (slot >= 0) & (slot < cache_slots)
        block = slot // block_size
        offset = slot % block_size
        k_cache_rows = key_cache_ptr + block * kc_block_stride + offset * kc_slot_stride
        v_cache_rows = value_cache_ptr + block * vc_block_stride + offset * vc_slot_stride
        k_scale = 1.0
        v_scale = 1.0
        # (4) k's rotated channels: the live k's values, or their FP8 codes.
        if FP8:
            k_scale = tl.load(k_scale_ptr).to(tl.float32)
            v_scale = tl.load(v_scale_ptr).to(tl.float32)
            store_pairs(k_cache_rows, slot_ok, heads, num_kv_heads, kc_head_stride, freq, half,
                        to_fp8(v1, k_scale, FP8 == 2), to_fp8(v2, k_scale, FP8 == 2), IS_NEOX, BLOCK_T, BLOCK_H,
                        BLOCK_F)
        else:
            store_pairs(k_cache_rows, slot_ok, heads, num_kv_heads, kc_head_stride, freq, half, v1, v2, IS_NEOX,
                        BLOCK_T, BLOCK_H, BLOCK_F)
        # (5) k's pass-through channels (>= rotary_dim, as given), then all of v (v_width channels a
        #     head).  LATENT (MLA): v is kv_c, one head of kv_lora_rank channels, and the "caches" are
        #     the two column ranges of one latent row, [kv_c | rotated k_pe].
        if PASS_THROUGH:
            _store_heads(k_cache_rows, slot_ok, heads, num_kv_heads, kc_head_stride, head_size, rows, x_head_stride,
                         k_scale, 2 * half, FP8, BLOCK_D)
        if LATENT:
            _store_heads(v_cache_rows, slot_ok, tl.arange(0, 1), 1, 0, v_width, v_ptr + token * v_row_stride, 0,
                         v_scale, 0, FP8, BLOCK_V)
        else:
            _store_heads(v_cache_rows, slot_ok, heads, num_kv_heads, vc_head_stride, v_width,
                         v_ptr + token * v_row_stride, v_width, v_scale, 0, FP8, BLOCK_V)


def cache_strides(cache: torch.Tensor, kv_layout: str) -> tuple[int, int, int]:
    """(block, slot, head) strides of a paged cache in elements, whatever its layout's dim order."""
    if kv_layout == "NHD":
        return cache.stride(0), cache.stride(1), cache.stride(2)
    return cache.stride(0), cache.stride(2), cache.stride(1)


def _scale_tensor(scale, device) -> torch.Tensor:
    """A one-element fp32 tensor the kernel reads the scale from (a float: made here, per call)."""
    if isinstance(scale, torch.Tensor):
        return scale.reshape(1).to(torch.float32)
    return torch.full((1,), 1.0 if scale is None else float(scale), dtype=torch.float32, device=device)


def _sections(spec: RopeSpec) -> tuple[int, int, int]:
    sections = tuple(spec.sections or ()) + (0, 0, 0)
    return sections[0], sections[1], sections[2]


@dataclass(frozen=True)
class _Rows:
    """Where the launch reads and writes beyond q and k: the head strides of q and k, the width of a
    v head, each cache's (block, slot, head) strides, block_size and the cache's slots; LATENT: MLA."""
    q_head_stride: int
    k_head_stride: int
    v_width: int
    k_cache_strides: tuple
    v_cache_strides: tuple
    block_size: int
    cache_slots: int
    latent: bool = False


def _launch(spec: RopeSpec, positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache,
            rows: _Rows, num_q: int, k_scale, v_scale, block_t, block_h, num_warps: int) -> None:
    """The launch both entries share: the grid, the constexprs, the FP8 caches as bytes."""
    num_tokens, num_kv = query.shape[0], key.shape[1] // spec.head_size
    target = launch_target(query.device)
    block_t, block_h = tile(num_tokens, max(num_q, num_kv), spec.head_size, target.compiled, block_t, block_h)
    block_f = lane_block(spec)
    table = spec.num_dims > 1 and spec.layout not in ("chunked", "interleaved")
    fp8 = _FP8.get(key_cache.dtype, 0)
    constexprs = dict(NUM_DIMS=spec.num_dims, INTERLEAVED=spec.num_dims > 1 and spec.layout == "interleaved",
                      MAP_TABLE=table, IS_NEOX=spec.is_neox_style,
                      ROUND_BF16=query.dtype == torch.bfloat16 and not target.compiled, FP8=fp8,
                      BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_F=block_f, BLOCK_D=next_power_of_2(spec.head_size),
                      BLOCK_V=next_power_of_2(rows.v_width), CACHE_I64=cache_offsets_need_64(cos_sin_cache, block_f),
                      PASS_THROUGH=spec.rotary_dim < spec.head_size, LATENT=rows.latent)
    if target.compiled:
        constexprs.update(enable_fp_fusion=False, num_warps=num_warps)
    if fp8:       # the kernel writes the FP8 codes as bytes
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
        scales = (_scale_tensor(k_scale, query.device), _scale_tensor(v_scale, query.device))
    else:
        scales = (cos_sin_cache, cos_sin_cache)        # not read
    grid = (cdiv(num_tokens, block_t) * (cdiv(num_q, block_h) + cdiv(num_kv, block_h)), 1, 1)
    args = (query, key, value, key_cache, value_cache, slot_mapping, *scales, cos_sin_cache, positions,
            map_table(spec, positions.device) if table else positions,
            query.stride(0), key.stride(0), value.stride(0), rows.q_head_stride, rows.k_head_stride, rows.v_width,
            cos_sin_cache.stride(0), positions.stride(0) if positions.dim() == 2 else 0, cos_sin_cache.shape[0],
            *rows.k_cache_strides, *rows.v_cache_strides, rows.block_size, rows.cache_slots, slot_mapping.shape[0],
            num_tokens, num_q, num_kv, spec.head_size, spec.num_freqs, *_sections(spec))
    launch(_rope_kv_cache_kernel, grid, args, constexprs,
           (spec, block_t, block_h, query.dtype, key_cache.dtype, fp8, target, num_warps, constexprs["CACHE_I64"],
            constexprs["BLOCK_V"], rows.latent))


def launch_rope_kv_cache(spec: RopeSpec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                         cos_sin_cache, *, kv_layout: str = "NHD", k_scale=None, v_scale=None,
                         block_t: int | None = None, block_h: int | None = None, num_warps: int = 4):
    """Launch without validation (the caller has checked; unit-stride channels, positions and
    cache rows); returns (query, key), rotated in place, the caches written."""
    if query.shape[0] == 0:
        return query, key
    block_size = key_cache.shape[1] if kv_layout == "NHD" else key_cache.shape[2]
    d = spec.head_size
    rows = _Rows(d, d, d, cache_strides(key_cache, kv_layout), cache_strides(value_cache, kv_layout), block_size,
                 key_cache.shape[0] * block_size)
    _launch(spec, positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache, rows,
            query.shape[1] // d, k_scale, v_scale, block_t, block_h, num_warps)
    return query, key


def _prepared(positions, cos_sin_cache, slot_mapping):
    """The launch's unit-stride forms of what it reads (copies only where a stride is not 1)."""
    if cos_sin_cache.stride(1) != 1:
        cos_sin_cache = cos_sin_cache.contiguous()
    if positions.stride(-1) != 1:
        positions = positions.contiguous()
    if slot_mapping.numel() and slot_mapping.stride(0) != 1:
        slot_mapping = slot_mapping.contiguous()
    return positions, cos_sin_cache, slot_mapping


def _check_launchable(named: dict, device) -> None:
    """The kernel's own requirements: a dtype it supports, unit-stride channels where it writes in
    place, a device Triton runs on."""
    first, t = next(iter(named.items()))
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{first}.dtype={t.dtype}: the Triton kernel supports {SUPPORTED_DTYPES}")
    for name, t in named.items():
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name}.stride()={t.stride()}: channels must have stride 1 (the kernel reads and writes "
                             f"runs of channels)")
    if not triton_runs_on(device_name(device)):
        raise ValueError(f"{first}.device={device}: Triton needs a GPU tensor here, or TRITON_INTERPRET=1")


# Calls whose metadata passed the entries' checks (rope/triton/checked.py): an engine's steady state,
# the same buffers every step, pays for the checks once (they cost about 100 us of host time a call,
# more than the kernel below a few thousand tokens).
_CHECKED = CheckedCalls()


def _signature(scalars: tuple, tensors: tuple, scales: tuple):
    """The call's signature for the cache of checked calls; None (check everything) where values
    are checked (the CPU, or ROPE_CHECK_VALUES=1: positions, slots and scale tensors are read) or
    where an argument has none.  A float scale is a scalar of the signature, a tensor one a tensor."""
    floats = tuple(None if isinstance(s, torch.Tensor) else s for s in scales)
    return CheckedCalls.signature((*scalars, *floats),
                                  (*tensors, *(s if isinstance(s, torch.Tensor) else None for s in scales)),
                                  values_read_from=tensors[0])


def rope_kv_cache_triton(spec: RopeSpec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                         cos_sin_cache, *, kv_layout: str = "NHD", k_scale=None, v_scale=None):
    """RoPE + KV-cache write; returns (query, key), rotated in place; ``key_cache`` and
    ``value_cache`` written at ``slot_mapping``.

    Args:
        positions: int64/int32 [T] (1-D RoPE) or [spec.num_dims, T].
        query: [T, Hq * D]; key, value: [T, Hkv * D] (any row strides; channels unit-stride).
        key_cache, value_cache: [num_blocks, block_size, Hkv, D] (NHD) or [num_blocks, Hkv, block_size, D]
            (HND), the activations' dtype or FP8; block, slot and head strides free.
        slot_mapping: int32/int64 [<= T]: block * block_size + offset, or -1.
        k_scale, v_scale: FP8 caches only: None (1.0), a float or a one-element tensor; stored = x / scale.
    """
    signature = _signature((spec, kv_layout), (positions, query, key, value, key_cache, value_cache, slot_mapping,
                                               cos_sin_cache), (k_scale, v_scale))
    if _CHECKED.get(signature) is None:
        check_rope_kv_cache_inputs(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                   cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
        _check_launchable({"query": query, "key": key}, query.device)
        _CHECKED.add(signature)
    positions, cos_sin_cache, slot_mapping = _prepared(positions, cos_sin_cache, slot_mapping)
    return launch_rope_kv_cache(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)


rope_kv_cache_triton.working_precision = "float32"


# ------------------------------------------------------------------------------- C: MLA
def launch_mla_rope_kv_cache(spec: RopeSpec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache, *,
                             scale=None, block_t: int | None = None, block_h: int | None = None,
                             num_warps: int = 4):
    """Launch the kernel's LATENT form without validation: q_pe [T, H, R] (any token and head
    strides, unit channels) and k_pe [T, R] rotated in place, each slotted token's row
    ``[kv_c | rotated k_pe]`` written to kv_cache [num_blocks, block_size, L + R]; returns (q_pe, k_pe)."""
    num_tokens, num_heads, r = q_pe.shape
    if num_tokens == 0:
        return q_pe, k_pe
    lora = kv_c.shape[1]
    # The latent row as two caches of one head each: kv_c's channels [0, L), k_pe's [L, L + R).
    latent = (kv_cache.stride(0), kv_cache.stride(1), 0)
    rows = _Rows(q_pe.stride(1), r, lora, latent, latent, kv_cache.shape[1], kv_cache.shape[0] * kv_cache.shape[1],
                 latent=True)
    # q's row pointers and row stride from head 0; its heads are q_head_stride apart.
    _launch(spec, positions, q_pe[:, 0], k_pe, kv_c, kv_cache[:, :, lora:], kv_cache, slot_mapping, cos_sin_cache, rows,
            num_heads, scale, scale, block_t, block_h, num_warps)
    return q_pe, k_pe


def mla_rope_kv_cache_triton(spec: RopeSpec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache, *,
                             scale=None):
    """MLA (DeepSeek) RoPE + latent-cache write; returns (q_pe, k_pe), rotated in place, ``kv_cache``
    written at ``slot_mapping``.

    Args:
        positions: int64/int32 [T].
        q_pe: [T, H, R], the rope channels of q [T, H, nope + R]: any token and head strides (a
            heads-major view included), unit channel stride.
        k_pe: [T, R] or [T, 1, R], any row stride (a column view of kv_a [T, L + R]).
        kv_c: [T, L], any row stride, read only.
        kv_cache: [num_blocks, block_size, L + R], the activations' dtype or FP8; block and slot strides free.
        slot_mapping: int32/int64 [<= T]: block * block_size + offset, or -1.
        scale: FP8 caches only: None (1.0), a float or a one-element tensor; stored = x / scale.
    """
    signature = _signature((spec,), (positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache), (scale,))
    if _CHECKED.get(signature) is None:
        check_mla_inputs(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache, scale=scale)
        _check_launchable({"q_pe": q_pe, "k_pe": k_pe[:, 0] if k_pe.dim() == 3 else k_pe, "kv_c": kv_c},
                          q_pe.device)
        _CHECKED.add(signature)
    if k_pe.dim() == 3:             # [T, 1, R]: the checks passed it as [T, R]
        k_pe = k_pe[:, 0]
    positions, cos_sin_cache, slot_mapping = _prepared(positions, cos_sin_cache, slot_mapping)
    q, k = launch_mla_rope_kv_cache(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache,
                                    scale=scale)
    return q, k


mla_rope_kv_cache_triton.working_precision = "float32"
