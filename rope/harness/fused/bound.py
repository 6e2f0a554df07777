"""The fused ops' per-element bounds, derived as docs/tolerance.md derives the rotation's
(rope.harness.rotation.bound: the rotation's own rounding) and docs/spec.md §10 states them:

* QK-norm (working precision fp32, u = 2^-24): the normalized value y_j = x_j w_j / sqrt(S/D + eps)
  of an fp32 implementation is within eps_y |y_j| of the exact one, eps_y = ((D + 1)/2 + 6) u: the
  square sum of D terms in any order ((D - 1) u; the squares of bf16/fp16 values are exact in fp32),
  the mean, + eps and the root (halved under the root: (D + 1)/2 u), the reciprocal, an rsqrt of up to
  2 ulp, and the two products.  A rotated channel then carries eps_y (|y_a||c| + |y_b||s|) besides the
  rotation's own rounding; a pass-through channel eps_y |y_j| and the store's rounding.
* FP8 store: the code of fl32(x / scale), x the implementation's rounded value, within half the FP8
  spacing at |expected| + delta, plus delta, of the reference's value / scale, where delta bounds the
  implementation's value error over the scale plus the fp32 division's rounding.  Saturation is
  1-Lipschitz, so the reference's clamped quotient is held to the same bound.
"""

from __future__ import annotations

import torch

from reference.rotation import pair_indices, select_cos_sin
from rope.harness.rotation.bound import SUBNORMAL_SPACING, UNIT_ROUNDOFF, compare_rotation
from rope.spec import RopeSpec

__all__ = ["U32", "UNIT_ROUNDOFF", "fp8_bound", "fp8_half_spacing", "qk_norm_bound", "rotation_within_bound"]

U32 = UNIT_ROUNDOFF[torch.float32]
# FP8: (mantissa bits, smallest normal exponent).
_FP8_FORMAT = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}


def qk_norm_bound(spec: RopeSpec, positions, normed: torch.Tensor, ref: torch.Tensor, cos_sin: torch.Tensor,
                  dtype: torch.dtype, *, rounded_norm: bool = False) -> torch.Tensor:
    """float64 [T, H * D]: the bound of an fp32 implementation's q (or k) against the reference
    ``ref``, given the exact normalized, unrotated heads ``normed`` (reference.fused.rms_norm_heads).
    ``rounded_norm``: the implementation rounds the normalized value to ``dtype`` before rotating it
    (one rounding more: u_o |y| on top of eps_y)."""
    d = spec.head_size
    u_o = UNIT_ROUNDOFF[dtype] if dtype != torch.float32 else 0.0
    eps_y = ((d + 1) / 2 + 6) * U32 + (u_o * (1 + U32) if rounded_norm else 0.0)
    eta = SUBNORMAL_SPACING[dtype]
    cos, sin = select_cos_sin(spec, positions.cpu(), cos_sin.cpu())
    y = normed.cpu()
    num_tokens = y.shape[0]
    heads = y.abs().reshape(num_tokens, -1, d)
    out = ref.cpu().abs().reshape(heads.shape)
    bound = (eps_y * (1 + u_o) + u_o) * heads + eta                 # pass-through channels
    a_idx, b_idx = pair_indices(spec)
    a, b = heads[..., a_idx], heads[..., b_idx]
    c, s = cos.abs()[:, None, :], sin.abs()[:, None, :]
    for idx, mag in ((a_idx, a * c + b * s), (b_idx, b * c + a * s)):
        r = out[..., idx]
        bound[..., idx] = (eps_y + U32) * (1 + u_o) * mag + (U32 + u_o) * r + 3 * U32 * U32 * mag + eta
    return bound.reshape(y.shape)


def fp8_half_spacing(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the spacing of ``dtype``'s values at each float64 magnitude (the subnormal spacing below
    the smallest normal): the largest error of a round-to-nearest store."""
    mant, emin = _FP8_FORMAT[dtype]
    exponent = torch.floor(torch.log2(magnitude.clamp_min(2.0 ** emin))).clamp_min(emin)
    return torch.pow(2.0, exponent - mant - 1)


def fp8_bound(expected: torch.Tensor, value_error: torch.Tensor, dtype: torch.dtype, *,
              roundings: int = 1) -> torch.Tensor:
    """The bound of a stored FP8 code (decoded) against ``expected`` = value / scale, saturated, when
    the value the implementation quantizes may be off by ``value_error`` / scale already (both float64,
    in the stored units; the fp32 division's rounding is added here).  ``roundings=2``: the value is
    multiplied by the scale's fp32 reciprocal instead (FlashInfer's ``quant_scale``): the reciprocal's
    rounding and the product's."""
    delta = value_error + roundings * U32 * (expected.abs() + value_error)
    return fp8_half_spacing(expected.abs() + delta, dtype) + delta


def rotation_within_bound(spec: RopeSpec, positions, query, key, cos_sin_cache, q_out, k_out, ref_q, ref_k) -> bool:
    """Whether q_out and k_out (None: not compared) are within the rotation's bound of ``ref_q`` and
    ``ref_k``, the float64 rotation of query and key at ``positions`` (float32 working precision):
    the q and k of a fused op held as a rotation, against a reference of the diagnosis' choosing."""
    return compare_rotation(spec, positions, query, key, cos_sin_cache, q_out, k_out, ref_q, ref_k, "float32").ok
