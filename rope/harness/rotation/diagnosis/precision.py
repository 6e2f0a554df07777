"""Whether the errors fit a lower working precision than declared: the looser bound, and the
precisions tried."""

from __future__ import annotations

import torch

from rope.harness.rotation.diagnosis.verdict import LOWER_PRECISIONS, LOWER_PRECISION_SLACK
from rope.harness.rotation.bound import rotation_bound, unit_roundoff, working_dtype
from rope.spec import RopeSpec


# --------------------------------------------------------------------------- precision
def loose_bound(spec: RopeSpec, cos, sin, x, exp, precision: torch.dtype, out_dtype: torch.dtype) -> torch.Tensor:
    """The bound of computing everything (pass-through channels included) in ``precision``,
    from inputs rounded to it: SLACK x rope.harness.rotation.bound's bound, plus the store in out_dtype."""
    bound = rotation_bound(spec, x, exp, cos, sin, precision, "activation")
    bound = LOWER_PRECISION_SLACK * bound + unit_roundoff(out_dtype) * exp.abs()
    heads = bound.view(bound.shape[0], -1, spec.head_size)
    heads[..., spec.rotary_dim:] += unit_roundoff(precision) * exp.reshape(heads.shape)[..., spec.rotary_dim:].abs()
    return bound


def fitting_precision(spec, cos, sin, tensors, errors, precision, out_dtype):
    """The first precision lower than the declared one whose loose bound covers every error.
    ``tensors``: [(name, input x, float64 expected)]; ``errors``: name -> |got - expected|;
    ``cos``/``sin``: float64 [T, spec.num_freqs], what the expected values were rotated by."""
    declared = working_dtype(precision, out_dtype)
    for cand in LOWER_PRECISIONS:
        if unit_roundoff(cand) <= unit_roundoff(declared):
            continue
        # An exact element fits any bound (also where the bound of a non-finite value is NaN).
        if all(bool(((errors[name] <= loose_bound(spec, cos, sin, x, exp, cand, out_dtype)) | (errors[name] == 0)).all())
               for name, x, exp in tensors):
            return cand
    return None


def is_write_problem(problem: str) -> bool:
    """A write outside q/k: inputs or guards modified, traced out-of-bounds / wild / read-only writes."""
    return "modified" in problem or "write(s)" in problem


def is_view_write_problem(problem: str) -> bool:
    """A write to q's and k's buffer outside their views: V's heads, the gaps between rows
    (rope.harness.rotation.check.outside_view_problems), or a same-buffer view left holding neither its
    input nor the returned output (check.in_place_problems)."""
    return "write outside q/k" in problem or "holds neither its input nor the output" in problem


def is_read_problem(problem: str) -> bool:
    """A traced read outside an input: guard elements, wild or misaligned reads."""
    return "read(s)" in problem or "misaligned-read" in problem


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
