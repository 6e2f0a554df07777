"""What a diagnosis says: the labels, the thresholds the rules share, and :class:`Diagnosis` (a
label, one sentence and the location of the mismatched elements)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


LABELS = (
    "match", "wrong_output", "writes_outside", "wrote_outside_view", "nan", "out_of_bounds_read", "pairing_swapped",
    "cos_sin_misused", "table_misread", "axis_map_wrong", "section_boundary_shifted", "position_rows_swapped",
    "position_rows_misread", "row_stride_ignored", "view_misread", "partial_rotary_stride", "pair_rows_split",
    "wrong_positions", "pass_through_touched", "precision_loss", "angle_error", "key_only", "query_only", "head_subset",
    "token_subset", "unknown",
)
# An alternative configuration explains the output when it leaves at most this share of the
# original mismatches (1%: a kernel may be wrong in one way and slightly imprecise as well).
ALTERNATIVE_RESIDUE = 0.01
# ... and when it is known (not read past the cache) at this share of the original mismatches at
# least: a read past the cache is unknowable, the rest of the output still tells the configuration.
ALTERNATIVE_KNOWN = 0.1
# Inputs rounded to the lower precision add about two unit roundoffs per product to the bound
# of computing in it (rope.harness.rotation.bound); 4x covers that.
LOWER_PRECISION_SLACK = 4.0
# A worst error/bound ratio up to this is "modest": one extra rounding or a truncating store.
MODEST_RATIO = 4.0
LOWER_PRECISIONS = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Diagnosis:
    """The likely cause of a mismatch: ``label`` (one of LABELS), one ``sentence``, and
    ``location``: tensor name -> summary of where its mismatched elements are."""
    label: str
    sentence: str
    location: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"diagnosis: {self.label}: {self.sentence}"]
        for name, where in self.location.items():
            out.append(f"  where: {name}: " + "; ".join(f"{k} {v}" for k, v in where.items()))
        return out

    def to_dict(self) -> dict:
        return {"label": self.label, "sentence": self.sentence, "location": self.location}

    @classmethod
    def from_dict(cls, d: dict) -> "Diagnosis":
        return cls(d["label"], d["sentence"], dict(d.get("location") or {}))
