"""The ``@triton.jit`` helpers the fused-op kernels (rope/triton/fused_qk_norm_rope.py,
rope/triton/rope_kv_cache.py) share beside the rotation kernel's own (rope/triton/rotary_kernel.py:
the pair loads, the positions, the cos/sin gather, the bf16 rounding at the store): the rotation of
loaded pairs, the store of pairs already in their storage type at any head stride (a paged cache's
heads are not ``head_size`` apart in the HND layout), whole-head tiles, the inverse RMS of heads,
the program's place in a q-then-k grid, and the FP8 store's value.

Precision contract (docs/spec.md §3 and "Fused ops"): fp32 arithmetic, no FMA contraction (the
launches pass ``enable_fp_fusion=False``), divisions and square roots correctly rounded
(``tl.div_rn``, ``tl.sqrt_rn``: the compiled default for fp32 ``/`` is an approximation), and one
rounding to each storage type, done by bit arithmetic where Triton's interpreter converts wrongly
(bf16: rotary_kernel's ``round_for_store``; FP8: :func:`fp8_code`, used compiled too, so the bits
do not depend on the backend).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["fp8_code", "head_tile", "inverse_rms", "program_heads", "rotate_pairs", "store_pairs", "to_fp8"]


@triton.jit
def _rotate_pairs(x1, x2, cos, sin):
    """The rotated pairs in fp32, ``o1 = x1*cos - x2*sin``, ``o2 = x2*cos + x1*sin`` (docs/spec.md §3),
    the products rounded before the sum as in the rotation kernel."""
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _store_pairs(row_ptrs, row_ok, heads, num_heads, head_stride, freq, half, v1, v2, IS_NEOX: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr):
    """Store pairs [BLOCK_T, BLOCK_H, BLOCK_F], already of the pointers' type, where the rotation
    kernel's ``load_tile`` reads them: NeoX channels (i, i + half), GPT-J (2i, 2i + 1) joined into one
    contiguous run.  ``row_ptrs`` [BLOCK_T] point at each token's head 0; ``row_ok`` [BLOCK_T]."""
    head_base = row_ptrs[:, None, None] + heads[None, :, None] * head_stride
    ok = row_ok[:, None, None] & (heads[None, :, None] < num_heads)
    if IS_NEOX:
        mask = ok & (freq < half)[None, None, :]
        tl.store(head_base + freq[None, None, :], v1, mask=mask)
        tl.store(head_base + half + freq[None, None, :], v2, mask=mask)
    else:
        chan = tl.arange(0, 2 * BLOCK_F)
        mask = ok & (chan < 2 * half)[None, None, :]
        tl.store(head_base + chan[None, None, :], tl.reshape(tl.join(v1, v2), (BLOCK_T, BLOCK_H, 2 * BLOCK_F)),
                 mask=mask)


@triton.jit
def _head_tile(row_ptrs, row_ok, heads, num_heads, head_stride, head_size, BLOCK_D: tl.constexpr):
    """Pointers [BLOCK_T, BLOCK_H, BLOCK_D] to whole heads, their mask, and the channel index [BLOCK_D]."""
    chan = tl.arange(0, BLOCK_D)
    ptrs = row_ptrs[:, None, None] + heads[None, :, None] * head_stride + chan[None, None, :]
    mask = row_ok[:, None, None] & (heads[None, :, None] < num_heads) & (chan < head_size)[None, None, :]
    return ptrs, mask, chan


@triton.jit
def _inverse_rms(x, head_ok, head_size, eps):
    """1 / sqrt(mean(x^2) + eps) per head of an fp32 tile [BLOCK_T, BLOCK_H, BLOCK_D] (masked
    channels hold 0): the square sum in fp32 (exact squares for bf16/fp16 inputs, the sum in the
    reduction's order), the mean, the root and the reciprocal each rounded correctly.  Heads outside
    ``head_ok`` [BLOCK_T, BLOCK_H] (the tile past the batch or the heads) take 1."""
    square_sum = tl.sum(x * x, axis=2)
    mean = tl.div_rn(square_sum, tl.full(square_sum.shape, head_size, tl.float32))
    root = tl.where(head_ok, tl.sqrt_rn(mean + eps), 1.0)
    return tl.div_rn(tl.full(root.shape, 1.0, tl.float32), root)


@triton.jit
def _program_heads(num_q_heads, num_kv_heads, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """This program's tile on a 1-D grid of token blocks x (q head blocks, then k head blocks), head
    blocks fastest: (token [BLOCK_T] int64, heads [BLOCK_H] within its tensor, whether they are k's)."""
    q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
    head_blocks = q_blocks + tl.cdiv(num_kv_heads, BLOCK_H)
    token_block = tl.program_id(0) // head_blocks
    head_block = tl.program_id(0) % head_blocks
    is_k = head_block >= q_blocks
    heads = (head_block - tl.where(is_k, q_blocks, 0)) * BLOCK_H + tl.arange(0, BLOCK_H)
    token = token_block.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    return token, heads, is_k


@triton.jit
def _fp8_code(x, E5M2: tl.constexpr):
    """The FP8 code (uint8) of fp32 ``x``: round to nearest even, saturated to the largest finite
    value (|x| >= 448 for e4m3fn, 57344 for e5m2, infinities too: CUDA's __NV_SATFINITE), NaN to
    0x7F with x's sign (torch's code), subnormals rounded at their fixed spacing.  Integer
    arithmetic only: the interpreter's own fp32 -> fp8 convert does not round correctly.

    (1) |x| clamped to the largest finite value as fp32 bits (order-preserving for non-NaN);
    (2) normal range of the format (|x| >= 2^(1 - BIAS)): drop 23 - MANT mantissa bits with
    round-to-nearest-even (a carry moves into the exponent), then re-bias the exponent;
    (3) below it: the significand with its hidden bit shifted right to the subnormal spacing
    2^(1 - BIAS - MANT), rounded to nearest even on the bits shifted out (a carry into bit MANT
    is the smallest normal's code, as it should be)."""
    MANT: tl.constexpr = 2 if E5M2 else 3
    BIAS: tl.constexpr = 15 if E5M2 else 7
    MAX_BITS: tl.constexpr = 0x47600000 if E5M2 else 0x43E00000      # 57344.0, 448.0
    SHIFT: tl.constexpr = 23 - MANT
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    is_nan = magnitude > 0x7F800000
    a = tl.minimum(magnitude, MAX_BITS)
    exponent = (a >> 23).to(tl.int32)
    normal = ((a + ((1 << (SHIFT - 1)) - 1) + ((a >> SHIFT) & 1)) >> SHIFT) - ((127 - BIAS) << MANT)
    significand = (a & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum((150 + 1 - BIAS - MANT) - exponent, 1), 31).to(tl.uint32)
    kept = significand >> shift
    rest = significand & ((tl.full(shift.shape, 1, tl.uint32) << shift) - 1)
    halfway = tl.full(shift.shape, 1, tl.uint32) << (shift - 1)
    up = (rest > halfway) | ((rest == halfway) & ((kept & 1) == 1))
    subnormal = kept + up.to(tl.uint32)
    code = tl.where(exponent >= 127 + 1 - BIAS, normal, subnormal)
    code = tl.where(is_nan, 0x7F, code)
    return (code | sign).to(tl.uint8)


@triton.jit
def _to_fp8(value, scale, E5M2: tl.constexpr):
    """The code an FP8 cache stores for ``value`` (any float type) with per-tensor ``scale`` (fp32):
    ``fp8(fl32(value / scale))``, the division correctly rounded (docs/spec.md, "Fused ops")."""
    v = value.to(tl.float32)
    return _fp8_code(tl.div_rn(v, tl.full(v.shape, 1.0, tl.float32) * scale), E5M2)


# The public names (the jit functions keep their ``_name``s: the compiled kernels' source text).
rotate_pairs = _rotate_pairs
store_pairs = _store_pairs
head_tile = _head_tile
inverse_rms = _inverse_rms
program_heads = _program_heads
fp8_code = _fp8_code
to_fp8 = _to_fp8
