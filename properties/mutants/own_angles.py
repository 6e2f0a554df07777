"""Implementations that compute their own angles in float32 (declared ``angles = "own-float32"``), as
llama.cpp's ggml and kernels built with fast math do: a correct one and the fast-math mutant.

Both take the angle of pair i as ``fl32(p * fl32(f_i))`` (f: the spec's float64 frequencies, the
scaled ones for a scaled spec) and multiply cos and sin by the spec's attention factor in float32;
they differ in the sine and cosine:

* :func:`range_reduced_angles` calls torch's float32 ``cos`` / ``sin``, which reduce the argument
  exactly (within an ulp of the true value at any argument);
* :func:`fast_math_angles` reduces it the way ``__sinf`` / ``__cosf`` under ``-use_fast_math`` do: one
  float32 multiple of 2 pi subtracted, ``r = x - fl32(k * fl32(2 pi))`` with ``k = rint(x / 2 pi)``,
  then an exact sine of r.  r misses by up to ``k * |2 pi - fl32(2 pi)| + ulp(x) / 2``: here 8e-5 at
  x = 4096, 2e-3 at 131,071 and 1e-2 near 2^20 (kekzl/imp#1316 measured ``__sinf`` 3e-6 off at 40
  and 1e-2 at 131,071), where pair 0's angle is the position itself, exact in float32.
"""

from __future__ import annotations

import math

import torch

from reference.rotation import exact_attention_factor, exact_frequencies
from rope.native import apply_rotation
from rope.spec import RopeSpec, check_rotation_inputs

__all__ = ["fast_math_angles", "float32_cos_sin", "range_reduced_angles"]

_TWO_PI = torch.tensor(2 * math.pi, dtype=torch.float32)


def float32_cos_sin(spec: RopeSpec, positions: torch.Tensor, *, fast_math: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin as float32 [T, rotary_dim/2], computed in float32 from the positions (module docstring)."""
    rows = positions.reshape(spec.num_dims, -1).cpu()[torch.tensor(spec.axis_map())].T     # [T, F]
    theta = rows.to(torch.float32) * exact_frequencies(spec).to(torch.float32)
    if fast_math:
        k = torch.round(theta / _TWO_PI)
        theta = theta - k * _TWO_PI               # every step rounded to float32, as the hardware does
    m = torch.tensor(exact_attention_factor(spec), dtype=torch.float32)
    return theta.cos() * m, theta.sin() * m


def _rotate(spec, positions, query, key, cache, *, fast_math: bool):
    check_rotation_inputs(spec, positions, query, key, cache, check_values=True)
    cos, sin = (t.to(query.device) for t in float32_cos_sin(spec, positions, fast_math=fast_math))
    q = apply_rotation(spec, query.to(torch.float32), cos, sin).to(query.dtype)
    k = None if key is None else apply_rotation(spec, key.to(torch.float32), cos, sin).to(key.dtype)
    return q, k


def range_reduced_angles(spec, positions, query, key, cache):
    """Its own float32 angles with exactly reduced float32 cos / sin: inside the own-angle bound."""
    return _rotate(spec, positions, query, key, cache, fast_math=False)


def fast_math_angles(spec, positions, query, key, cache):
    """Computes its own float32 angles and reduces them as fast-math ``__sinf`` does (one float32
    multiple of 2 pi subtracted): pair 0 is 8e-5 off at position 4096, 2e-3 at 131,071 (kekzl/imp#1316)."""
    return _rotate(spec, positions, query, key, cache, fast_math=True)


for _fn in (range_reduced_angles, fast_math_angles):
    _fn.angles = "own-float32"
