"""What the rules share: the inputs, outputs, reference and comparison, and what several rules need
(each computed on first use)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from rope.harness.rotation.diagnosis.alternatives import (alternative_result, axis_map_alternatives,
                                                          cos_sin_alternatives, pair_rows_split_alternatives,
                                                          table_alternatives,
                                                          pairing_alternatives, partial_rotary_alternatives,
                                                          row_misread_alternatives, row_order_alternatives,
                                                          row_stride_alternatives, section_boundary_alternatives,
                                                          view_misread_alternatives)
from rope.harness.rotation.diagnosis.locations import mismatch_locations
from rope.harness.rotation.diagnosis.precision import dtype_name, is_read_problem, loose_bound
from rope.harness.rotation.diagnosis.verdict import Diagnosis, LOWER_PRECISIONS
from rope.harness.rotation.bound import Comparison, compare_rotation, working_dtype
from rope.spec import RopeSpec
from reference.rotation import rotate, select_cos_sin


# --------------------------------------------------------------------------- context
class _Lazy:
    """The items of an iterator, computed on demand and kept: a rule that stops at its first hit
    leaves the rest uncomputed, a later rule that walks them all sees the same items."""

    def __init__(self, items):
        self._items, self._seen = iter(items), []

    def __iter__(self):
        i = 0
        while True:
            if i == len(self._seen):
                try:
                    self._seen.append(next(self._items))
                except StopIteration:
                    return
            yield self._seen[i]
            i += 1


# label -> the neighbouring configurations of that label, for a Context; in rule order (6-16).
# The positions-level ones use only the cache rows the positions use (Context.used_positions);
# the partial rotary and pair-split ones the full cache (a sin read past its row lands in the next).
NEIGHBOURS = {
    "pairing_swapped": lambda c: pairing_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "cos_sin_misused": lambda c: cos_sin_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "table_misread": lambda c: table_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "axis_map_wrong": lambda c: axis_map_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "section_boundary_shifted": lambda c: section_boundary_alternatives(
        c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "position_rows_swapped": lambda c: row_order_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "position_rows_misread": lambda c: row_misread_alternatives(
        c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "row_stride_ignored": lambda c: row_stride_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "view_misread": lambda c: view_misread_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "partial_rotary_stride": lambda c: partial_rotary_alternatives(c.spec, c.rows, c.query, c.key, c.cache),
    "pair_rows_split": lambda c: pair_rows_split_alternatives(c.spec, c.rows, c.query, c.key, c.cache),
}


@dataclass
class _Gross:
    """The mismatch judged on gross errors only: beyond the coarsest lower precision's rounding."""
    where: dict           # name -> _Where: of its gross errors where it has any, else of its mismatches
    location: dict        # Context.location, with the gross errors' summary where they are fewer
    grossly: list         # the tensors with gross errors (every mismatched one when none has any)
    rounding_note: str    # names the tensors that differ only by rounding ('' when none does)


@dataclass(eq=False)
class Context:
    """What the rules look at, built once per diagnosis (:meth:`build`).  The fields are given;
    the properties are computed on first use and shared, so a rule pays only for what it reads."""
    spec: RopeSpec
    positions: torch.Tensor            # CPU, as given: rows into ``cache``
    query: torch.Tensor                # untouched CPU inputs, with the strides the implementation saw
    key: torch.Tensor | None
    cache: torch.Tensor                # CPU, the whole cos/sin cache
    out_q: torch.Tensor | None         # the implementation's outputs (any device)
    out_k: torch.Tensor | None
    precision: str                     # its declared working precision
    ref_q: torch.Tensor | None         # float64 CPU reference outputs
    ref_k: torch.Tensor | None
    comparison: Comparison
    angles: str = "cache"              # where its angles come from: "cache" or "own-float32"
    _neighbours: dict = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def build(cls, spec: RopeSpec, positions, query, key, cos_sin_cache, out_q, out_k, *,
              precision: str = "float32", ref=None, comparison: Comparison | None = None,
              angles: str = "cache") -> "Context":
        """:func:`diagnose`'s arguments; ``ref`` and ``comparison`` are computed when not given."""
        cpu = torch.device("cpu")
        positions, cache = positions.to(cpu), cos_sin_cache.to(cpu)
        if ref is None:
            ref = rotate(spec, positions, query, key, cache)
        ref_q, ref_k = (None if r is None else r.to(cpu, torch.float64) for r in ref)
        if comparison is None:
            comparison = compare_rotation(spec, positions, query, key, cache, out_q, out_k, ref_q, ref_k, precision)
        return cls(spec, positions, query, key, cache, out_q, out_k, precision, ref_q, ref_k, comparison, angles)

    # ----- where the mismatch is
    @cached_property
    def inputs(self) -> dict:
        """name -> (input, output, float64 reference), for query and key."""
        return {"query": (self.query, self.out_q, self.ref_q), "key": (self.key, self.out_k, self.ref_k)}

    @cached_property
    def where(self) -> dict:
        """name -> _Where of its mismatched elements (error > bound), per compared tensor."""
        c = self.comparison
        return {name: mismatch_locations(self.spec, c.errors[name] > c.bounds[name]) for name in c.errors}

    @cached_property
    def location(self) -> dict:
        """name -> summary of its mismatched elements, for the tensors that have any."""
        return {name: w.summary(self.spec) for name, w in self.where.items() if w.count}

    @cached_property
    def wrong(self) -> list:
        """The names of the tensors with mismatched elements."""
        return [name for name, w in self.where.items() if w.count]

    @cached_property
    def touched(self) -> dict:
        """name -> _Where, for the tensors with mismatched pass-through channels."""
        return {name: w for name, w in self.where.items() if w.pass_through}

    @cached_property
    def rotary_wrong(self) -> bool:
        return any(w.freqs for w in self.where.values())

    def found(self, label: str, sentence: str) -> Diagnosis:
        """A diagnosis located at every mismatched element."""
        return Diagnosis(label, sentence, self.location)

    def found_gross(self, label: str, sentence: str) -> Diagnosis:
        """A diagnosis located at the gross errors (:attr:`gross`)."""
        return Diagnosis(label, sentence, self.gross.location)

    # ----- problems the comparison and the guards report
    @cached_property
    def reads(self) -> list[str]:
        """Traced reads outside an input (rope/harness/guards.py)."""
        return [p for p in self.comparison.problems if is_read_problem(p)]

    @cached_property
    def planted_nonfinite(self) -> bool:
        """Whether q or k (as given) hold NaN/inf."""
        return any(x is not None and not bool(torch.isfinite(x).all()) for x in (self.query, self.key))

    @cached_property
    def nonfinite(self) -> dict:
        """name -> bool mask: NaN/inf in the output where the reference is finite, in heads whose
        input is finite throughout (a NaN from nowhere: an out-of-bounds read).  Where a head's
        input carries NaN/inf, a structural bug that mixes its channels (another pairing, another
        row) spreads them: not evidence of a read outside the inputs."""
        out = {}
        for name in self.comparison.errors:
            x, got, exp = self.inputs[name]
            out[name] = (~torch.isfinite(got.detach().to("cpu", torch.float64)) & torch.isfinite(exp)
                         & self.finite_heads[name])
        return out

    @cached_property
    def finite_heads(self) -> dict:
        """name -> bool mask over the tensor's elements: the head's input is finite throughout."""
        out = {}
        for name in self.comparison.errors:
            x = self.inputs[name][0]
            heads = x.reshape(x.shape[0], -1, self.spec.head_size)
            out[name] = torch.isfinite(heads).all(dim=2, keepdim=True).expand_as(heads).reshape(x.shape)
        return out

    @cached_property
    def finite_errors(self) -> dict:
        """The comparison's errors, 0 where the reference is NaN/inf: how a planted non-finite value
        propagates is the non-finite rules' to judge (they ran first), not the precision's."""
        return {name: torch.where(torch.isfinite(self.inputs[name][2]), err, torch.zeros_like(err))
                for name, err in self.comparison.errors.items()}

    @cached_property
    def nonfinite_lost(self) -> dict:
        """name -> bool mask: rotary channels where the input itself is NaN/inf, the reference
        carries it and the output is finite (swallowed; pass-through channels are pass_through's
        to judge: any change there is a bug of its own).  A non-finite output that differs from the reference's (the
        other infinity, NaN for an infinity) is what any structural bug does to a planted
        infinity: not evidence."""
        out = {}
        for name in self.comparison.errors:
            x, got, exp = self.inputs[name]
            got = got.detach().to("cpu", torch.float64)
            rotary = (torch.arange(x.shape[1]) % self.spec.head_size) < self.spec.rotary_dim
            out[name] = ~torch.isfinite(exp) & ~torch.isfinite(x) & torch.isfinite(got) & rotary
        return out

    # ----- positions.  The rules recompute references; model caches hold up to a million rows, so
    # the positions-level ones use only the rows the positions use (same values, positions
    # renumbered): identical results.
    @cached_property
    def rows(self) -> torch.Tensor:
        """The positions as [num_dims, T] rows into the full cache."""
        return self.positions.long().reshape(self.spec.num_dims, self.positions.shape[-1])

    @cached_property
    def _used(self):
        return torch.unique(self.positions.long(), return_inverse=True)

    @cached_property
    def used_positions(self) -> torch.Tensor:
        """The positions renumbered to rows of :attr:`used_cache`."""
        return self._used[1].reshape(self.positions.shape)

    @cached_property
    def used_cache(self) -> torch.Tensor:
        """The cache rows the positions use, in increasing order."""
        return self.cache[self._used[0]]

    def neighbours(self, label: str) -> _Lazy:
        """The :class:`_AltResult` of each neighbouring configuration of ``label`` (NEIGHBOURS), in
        order, those equal to the reference on this input left out; computed once, as far as walked."""
        if label not in self._neighbours:
            results = (alternative_result(alt, self.out_q, self.out_k, self.ref_q, self.ref_k, self.precision)
                       for alt in NEIGHBOURS[label](self))
            self._neighbours[label] = _Lazy(r for r in results if r is not None)
        return self._neighbours[label]

    # ----- precision
    @property
    def out_dtype(self) -> torch.dtype:
        return self.query.dtype

    @cached_property
    def declared(self) -> str:
        """The declared working precision's name."""
        return dtype_name(working_dtype(self.precision, self.out_dtype))

    @cached_property
    def cos_sin(self) -> tuple:
        """float64 [T, num_freqs] cos and sin the reference rotates by."""
        return select_cos_sin(self.spec, self.used_positions, self.used_cache)

    @cached_property
    def tensors(self) -> list:
        """[(name, input, float64 reference)] per compared tensor."""
        return [(name, self.inputs[name][0], self.inputs[name][2]) for name in self.comparison.errors]

    @cached_property
    def spread(self) -> str:
        """'query 12/640 elements over 3/5 tokens and 2/3 heads; key ...'."""
        w = self.where
        return "; ".join(f"{name} {w[name].count}/{w[name].total} elements over {len(w[name].tokens)}/"
                         f"{w[name].num_tokens} tokens and {len(w[name].heads)}/{w[name].num_heads} heads"
                         for name in self.wrong)

    @cached_property
    def gross(self) -> _Gross:
        """Only errors beyond what the coarsest lower precision explains count (rules 22-27)."""
        coarse = LOWER_PRECISIONS[-1]
        cos, sin = self.cos_sin
        c, where = self.comparison, self.where
        gross = {name: mismatch_locations(self.spec, c.errors[name] > torch.maximum(
                     c.bounds[name], loose_bound(self.spec, cos, sin, x, exp, coarse, self.out_dtype)))
                 for name, x, exp in self.tensors}
        grossly = [name for name in self.wrong if gross[name].count] or self.wrong
        location = dict(self.location)
        for name in grossly:
            if gross[name].count and gross[name].count < where[name].count:   # report where the gross errors are
                location[name] = {**gross[name].summary(self.spec), "elements": (
                    f"{gross[name].count}/{gross[name].total} beyond {dtype_name(coarse)} rounding "
                    f"({where[name].count} mismatched)")}
        rounding_only = [name for name in self.wrong if name not in grossly]
        note = (f" ({', '.join(rounding_only)} differs only by rounding, within {dtype_name(coarse)} "
                f"working precision)") if rounding_only else ""
        return _Gross({**where, **{name: gross[name] for name in grossly if gross[name].count}},
                      location, grossly, note)
