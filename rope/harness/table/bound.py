"""The per-element bound a table implementation is held to (docs/spec.md §1.2 derives it).

An engine builds the table in float32 and casts it; the float64 reference (reference.cos_sin_table)
is exact to float64.  Element (p, i) of the cos or sin half, with f the reference frequency, m the
attention factor and u = 2^-24 (float32's unit roundoff), may depart by

* the frequency's float32 error, ``e_f = k_i u f`` (:func:`frequency_error`: the power, the
  reciprocal, the factor, YaRN's ramp, Llama 3's band blend, mixed NTK's exponential), carried
  into the angle p f times the position: ``p e_f``;
* the product p x f rounded to float32: ``u p f`` (p itself is exact in float32 below 2^24);
* cos / sin of that float32 argument: 2 ulp of a value in [-1, 1], ``2u`` (the angle's error passes
  through unchanged, |d cos| <= |d theta|);
* the attention factor rounded to float32 and the product rounded: ``2u m`` on top of m times
  the above;
* the cast to the activation dtype: half an ulp at the value's magnitude, ``u_d (|v| + e32)`` with
  u_d = 2^-8 (bfloat16), 2^-11 (float16), 0 (float32), plus half of float16's smallest subnormal.

The angle terms grow with the position: at p = 2^20 and f = 1 the product alone is 2^-4 rad.
"""

from __future__ import annotations

import math

import torch

from reference.table import yarn_ramp_bounds
from rope.spec import RopeSpec

__all__ = ["U32", "cast_unit", "element_bound", "frequency_error"]

U32 = 2.0 ** -24
_CAST = {torch.float32: (0.0, 0.0), torch.bfloat16: (2.0 ** -8, 2.0 ** -134), torch.float16: (2.0 ** -11, 2.0 ** -25)}


def cast_unit(dtype: torch.dtype) -> tuple[float, float]:
    """(relative, absolute) half-ulp of a cast from float32 to ``dtype``."""
    return _CAST[dtype]


def frequency_error(spec: RopeSpec, reference_inv: list[float]) -> list[float]:
    """Per frequency, how far a float32 evaluation of the spec's recipe (rope.cache's, transformers')
    may lie from the float64 value f, first order in u: the plain power base ** (2i/R) and its
    reciprocal, k = 8 + 2 |2i/R ln base| (the exponent's rounding amplified by ln base, a few more
    roundings); YaRN's ramp (4 + 2 |low| / (high - low)) u times up to s f; Llama 3's band
    parameter (k + 4) u (L0 / w + low) / (high - low) times up to s f; mixed NTK's exponential
    4 u |ln s| ((i + 1) / (R/2)) ** b."""
    s, rd = spec.scaling, spec.rotary_dim
    base = spec.effective_base if s is None else spec.base
    if s is not None and s.rope_type == "dynamic":
        length = max(spec.max_position, s.original_max_position)
        base = base * (s.factor * length / s.original_max_position - (s.factor - 1)) ** (rd / (rd - 2))
    if s is not None and s.rope_type == "ntk":
        base = base * s.factor
    ramp_error = 0.0
    if s is not None and s.rope_type in ("yarn", "deepseek_yarn"):
        low, high = yarn_ramp_bounds(spec)
        ramp_error = 4 + 2 * abs(low) / max(high - low, 0.001)
    factor = 1.0 if s is None or s.factor is None else s.factor
    amplified = max(factor, 1 / factor)
    out = []
    for i, f in enumerate(reference_inv):
        k = 8 + 2 * abs(2 * i / rd * math.log(base))
        terms = k + ramp_error * amplified
        if s is not None and s.rope_type == "llama3" and f > 0:
            reach = (s.original_max_position * f / (2 * math.pi) + s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor)
            terms += (k + 4) * reach * amplified
        if s is not None and s.rope_type == "ntk" and s.mixed_b is not None:
            terms += 4 * abs(math.log(s.factor)) * ((i + 1) / (rd / 2)) ** s.mixed_b
        out.append(terms * U32 * abs(f))
    return out


def element_bound(spec: RopeSpec, rows: torch.Tensor, reference_inv: torch.Tensor, factor: float,
                  reference_rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 [len(rows), R]: the bound of each compared element (the module's derivation)."""
    p = rows.to(torch.float64)[:, None]
    f = reference_inv.abs()[None, :]
    e_f = torch.tensor(frequency_error(spec, reference_inv.tolist()), dtype=torch.float64)[None, :]
    angle = p * e_f + U32 * p * f
    e32 = abs(factor) * (angle + 2 * U32) + 2 * U32 * abs(factor)
    e32 = torch.cat((e32, e32), dim=-1)
    relative, absolute = cast_unit(dtype)
    return e32 + relative * (reference_rows.abs() + e32) + absolute
