"""QK-norm + RoPE on a packed qkv, one Triton kernel (docs/spec.md, "Fused ops"): every q and k
head of ``qkv`` [T, (Hq + Hk + Hv) * D] divided by its root mean square over all D channels
(``eps`` inside the root), times its weight, then rotated by the spec (1-D RoPE or any M-RoPE map,
NeoX or GPT-J, partial rotary), in place; v untouched.

Entry points: :func:`qk_norm_rope_triton` (the contract's form, spec first: checks, then launches),
:func:`fused_qk_norm_rope` and :func:`fused_qk_norm_mrope` (vLLM's argument order and layout,
``torch.ops._C.fused_qk_norm_rope`` / ``fused_qk_norm_mrope``), :func:`launch_qk_norm_rope` (the
launch alone, tile options exposed: they change which program computes an element, never its bits).

Precision (working precision float32): load, convert to fp32; the square sum in fp32; mean, root
and reciprocal correctly rounded; ``(x * inv_rms) * weight`` in fp32 and never rounded to the
activation dtype (vLLM's CUDA kernel, from TensorRT-LLM, keeps it in registers too; its native
path rounds after the norm and after the weight); rotation in fp32 without FMA contraction; one
rounding at the store (bf16 by hand under the interpreter: rope/triton/rotary_kernel.py).  The
only order-dependent step is the square sum's reduction, whose order the compiler picks: a GPU's
bits may differ from the interpreter's in the last place of that sum, never by more than the bound
of docs/spec.md allows.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from rope.devices import device_name, triton_runs_on
from rope.fused import check_qk_norm_rope_inputs
from rope.spec import RopeSpec
from rope.triton.checked import CheckedCalls
from rope.triton.fused_tiles import head_tile, inverse_rms, program_heads, rotate_pairs, store_pairs
from rope.triton.grid import cdiv, next_power_of_2
from rope.triton.launcher import launch
from rope.triton.rotary_kernel import gather_cos_sin, load_positions, load_tile, round_for_store
from rope.triton.rotary_plan import cache_offsets_need_64, lane_block, map_table
from rope.triton.targets import launch_target

__all__ = ["SUPPORTED_DTYPES", "fused_qk_norm_mrope", "fused_qk_norm_rope", "launch_qk_norm_rope",
           "qk_norm_rope_triton", "tile"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Elements of a program's whole-head tile (tokens x heads x next_pow2(head_size)).  Compiled: a first
# choice, not measured yet (4 warps).  Interpreted: the interpreter's cost is per program, so fewer,
# larger programs.
COMPILED_TILE = 2048
INTERPRETED_TILE = 1 << 19


@triton.jit(do_not_specialize=["num_tokens", "num_q_heads", "num_k_heads", "pos_row_stride", "cache_rows", "sec0",
                               "sec1", "sec2"])
def _qk_norm_rope_kernel(
    qkv_ptr, q_weight_ptr, k_weight_ptr, cache_ptr, pos_ptr, map_ptr,
    qkv_row_stride, cache_row_stride, pos_row_stride, cache_rows,
    num_tokens, num_q_heads, num_k_heads, head_size, half, sec0, sec1, sec2, eps,
    NUM_DIMS: tl.constexpr, INTERLEAVED: tl.constexpr, MAP_TABLE: tl.constexpr, IS_NEOX: tl.constexpr,
    ROUND_BF16: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr,
    BLOCK_D: tl.constexpr, CACHE_I64: tl.constexpr,
):
    # (1) The tile: BLOCK_T tokens x BLOCK_H heads of q (head blocks first) or of k, all channels.
    token, heads, is_k = program_heads(num_q_heads, num_k_heads, BLOCK_T, BLOCK_H)
    token_ok = token < num_tokens
    x_heads = tl.where(is_k, num_k_heads, num_q_heads)
    weight_ptr = tl.where(is_k, k_weight_ptr, q_weight_ptr)
    rows = qkv_ptr + token * qkv_row_stride + tl.where(is_k, num_q_heads, 0).to(tl.int64) * head_size
    out_ty = qkv_ptr.dtype.element_ty
    # (2) Each head's 1 / rms over all head_size channels, pass-through channels included.
    ptrs, mask, chan = head_tile(rows, token_ok, heads, x_heads, head_size, head_size, BLOCK_D)
    x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    inv = inverse_rms(x, token_ok[:, None] & (heads < x_heads)[None, :], head_size, eps)[:, :, None]
    weight = tl.load(weight_ptr + chan, mask=chan < head_size, other=0.0).to(tl.float32)
    # (3) Pass-through channels (>= rotary_dim): normalized and weighted, not rotated.
    y = x * inv * weight[None, None, :]
    tl.store(ptrs, round_for_store(y, ROUND_BF16).to(out_ty), mask=mask & (chan >= 2 * half)[None, None, :])
    # (4) Rotated channels: the pairs (NeoX (i, i + half), GPT-J (2i, 2i + 1)) normalized alike, then
    # rotated by cos/sin of the row each frequency's position row selects (docs/spec.md §2).
    freq = tl.arange(0, BLOCK_F)
    x1, x2 = load_tile(rows, token_ok, heads, x_heads, head_size, freq, half, IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F, "")
    if IS_NEOX:
        w1 = tl.load(weight_ptr + freq, mask=freq < half, other=0.0).to(tl.float32)
        w2 = tl.load(weight_ptr + half + freq, mask=freq < half, other=0.0).to(tl.float32)
    else:
        w1 = tl.load(weight_ptr + 2 * freq, mask=freq < half, other=0.0).to(tl.float32)
        w2 = tl.load(weight_ptr + 2 * freq + 1, mask=freq < half, other=0.0).to(tl.float32)
    y1 = x1.to(tl.float32) * inv * w1[None, None, :]
    y2 = x2.to(tl.float32) * inv * w2[None, None, :]
    pos_0, pos_1, pos_2, pos_3 = load_positions(pos_ptr, pos_row_stride, token, num_tokens, NUM_DIMS)
    cos, sin = gather_cos_sin(cache_ptr, cache_row_stride, cache_rows, pos_0, pos_1, pos_2, pos_3, pos_0, pos_1, pos_2,
                              pos_3, freq, half, map_ptr, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE, BLOCK_T,
                              BLOCK_H, BLOCK_F, 1, False, CACHE_I64, False)
    o1, o2 = rotate_pairs(y1, y2, cos, sin)
    store_pairs(rows, token_ok, heads, x_heads, head_size, freq, half, round_for_store(o1, ROUND_BF16).to(out_ty),
                round_for_store(o2, ROUND_BF16).to(out_ty), IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F)


def tile(num_tokens: int, num_heads: int, head_size: int, compiled: bool, block_t: int | None = None,
         block_h: int | None = None) -> tuple[int, int]:
    """(block_t, block_h): the caller's where given, else the heads there are (up to 8 compiled, 16
    interpreted) and as many tokens as fill the tile's elements (COMPILED_TILE, INTERPRETED_TILE)."""
    budget = COMPILED_TILE if compiled else INTERPRETED_TILE
    if block_h is None:
        block_h = min(next_power_of_2(max(1, num_heads)), 8 if compiled else 16)
    if block_t is None:
        block_t = max(1, min(next_power_of_2(max(1, num_tokens)), budget // (block_h * next_power_of_2(head_size))))
    for name, value in (("block_t", block_t), ("block_h", block_h)):
        if not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{name}={value!r}: must be a power of two >= 1")
    return block_t, block_h


def _sections(spec: RopeSpec) -> tuple[int, int, int]:
    sections = tuple(spec.sections or ()) + (0, 0, 0)
    return sections[0], sections[1], sections[2]


def launch_qk_norm_rope(spec: RopeSpec, positions, qkv, num_heads_q: int, num_heads_k: int, q_weight, k_weight,
                        eps: float, cos_sin_cache, *, block_t: int | None = None, block_h: int | None = None,
                        num_warps: int = 4):
    """Launch without validation (the caller has checked; unit-stride channels and position rows,
    a unit-stride cache row); returns ``qkv``, written in place."""
    num_tokens = qkv.shape[0]
    if num_tokens == 0:
        return qkv
    target = launch_target(qkv.device)
    block_t, block_h = tile(num_tokens, max(num_heads_q, num_heads_k), spec.head_size, target.compiled,
                            block_t, block_h)
    block_f = lane_block(spec)
    table = spec.num_dims > 1 and spec.layout not in ("chunked", "interleaved")
    constexprs = dict(NUM_DIMS=spec.num_dims, INTERLEAVED=spec.num_dims > 1 and spec.layout == "interleaved",
                      MAP_TABLE=table, IS_NEOX=spec.is_neox_style,
                      ROUND_BF16=qkv.dtype == torch.bfloat16 and not target.compiled,
                      BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_F=block_f,
                      BLOCK_D=next_power_of_2(spec.head_size), CACHE_I64=cache_offsets_need_64(cos_sin_cache, block_f))
    if target.compiled:
        constexprs.update(enable_fp_fusion=False, num_warps=num_warps)
    grid = (cdiv(num_tokens, block_t) * (cdiv(num_heads_q, block_h) + cdiv(num_heads_k, block_h)), 1, 1)
    args = (qkv, q_weight, k_weight, cos_sin_cache, positions, map_table(spec, positions.device) if table else positions,
            qkv.stride(0), cos_sin_cache.stride(0), positions.stride(0) if positions.dim() == 2 else 0,
            cos_sin_cache.shape[0], num_tokens, num_heads_q, num_heads_k, spec.head_size, spec.num_freqs,
            *_sections(spec), float(eps))
    launch(_qk_norm_rope_kernel, grid, args, constexprs, (spec, block_t, block_h, qkv.dtype, target, num_warps,
                                                          constexprs["CACHE_I64"]))
    return qkv


# Calls whose metadata passed the entry's checks (rope/triton/checked.py): the same buffers every
# step pay for the checks once (about 50 us of host time a call, more than the kernel at 4096 tokens).
_CHECKED = CheckedCalls()


def qk_norm_rope_triton(spec: RopeSpec, positions, qkv, num_heads_q: int, num_heads_k: int, num_heads_v: int,
                        q_weight, k_weight, eps: float, cos_sin_cache):
    """QK-norm + RoPE in place on ``qkv`` [T, (Hq + Hk + Hv) * D] (any row stride); returns ``qkv``.

    Args:
        positions: int64/int32 [T] (1-D RoPE) or [spec.num_dims, T].
        q_weight, k_weight: [head_size], qkv's dtype.  eps: the RMSNorm epsilon (passed as fp32).
        cos_sin_cache: [>= max position + 1, rotary_dim], cos | sin.
    """
    signature = CheckedCalls.signature((spec, num_heads_q, num_heads_k, num_heads_v, eps),
                                       (positions, qkv, q_weight, k_weight, cos_sin_cache), values_read_from=positions)
    if _CHECKED.get(signature) is None:      # values read (the CPU), or metadata not seen: every check
        check_qk_norm_rope_inputs(spec, positions, qkv, num_heads_q, num_heads_k, num_heads_v, q_weight, k_weight,
                                  eps, cos_sin_cache)
        _check_kernel_limits(qkv)
        _CHECKED.add(signature)
    if cos_sin_cache.stride(1) != 1:
        cos_sin_cache = cos_sin_cache.contiguous()
    if positions.stride(-1) != 1:
        positions = positions.contiguous()
    return launch_qk_norm_rope(spec, positions, qkv, num_heads_q, num_heads_k, q_weight.contiguous(),
                               k_weight.contiguous(), eps, cos_sin_cache)


def _check_kernel_limits(qkv) -> None:
    if qkv.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"qkv.dtype={qkv.dtype}: the Triton kernel supports {SUPPORTED_DTYPES}")
    if qkv.shape[1] and qkv.stride(1) != 1:
        raise ValueError(f"qkv.stride()={qkv.stride()}: channels must have stride 1 (the op writes qkv in place)")
    if not triton_runs_on(device_name(qkv.device)):
        raise ValueError(f"qkv.device={qkv.device}: Triton needs a GPU tensor here, or TRITON_INTERPRET=1")


@functools.lru_cache(maxsize=256)
def _vllm_spec(head_dim: int, rotary_dim: int, is_neox: bool, rows: int, sections, interleaved: bool) -> RopeSpec:
    return RopeSpec(head_size=head_dim, rotary_dim=rotary_dim, is_neox_style=is_neox, sections=sections,
                    layout="interleaved" if interleaved else "chunked", max_position=rows)


def fused_qk_norm_rope(qkv, num_heads_q: int, num_heads_k: int, num_heads_v: int, head_dim: int, eps: float,
                       q_weight, k_weight, cos_sin_cache, is_neox: bool, position_ids) -> None:
    """vLLM's ``fused_qk_norm_rope`` (argument order and layout): 1-D ``position_ids`` [T]; the
    rotary dim is the cache's width.  In place on ``qkv``."""
    if not isinstance(cos_sin_cache, torch.Tensor) or cos_sin_cache.dim() != 2:
        raise ValueError("cos_sin_cache: must be a [max_position, rotary_dim] tensor")
    spec = _vllm_spec(head_dim, cos_sin_cache.shape[1], is_neox, cos_sin_cache.shape[0], None, False)
    qk_norm_rope_triton(spec, position_ids, qkv, num_heads_q, num_heads_k, num_heads_v, q_weight, k_weight, eps,
                        cos_sin_cache)


def fused_qk_norm_mrope(qkv, num_heads_q: int, num_heads_k: int, num_heads_v: int, head_dim: int, eps: float,
                        q_weight, k_weight, cos_sin_cache, is_neox: bool, position_ids, mrope_section_t: int,
                        mrope_section_h: int, mrope_interleaved: bool = False) -> None:
    """vLLM's ``fused_qk_norm_mrope``: ``position_ids`` [3, T] (T, H, W); sections (s_t, s_h,
    rotary_dim/2 - s_t - s_h), chunked or Qwen3-VL interleaved (docs/spec.md §2).  In place on ``qkv``."""
    if not isinstance(cos_sin_cache, torch.Tensor) or cos_sin_cache.dim() != 2:
        raise ValueError("cos_sin_cache: must be a [max_position, rotary_dim] tensor")
    half = cos_sin_cache.shape[1] // 2
    sections = (mrope_section_t, mrope_section_h, half - mrope_section_t - mrope_section_h)
    spec = _vllm_spec(head_dim, cos_sin_cache.shape[1], is_neox, cos_sin_cache.shape[0], sections,
                      bool(mrope_interleaved))
    qk_norm_rope_triton(spec, position_ids, qkv, num_heads_q, num_heads_k, num_heads_v, q_weight, k_weight, eps,
                        cos_sin_cache)


qk_norm_rope_triton.working_precision = "float32"
