"""Where a table departs from the reference, and what the departure looks like.

:func:`diagnose` names the pattern of the compared rows (first rule that holds wins), each label one
way engines have built the table wrong (docs/spec.md §1.1-§1.2):

===========================  ================================================================================
label                        what the implementation returned
===========================  ================================================================================
table_too_short              fewer rows than the positions admitted (vllm#55910: NTK's cache sized for the
                             unscaled length); checked on the shape, before any value
rounded_to_activation_dtype  a float32 table whose every value is a bfloat16 or float16 one: built or kept
                             in the activation dtype where the engine hands the kernel float32
mscale_missing               the reference divided by the attention factor (YaRN's mscale, LongRoPE's
                             magnitude never multiplied in)
mscale_twice                 the reference times the attention factor (the magnitude applied twice)
layout_wrong                 the right values in another layout: sin | cos, or cos and sin interleaved per
                             frequency (GPT-J's pairs where the contract has halves)
frequencies_wrong            cos and sin of the right magnitude at wrong angles: named with the worst
                             frequency index and the frequency read back from row 1
values_wrong                 anything else
===========================  ================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["LABELS", "TableMismatch", "diagnose"]

LABELS = ("table_too_short", "rounded_to_activation_dtype", "mscale_missing", "mscale_twice", "layout_wrong",
          "frequencies_wrong", "values_wrong")


@dataclass(frozen=True)
class TableMismatch:
    label: str
    sentence: str
    worst_row: int | None = None
    worst_column: int | None = None

    def describe(self) -> str:
        return f"diagnosis: {self.label}: {self.sentence}"


def _within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> bool:
    return bool(((got - want).abs() <= bound).all())


def _representable(got32: torch.Tensor) -> str | None:
    for dtype in (torch.bfloat16, torch.float16):
        if torch.equal(got32.to(dtype).to(torch.float32), got32):
            return str(dtype).replace("torch.", "")
    return None


def _interleaved(ref: torch.Tensor) -> torch.Tensor:
    half = ref.shape[-1] // 2
    return torch.stack((ref[:, :half], ref[:, half:]), dim=-1).reshape(ref.shape)


def _frequency_rule(rows, got, ref, bound, inv_freq, factor) -> TableMismatch | None:
    half = ref.shape[-1] // 2
    radius = (got[:, :half] ** 2 + got[:, half:] ** 2).sqrt()
    if not bool(((radius - abs(factor)).abs() <= 2 * (bound[:, :half] + bound[:, half:]) + 1e-2).all()):
        return None
    excess = ((got - ref).abs() - bound).clamp(min=0)
    per_freq = torch.maximum(excess[:, :half].amax(0), excess[:, half:].amax(0))
    i = int(per_freq.argmax())
    shown = ""
    one = (rows == 1).nonzero()
    if len(one):
        r = int(one[0])
        read = math.atan2(float(got[r, half + i]), float(got[r, i]))
        shown = f": row 1 reads {read:.6g} rad per position, the reference {float(inv_freq[i]):.6g}"
    wrong = int((per_freq > 0).sum())
    return TableMismatch("frequencies_wrong", f"{wrong} of {half} frequencies at wrong angles; the worst is "
                         f"frequency {i}{shown}", worst_column=i)


def diagnose(rows: torch.Tensor, got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, *, dtype: torch.dtype,
             returned_dtype: torch.dtype, inv_freq: torch.Tensor, factor: float) -> TableMismatch:
    """Name the departure of ``got`` (float64 [rows, R], the implementation's sampled rows) from ``ref``."""
    excess = (got - ref).abs() - bound
    flat = int(excess.argmax())
    worst_row, worst_column = int(rows[flat // ref.shape[-1]]), flat % ref.shape[-1]
    where = dict(worst_row=worst_row, worst_column=worst_column)
    if dtype == torch.float32 and returned_dtype == torch.float32:
        narrow = _representable(got.to(torch.float32))
        if narrow is not None:
            return TableMismatch("rounded_to_activation_dtype", f"every value of the float32 table is a {narrow} "
                                 f"value: rounded to the activation dtype before it was handed on", **where)
    if factor != 1.0 and _within(got, ref / factor, bound + ref.abs() * 2.0 ** -20):
        return TableMismatch("mscale_missing", f"the table is the reference divided by the attention factor "
                             f"{factor:.9g}: the magnitude was never multiplied in", **where)
    if factor != 1.0 and _within(got, ref * factor, bound * abs(factor) + ref.abs() * 2.0 ** -20):
        return TableMismatch("mscale_twice", f"the table is the reference times the attention factor {factor:.9g}: "
                             f"the magnitude applied twice", **where)
    half = ref.shape[-1] // 2
    swapped = torch.cat((ref[:, half:], ref[:, :half]), dim=-1)
    if _within(got, swapped, torch.cat((bound[:, half:], bound[:, :half]), dim=-1)):
        return TableMismatch("layout_wrong", "sin | cos: the halves swapped", **where)
    if _within(got, _interleaved(ref), _interleaved(bound)):
        return TableMismatch("layout_wrong", "cos and sin interleaved per frequency (c0 s0 c1 s1 ...) where the "
                             "contract has the halves cos | sin", **where)
    found = _frequency_rule(rows, got, ref, bound, inv_freq, factor)
    if found is not None:
        return TableMismatch(found.label, found.sentence, worst_row, found.worst_column)
    return TableMismatch("values_wrong", f"row {worst_row}, column {worst_column} off by "
                         f"{float((got - ref).abs().flatten()[flat]):.3g} (bound {float(bound.flatten()[flat]):.3g})",
                         **where)
