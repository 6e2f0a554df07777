"""Where a rotation mismatch lies, and what most likely caused it.

:func:`diagnose` takes what the comparison saw (the spec, the untouched inputs, the
implementation's outputs, the float64 reference and the :class:`~rope.harness.tolerance.Comparison`)
and returns a :class:`Diagnosis`: a label, one sentence, and the location of the mismatched
elements per tensor over tokens, heads, frequencies, position rows, pair members and
pass-through channels.

It builds a :class:`Context` once (inputs, outputs, reference, comparison, and what several rules
share, each computed on first use) and walks :data:`RULES`: named functions
``rule(ctx) -> Diagnosis | None``, the first hit wins, :func:`unknown` when none hits.  Outputs
that match the reference are ``match`` before any rule runs (and every rule returns None on them).
The order is elimination, most specific first (each rule's docstring says why it sits where it
does; the label it gives follows the rule's name where the two differ):

 1. ``writes_outside``: positions, the cache, a guard or the value slice of a packed qkv tensor
    were written.
 2. ``wrong_output``: a tensor came back with the wrong shape, dtype or device (or None).
 3. ``nonfinite_output`` (label ``nan``): NaN/inf where the reference is finite (an out-of-bounds
    read from a guard region), or finite where it is NaN/inf (non-finite inputs swallowed).
 4. ``out_of_bounds_read``: the values are right but the guards' tracer saw reads outside the
    inputs (properties/guards.py reports them as problems).
 5. ``pairing_swapped``: the output is the reference with the other of NeoX / GPT-J pairs.
 6. ``axis_map_wrong``: ... with the other layout's axis map (chunked / interleaved).
 7. ``section_boundary_shifted``: ... with one section boundary, or one interleaved bound 3*s,
    moved by one.
 8. ``position_rows_swapped``: ... with the position rows permuted.
 9. ``position_rows_misread``: ... with row d read at a wrong row stride (positions[0, t + d], or
    row 0 for every frequency).
10. ``row_stride_ignored``: ... of q/k rows read as if packed back to back.
11. ``partial_rotary_stride``: ... with head_size/2 where rotary_dim/2 belongs (sin read past its
    row, or the NeoX partner at i + head_size/2).
12. ``pair_rows_split``: ... with the sections laid over the whole rotary head in blocks of 2*s_i,
    so the two members of a NeoX pair take different position rows (transformers' HunYuanVL,
    docs/spec.md §2).
    (5-12 are the neighbouring configurations, NEIGHBOURS: each candidate rotates the inputs by
    its own cos/sin and pairs and is held to the same per-element bound, to the declared precision.)
13. ``pass_through_only`` (label ``pass_through_touched``): channels >= rotary_dim differ from the
    input, the rotary ones do not.
14. ``modest_rounding`` (label ``precision_loss``): the worst error/bound ratio is modest
    (<= MODEST_RATIO: truncating stores, an extra rounding).
15. ``lower_working_precision`` (label ``precision_loss``): every error fits the bound of a lower
    working precision than declared (LOWER_PRECISION_SLACK x).
16. ``imprecise_neighbour`` (labels of 5-12): a neighbouring configuration again, allowing the
    lower precision (a kernel with a structural bug *and* imprecise arithmetic).
    From here only gross errors count (beyond bfloat16 rounding: Context.gross):
17. ``key_only``: the query is right, the key is not.
18. ``query_only``: the key is right, the query is not.
19. ``head_subset``: only some heads are wrong (e.g. only the first power-of-two heads are right).
20. ``token_subset``: only some tokens are wrong (e.g. only tokens at the last cache row).
21. ``wrong_positions``: the output is an exact rotation by other positions than given (recovered
    per token and position row from the angles of the output's pairs, matched to cache rows):
    stale cos/sin, another chunk's positions, a wrong positions pointer.
22. ``pass_through_and_rotary`` (label ``pass_through_touched``): pass-through channels touched and
    the rotary channels wrong too.
Else ``unknown``: the location is all there is.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass, field
from functools import cached_property

import torch

from reference.rotation import pair_indices, rotate, rotate_heads, select_cos_sin
from rope.spec import RopeSpec
from rope.harness.tolerance import Comparison, compare_rotation, rotation_bound, unit_roundoff, working_dtype

LABELS = (
    "match", "wrong_output", "writes_outside", "nan", "out_of_bounds_read", "pairing_swapped",
    "axis_map_wrong", "section_boundary_shifted", "position_rows_swapped", "position_rows_misread",
    "row_stride_ignored", "partial_rotary_stride", "pair_rows_split", "wrong_positions", "pass_through_touched",
    "precision_loss", "key_only", "query_only", "head_subset", "token_subset", "unknown",
)
# An alternative configuration explains the output when it leaves at most this share of the
# original mismatches (1%: a kernel may be wrong in one way and slightly imprecise as well).
ALTERNATIVE_RESIDUE = 0.01
# Inputs rounded to the lower precision add about two unit roundoffs per product to the bound
# of computing in it (rope.harness.tolerance); 4x covers that.
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


# --------------------------------------------------------------------------- locations
def ranges(values) -> str:
    """Compact sorted ranges: [0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'; empty -> 'none'."""
    vals = sorted(set(int(v) for v in values))
    if not vals:
        return "none"
    out, start, prev = [], vals[0], vals[0]
    for v in vals[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)


def channel_location(spec: RopeSpec, channel: int) -> dict:
    """Frequency, pair member ('a' rotates as x1, 'b' as x2) and position row of a channel."""
    if channel >= spec.rotary_dim:
        return {"pass_through": True}
    half = spec.num_freqs
    if spec.is_neox_style:
        freq, member = channel % half, "a" if channel < half else "b"
    else:
        freq, member = channel // 2, "ab"[channel % 2]
    return {"freq": freq, "member": member, "row": spec.axis_map()[freq]}


@dataclass
class _Where:
    """Mismatched elements of one tensor, as index sets."""
    count: int
    total: int
    num_tokens: int
    num_heads: int
    tokens: list
    heads: list
    freqs: list
    rows: list
    members: list
    pass_through: list

    def summary(self, spec: RopeSpec) -> dict:
        return {
            "elements": f"{self.count}/{self.total}",
            "tokens": f"{ranges(self.tokens)} of {self.num_tokens}",
            "heads": f"{ranges(self.heads)} of {self.num_heads}",
            "freqs": f"{ranges(self.freqs)} of {spec.num_freqs}",
            "rows": ranges(self.rows),
            "members": ",".join(self.members) or "none",
            "pass_through_channels": ranges(self.pass_through),
        }


def _where(spec: RopeSpec, bad: torch.Tensor) -> _Where:
    """bad: bool [T, H * head_size] -> index sets of the mismatched elements."""
    num_tokens = bad.shape[0]
    heads = bad.reshape(num_tokens, bad.shape[1] // spec.head_size, spec.head_size)   # (0 tokens too)
    chans = heads.any(dim=0).any(dim=0).nonzero().flatten().tolist()
    rot = [c for c in chans if c < spec.rotary_dim]
    locs = [channel_location(spec, c) for c in rot]
    return _Where(
        count=int(bad.sum()), total=bad.numel(), num_tokens=num_tokens, num_heads=heads.shape[1],
        tokens=heads.any(dim=2).any(dim=1).nonzero().flatten().tolist(),
        heads=heads.any(dim=2).any(dim=0).nonzero().flatten().tolist(),
        freqs=sorted({loc["freq"] for loc in locs}), rows=sorted({loc["row"] for loc in locs}),
        members=sorted({loc["member"] for loc in locs}),
        pass_through=[c for c in chans if c >= spec.rotary_dim])


def _prev_power_of_2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


# --------------------------------------------------------------------------- alternatives
def _as_packed(x):
    """x read as if its rows were packed back to back from its first element (ignoring the
    row stride); x itself when it is contiguous or the reinterpretation leaves its storage."""
    if x is None or x.is_contiguous():
        return x
    if x.storage_offset() + x.numel() > x.untyped_storage().nbytes() // x.element_size():
        return x
    return x.as_strided((x.numel(),), (1,), x.storage_offset()).view(x.shape)


def _replace(spec: RopeSpec, **changes):
    try:
        return dataclasses.replace(spec, **changes)
    except ValueError:
        return None


@dataclass
class _Alt:
    """A neighbouring computation a broken kernel may effectively do: rotate ``query``/``key``
    (as read) by ``cos``/``sin`` (float64 [T, spec.num_freqs]; NaN: unknowable, e.g. read past
    the cache) with the pairs of ``spec`` (a pseudo spec where the pairing itself is wrong)."""
    label: str
    sentence: str
    spec: RopeSpec
    cos: torch.Tensor
    sin: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor | None
    # Member b of each pair rotated by its own cos/sin (None: the same as member a's).
    cos_b: torch.Tensor | None = None
    sin_b: torch.Tensor | None = None


@dataclass
class _AltResult:
    alt: _Alt
    outputs: tuple
    errors: dict
    num_mismatched: int
    num_unknown: int
    num_elements: int


def _moved(spec: RopeSpec, alt: RopeSpec) -> str:
    """'frequency 61 takes row 1 instead of row 0': the frequencies whose row differs."""
    old, new = spec.axis_map(), alt.axis_map()
    moved = [i for i in range(spec.num_freqs) if old[i] != new[i]]
    shown = ", ".join(f"frequency {i} takes row {new[i]} instead of row {old[i]}" for i in moved[:3])
    return shown + (f" (and {len(moved) - 3} more)" if len(moved) > 3 else "")


def _positions_alt(label, sentence, spec, positions, query, key, cache):
    cos, sin = select_cos_sin(spec, positions, cache)
    return _Alt(label, sentence, spec, cos, sin, query, key)


def _empty_section_alt(spec: RopeSpec, secs, shifted, j, positions, query, key, cache):
    """A chunked boundary moved by one where it empties a section (sections (1, 1, 30) with the
    first boundary tested with > instead of >=: frequency 1 takes row 0, row 1 takes none)."""
    axis = spec.axis_map()
    new = [d for d, n in enumerate(shifted) for _ in range(n)]
    moved = [i for i in range(spec.num_freqs) if axis[i] != new[i]]
    how = ", ".join(f"frequency {i} takes row {new[i]} instead of row {axis[i]}" for i in moved[:3])
    cos, sin = select_cos_sin(spec, positions, cache, new)
    return _Alt("section_boundary_shifted",
                f"the output matches the reference with sections={shifted} instead of {secs}: the boundary between "
                f"position rows {j} and {j + 1} is off by one frequency: {how} (e.g. > where >= belongs; row "
                f"{shifted.index(0)} is left with no frequency)", spec, cos, sin, query, key)


# The neighbouring configurations, one generator per label (positions renumbered to the rows of
# ``cache`` they use), each most specific first; NEIGHBOURS (below) lists them in rule order.
def _pairing_alternatives(spec: RopeSpec, positions, query, key, cache):
    """The other pairing style: GPT-J pairs for NeoX, NeoX pairs for GPT-J."""
    other = "GPT-J pairs (2i, 2i+1)" if spec.is_neox_style else "NeoX pairs (i, i + rotary_dim/2)"
    asked = "NeoX" if spec.is_neox_style else "GPT-J"
    swapped = _replace(spec, is_neox_style=not spec.is_neox_style)
    if swapped is not None:
        yield _positions_alt(
            "pairing_swapped",
            f"the output matches the reference computed with {other} although the spec asks for {asked} "
            f"(is_neox_style={spec.is_neox_style}): the kernel ignores the pairing style",
            swapped, positions, query, key, cache)


def _axis_map_alternatives(spec: RopeSpec, positions, query, key, cache):
    """The other layout's axis map (chunked for interleaved, or the reverse; three sections only)."""
    secs = spec.sections
    if secs is None or len(secs) != 3:
        return
    layout = "chunked" if spec.layout == "interleaved" else "interleaved"
    alt = _replace(spec, layout=layout)
    if alt is not None:
        yield _positions_alt(
            "axis_map_wrong",
            f"the output matches the reference with layout={layout!r} instead of {spec.layout!r}: "
            f"the axis map of sections={secs} is wrong (docs/spec.md §2)", alt, positions, query, key, cache)


def _section_boundary_alternatives(spec: RopeSpec, positions, query, key, cache):
    """Each section boundary (each interleaved bound 3*s) moved by one frequency either way."""
    secs = spec.sections
    if secs is None or len(secs) < 2:
        return
    axis = spec.axis_map()
    for j in range(len(secs) - 1):
        for step in (1, -1):
            shifted = list(secs)
            shifted[j] += step
            shifted[j + 1] -= step
            if min(shifted) < 0:
                continue
            if min(shifted) == 0:
                if spec.layout == "chunked":     # a row loses its only frequency: no RopeSpec has that
                    yield _empty_section_alt(spec, secs, tuple(shifted), j, positions, query, key, cache)
                continue
            alt = _replace(spec, sections=tuple(shifted))
            if alt is None or alt.axis_map() == axis:
                continue
            if spec.layout == "interleaved":
                # Only the H and W bounds (i < 3*s_h, i < 3*s_w) exist in the interleaved map.
                bounds = " and ".join(f"i < 3*s_{'hw'[r - 1]} = {3 * secs[r]} acts as i < {3 * shifted[r]}"
                                      for r in (1, 2) if shifted[r] != secs[r])
                how = (f"an interleaved bound is off by one group ({bounds}): {_moved(spec, alt)} (e.g. "
                       f"i // 3 <= s where i < 3*s belongs; docs/spec.md §7.9)")
            else:
                how = (f"the boundary between position rows {j} and {j + 1} is off by one frequency: "
                       f"{_moved(spec, alt)} (e.g. <= where < belongs)")
            yield _positions_alt(
                "section_boundary_shifted",
                f"the output matches the reference with sections={tuple(shifted)} instead of {secs}: {how}",
                alt, positions, query, key, cache)


def _row_order_alternatives(spec: RopeSpec, positions, query, key, cache):
    """Every other order of the position rows."""
    secs = spec.sections
    if secs is None or len(secs) < 2:
        return
    identity = tuple(range(len(secs)))
    for perm in itertools.permutations(identity):
        if perm != identity:
            yield _positions_alt(
                "position_rows_swapped",
                f"the output matches the reference with the position rows read in the order {perm} "
                f"instead of {identity}: rows swapped (e.g. the T/H/W order of the interleaved lanes, or a "
                f"wrong row offset)", spec, positions[list(perm)], query, key, cache)


def _row_misread_alternatives(spec: RopeSpec, positions, query, key, cache):
    """Row d read at a wrong row stride s: positions.flatten()[d * s + t], s = 1 or 0."""
    secs = spec.sections
    if secs is None or len(secs) < 2:
        return
    flat = positions.reshape(-1)
    num_dims, num_tokens = positions.shape
    for stride, how in (
            (1, "row d read at positions[0, t + d] (row stride 1 instead of the row stride: the last "
                "tokens of a row read into the next row)"),
            (0, "every row read as row 0 (row stride 0, or positions treated as 1-D)")):
        misread = flat.as_strided((num_dims, num_tokens), (stride, 1))
        if not torch.equal(misread, positions):
            yield _positions_alt(
                "position_rows_misread",
                f"the output matches the reference with the position rows misread, {how}: the kernel "
                f"indexes positions[d, t] wrongly", spec, misread.clone(), query, key, cache)


def _row_stride_alternatives(spec: RopeSpec, positions, query, key, cache):
    """q/k read as if their rows were packed back to back (when either has a row stride)."""
    packed_q, packed_k = _as_packed(query), _as_packed(key)
    if packed_q is not query or packed_k is not key:
        strides = ", ".join(f"{n} row stride {x.stride(0)} for width {x.shape[1]}"
                            for n, x in (("query", query), ("key", key)) if x is not None)
        yield _positions_alt(
            "row_stride_ignored",
            f"the output matches the reference applied to q/k read as if their rows were packed back to "
            f"back ({strides}): the kernel ignores the row stride (views into a packed qkv tensor)",
            spec, positions, packed_q, packed_k, cache)


def _rotate_members(spec: RopeSpec, x, cos_a, sin_a, cos_b, sin_b):
    """:func:`reference.rotation.rotate_heads` with member b of each pair rotated by its own
    cos/sin: member a's channels from the rotation by (cos_a, sin_a), b's from (cos_b, sin_b)."""
    out = rotate_heads(spec, x, cos_a, sin_a)
    other = rotate_heads(spec, x, cos_b, sin_b)
    _, b_idx = pair_indices(spec)
    shape = (x.shape[0], -1, spec.head_size)
    out.view(shape)[..., b_idx] = other.view(shape)[..., b_idx]
    return out


def _pair_rows_split_alternatives(spec: RopeSpec, rows, query, key, cache):
    """Chunked sections laid over the whole rotary head in blocks of 2*s_i (channel c takes the
    row of its block) instead of over each half: the members (i, i + rotary_dim/2) of a NeoX pair
    take different rows (transformers' HunYuanVL from 5.13; docs/spec.md §2)."""
    secs = spec.sections
    if secs is None or len(secs) < 2 or spec.layout != "chunked" or not spec.is_neox_style:
        return
    half = spec.num_freqs
    block_of = [d for d, s in enumerate(secs) for _ in range(2 * s)]          # channel -> row
    axis_a, axis_b = block_of[:half], block_of[half:]
    if axis_a == axis_b:
        return
    cos_a, sin_a = select_cos_sin(spec, rows, cache, axis_a)
    cos_b, sin_b = select_cos_sin(spec, rows, cache, axis_b)
    split = [i for i in range(half) if axis_a[i] != axis_b[i]]
    sentence = (f"the output matches a rotation whose two pair members take different position rows: the "
                f"sections {secs} laid over the whole rotary head in blocks of 2*s_i (channel c takes the row of "
                f"its block) instead of over each half, so {len(split)} of {half} pairs (i, i + {half}) read row "
                f"{axis_a[split[0]]} for member a and row {axis_b[split[0]]} for member b (e.g. frequency {split[0]}); "
                f"text tokens (all rows equal) are unaffected (transformers' HunYuanVL layout; docs/spec.md §2)")
    yield _Alt("pair_rows_split", sentence, spec, cos_a, sin_a, query, key, cos_b, sin_b)


def _partial_rotary_alternatives(spec: RopeSpec, rows, query, key, cache):
    """head_size/2 used where rotary_dim/2 belongs (partial rotary, docs/spec.md §7.3): the sin offset into
    a cache row and/or the NeoX partner channel.  ``rows``: [num_dims, T] positions into ``cache``
    (the full cache: a sin read past its row's end lands in the next row)."""
    hs, rd, half = spec.head_size, spec.rotary_dim, spec.num_freqs
    if rd >= hs or hs % 2:
        return
    cos, sin = select_cos_sin(spec, rows, cache)
    flat = cache.reshape(-1)
    pos = torch.stack([rows[a] for a in spec.axis_map()], dim=1).long()         # [T, F]
    index = pos * rd + hs // 2 + torch.arange(half)
    far_sin = torch.full_like(sin, float("nan"))
    inside = index < flat.numel()
    far_sin[inside] = flat[index[inside]].to(torch.float64)
    wide = _replace(spec, rotary_dim=hs, sections=None, layout="chunked", ntk_alpha=None)
    variants = [(True, False)] + ([(True, True), (False, True)] if spec.is_neox_style and wide is not None else [])
    for sin_far, partner_far in variants:
        s = far_sin if sin_far else sin
        parts = []
        if sin_far:
            parts.append(f"sin read at offset head_size/2 + i of the cache row instead of rotary_dim/2 + i "
                         f"({hs // 2 - half} elements too far: past the row's end, into the next row)")
        if partner_far:
            parts.append(f"frequency i pairs channels (i, i + {hs // 2}) instead of (i, i + {half}) (a "
                         f"pass-through channel rotated, a rotary one left alone)")
        sentence = (f"the output matches the reference computed with head_size/2 = {hs // 2} where rotary_dim/2 = "
                    f"{half} belongs (partial rotary: rotary_dim={rd} < head_size={hs}): {'; '.join(parts)} "
                    f"(docs/spec.md §7.3)")
        if partner_far:
            ones = torch.ones(cos.shape[0], hs // 2 - half, dtype=torch.float64)
            zeros = torch.zeros_like(ones)
            yield _Alt("partial_rotary_stride", sentence, wide, torch.cat([cos, ones], 1), torch.cat([s, zeros], 1),
                       query, key)
        else:
            yield _Alt("partial_rotary_stride", sentence, spec, cos, s, query, key)


# Largest cache searched for the positions a wrong output was rotated by (rows x frequencies).
RECOVERY_MAX_ELEMENTS = 1 << 28
RECOVERY_CHUNK_ROWS = 1 << 15


def recover_positions(spec: RopeSpec, rows, query, key, out_q, out_k, cache):
    """The positions an output was rotated by, [num_dims, T]: per token, the angle of each pair
    (least squares over every head of q and k) matched to the nearest cache row, per position
    row; None when the outputs are no rotation of the inputs or the cache is too large to search."""
    if cache.numel() > RECOVERY_MAX_ELEMENTS or rows.shape[1] == 0:
        return None
    a_idx, b_idx = pair_indices(spec)
    num_tokens = rows.shape[1]
    acc_c = torch.zeros(num_tokens, spec.num_freqs, dtype=torch.float64)
    acc_s, norm = torch.zeros_like(acc_c), torch.zeros_like(acc_c)
    for x, out in ((query, out_q), (key, out_k)):
        if x is None or out is None or tuple(out.shape) != tuple(x.shape):
            continue
        h = x.to(torch.float64).reshape(num_tokens, x.shape[1] // spec.head_size, spec.head_size)
        o = out.detach().to("cpu", torch.float64).reshape(h.shape)
        a, b, a2, b2 = h[..., a_idx], h[..., b_idx], o[..., a_idx], o[..., b_idx]
        ok = torch.isfinite(a2) & torch.isfinite(b2)
        acc_c += torch.where(ok, a * a2 + b * b2, 0.0).sum(1)
        acc_s += torch.where(ok, a * b2 - b * a2, 0.0).sum(1)
        norm += torch.where(ok, a * a + b * b, 0.0).sum(1)
    if not bool((norm > 0).all()):
        return None
    cos_e, sin_e = acc_c / norm, acc_s / norm
    axis = torch.tensor(spec.axis_map())
    found = rows.clone().long()
    for d in range(rows.shape[0]):
        freqs = (axis == d).nonzero().flatten()
        if not len(freqs):
            continue
        target = torch.cat([cos_e[:, freqs], sin_e[:, freqs]], 1)
        cols = torch.cat([freqs, freqs + spec.num_freqs])
        best = torch.full((num_tokens,), float("inf"), dtype=torch.float64)
        for start in range(0, cache.shape[0], RECOVERY_CHUNK_ROWS):
            block = cache[start:start + RECOVERY_CHUNK_ROWS][:, cols].to(torch.float64)
            dist, idx = torch.cdist(target, block).min(dim=1)
            better = dist < best
            best = torch.where(better, dist, best)
            found[d] = torch.where(better, idx + start, found[d])
    return found


def _wrong_positions_alternative(spec, rows, query, key, out_q, out_k, cache):
    """The reference for the positions the output was actually rotated by, when they differ."""
    found = recover_positions(spec, rows, query, key, out_q, out_k, cache)
    if found is None or torch.equal(found, rows.long()):
        return
    diff = (found != rows).nonzero().tolist()
    examples = "; ".join(f"row {d} token {t}: {int(rows[d, t])} -> {int(found[d, t])}" for d, t in diff[:4])
    sentence = (f"the output is the reference for other positions than given ({len(diff)} of {rows.numel()} position "
                f"entries differ, given -> used: {examples}{'; ...' if len(diff) > 4 else ''}): stale cos/sin (cached "
                f"from an earlier call), positions of another chunk or request, or a wrong positions pointer")
    yield _positions_alt("wrong_positions", sentence, spec, found, query, key, cache)


def _alternative_result(alt: _Alt, out_q, out_k, ref_q, ref_k, precision) -> _AltResult | None:
    """The alternative's outputs and how the implementation's outputs compare with them (the
    bound of rope.harness.tolerance for the alternative's pairs and cos/sin; NaN in the alternative:
    unknown, not counted), or None when it equals the reference on this input."""
    outs, errors = [], {}
    mismatched = unknown = total = 0
    for name, x, out, ref in (("query", alt.query, out_q, ref_q), ("key", alt.key, out_k, ref_k)):
        if x is None or out is None:
            outs.append(None)
            continue
        if alt.cos_b is None:
            exp = rotate_heads(alt.spec, x, alt.cos, alt.sin)
            cos_mag, sin_mag = alt.cos, alt.sin
        else:
            exp = _rotate_members(alt.spec, x, alt.cos, alt.sin, alt.cos_b, alt.sin_b)
            cos_mag, sin_mag = torch.maximum(alt.cos.abs(), alt.cos_b.abs()), torch.maximum(alt.sin.abs(), alt.sin_b.abs())
        outs.append(exp)
        got = out.detach().to("cpu", torch.float64)
        bound = rotation_bound(alt.spec, x, torch.nan_to_num(exp), torch.nan_to_num(cos_mag),
                               torch.nan_to_num(sin_mag), x.dtype, precision)
        err = (got - exp).abs()
        err = torch.where(torch.isnan(got) & ~torch.isnan(exp), torch.full_like(err, float("inf")), err)
        errors[name] = err
        mismatched += int((err > bound).sum())
        unknown += int(torch.isnan(exp).sum())
        total += err.numel()
    if all(o is None or torch.equal(o, r) for o, r in zip(outs, (ref_q, ref_k))):
        return None
    return _AltResult(alt, tuple(outs), errors, mismatched, unknown, total)


def _explains(result: _AltResult, comparison: Comparison) -> bool:
    """At most ALTERNATIVE_RESIDUE of the original mismatches left, and at most half unknowable."""
    return (result.num_mismatched <= ALTERNATIVE_RESIDUE * comparison.num_mismatched
            and result.num_unknown <= result.num_elements // 2)


# --------------------------------------------------------------------------- precision
def loose_bound(spec: RopeSpec, cos, sin, x, exp, precision: torch.dtype, out_dtype: torch.dtype) -> torch.Tensor:
    """The bound of computing everything (pass-through channels included) in ``precision``,
    from inputs rounded to it: SLACK x rope.harness.tolerance's bound, plus the store in out_dtype."""
    bound = rotation_bound(spec, x, exp, cos, sin, precision, "activation")
    bound = LOWER_PRECISION_SLACK * bound + unit_roundoff(out_dtype) * exp.abs()
    heads = bound.view(bound.shape[0], -1, spec.head_size)
    heads[..., spec.rotary_dim:] += unit_roundoff(precision) * exp.reshape(heads.shape)[..., spec.rotary_dim:].abs()
    return bound


def _fitting_precision(spec, cos, sin, tensors, errors, precision, out_dtype):
    """The first precision lower than the declared one whose loose bound covers every error.
    ``tensors``: [(name, input x, float64 expected)]; ``errors``: name -> |got - expected|;
    ``cos``/``sin``: float64 [T, spec.num_freqs], what the expected values were rotated by."""
    declared = working_dtype(precision, out_dtype)
    for cand in LOWER_PRECISIONS:
        if unit_roundoff(cand) <= unit_roundoff(declared):
            continue
        if all(bool((errors[name] <= loose_bound(spec, cos, sin, x, exp, cand, out_dtype)).all())
               for name, x, exp in tensors):
            return cand
    return None


def _is_write_problem(problem: str) -> bool:
    """A write outside q/k: inputs or guards modified, traced out-of-bounds / wild / read-only writes."""
    return "modified" in problem or "write(s)" in problem


def _is_read_problem(problem: str) -> bool:
    """A traced read outside an input: guard elements, wild or misaligned reads."""
    return "read(s)" in problem or "misaligned-read" in problem


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


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


# label -> the neighbouring configurations of that label, for a Context; in rule order (5-12).
# The positions-level ones use only the cache rows the positions use (Context.used_positions);
# the partial rotary and pair-split ones the full cache (a sin read past its row lands in the next).
NEIGHBOURS = {
    "pairing_swapped": lambda c: _pairing_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "axis_map_wrong": lambda c: _axis_map_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "section_boundary_shifted": lambda c: _section_boundary_alternatives(
        c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "position_rows_swapped": lambda c: _row_order_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "position_rows_misread": lambda c: _row_misread_alternatives(
        c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "row_stride_ignored": lambda c: _row_stride_alternatives(c.spec, c.used_positions, c.query, c.key, c.used_cache),
    "partial_rotary_stride": lambda c: _partial_rotary_alternatives(c.spec, c.rows, c.query, c.key, c.cache),
    "pair_rows_split": lambda c: _pair_rows_split_alternatives(c.spec, c.rows, c.query, c.key, c.cache),
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
    _neighbours: dict = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def build(cls, spec: RopeSpec, positions, query, key, cos_sin_cache, out_q, out_k, *,
              precision: str = "float32", ref=None, comparison: Comparison | None = None) -> "Context":
        """:func:`diagnose`'s arguments; ``ref`` and ``comparison`` are computed when not given."""
        cpu = torch.device("cpu")
        positions, cache = positions.to(cpu), cos_sin_cache.to(cpu)
        if ref is None:
            ref = rotate(spec, positions, query, key, cache)
        ref_q, ref_k = (None if r is None else r.to(cpu, torch.float64) for r in ref)
        if comparison is None:
            comparison = compare_rotation(spec, positions, query, key, cache, out_q, out_k, ref_q, ref_k, precision)
        return cls(spec, positions, query, key, cache, out_q, out_k, precision, ref_q, ref_k, comparison)

    # ----- where the mismatch is
    @cached_property
    def inputs(self) -> dict:
        """name -> (input, output, float64 reference), for query and key."""
        return {"query": (self.query, self.out_q, self.ref_q), "key": (self.key, self.out_k, self.ref_k)}

    @cached_property
    def where(self) -> dict:
        """name -> _Where of its mismatched elements (error > bound), per compared tensor."""
        c = self.comparison
        return {name: _where(self.spec, c.errors[name] > c.bounds[name]) for name in c.errors}

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
        """Traced reads outside an input (properties/guards.py)."""
        return [p for p in self.comparison.problems if _is_read_problem(p)]

    @cached_property
    def nonfinite(self) -> dict:
        """name -> bool mask: NaN/inf in the output where the reference is finite."""
        out = {}
        for name in self.comparison.errors:
            _, got, exp = self.inputs[name]
            out[name] = ~torch.isfinite(got.detach().to("cpu", torch.float64)) & torch.isfinite(exp)
        return out

    @cached_property
    def nonfinite_lost(self) -> dict:
        """name -> bool mask: where the reference is NaN/inf and the output is not the same
        (finite, the other infinity, or NaN for an infinity)."""
        out = {}
        for name in self.comparison.errors:
            _, got, exp = self.inputs[name]
            got = got.detach().to("cpu", torch.float64)
            same = (torch.isnan(got) & torch.isnan(exp)) | (got == exp)
            out[name] = ~torch.isfinite(exp) & ~same
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
            results = (_alternative_result(alt, self.out_q, self.out_k, self.ref_q, self.ref_k, self.precision)
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
        return _dtype_name(working_dtype(self.precision, self.out_dtype))

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
        """Only errors beyond what the coarsest lower precision explains count (rules 17-22)."""
        coarse = LOWER_PRECISIONS[-1]
        cos, sin = self.cos_sin
        c, where = self.comparison, self.where
        gross = {name: _where(self.spec, c.errors[name] > torch.maximum(
                     c.bounds[name], loose_bound(self.spec, cos, sin, x, exp, coarse, self.out_dtype)))
                 for name, x, exp in self.tensors}
        grossly = [name for name in self.wrong if gross[name].count] or self.wrong
        location = dict(self.location)
        for name in grossly:
            if gross[name].count and gross[name].count < where[name].count:   # report where the gross errors are
                location[name] = {**gross[name].summary(self.spec), "elements": (
                    f"{gross[name].count}/{gross[name].total} beyond {_dtype_name(coarse)} rounding "
                    f"({where[name].count} mismatched)")}
        rounding_only = [name for name in self.wrong if name not in grossly]
        note = (f" ({', '.join(rounding_only)} differs only by rounding, within {_dtype_name(coarse)} "
                f"working precision)") if rounding_only else ""
        return _Gross({**where, **{name: gross[name] for name in grossly if gross[name].count}},
                      location, grossly, note)


# --------------------------------------------------------------------------- rules
def _on_mismatch(rule):
    """Rules judge a mismatch: on outputs that match the reference every rule returns None
    (:func:`diagnose` names those ``match`` before the rules)."""
    @functools.wraps(rule)
    def checked(ctx: Context) -> Diagnosis | None:
        return None if ctx.comparison.ok else rule(ctx)
    return checked


@_on_mismatch
def writes_outside(ctx: Context) -> Diagnosis | None:
    """Writes outside q/k: positions, the cos/sin cache, a guard or the value slice of a packed qkv
    tensor modified, or traced out-of-bounds / wild / read-only writes (properties/guards.py).

    First: not a numeric question, and a write outside may corrupt what every later rule reads."""
    outside = [p for p in ctx.comparison.problems if _is_write_problem(p)]
    if outside:
        return ctx.found("writes_outside", "; ".join(outside) + ": the implementation writes memory it may only read")
    return None


@_on_mismatch
def wrong_output(ctx: Context) -> Diagnosis | None:
    """An output of the wrong shape, dtype or device, or None: any problem the comparison reports
    other than traced reads (named by nonfinite_output / out_of_bounds_read) and NaN in the output
    (judged by nonfinite_output with the values).

    After writes_outside, whose problems it would otherwise report as plain problems; before every
    rule that reads the values, which mean nothing when the output is not what was asked for."""
    other = [p for p in ctx.comparison.problems if p not in ctx.reads and "NaN in output" not in p]
    if other:
        return ctx.found("wrong_output", "; ".join(other))
    return None


@_on_mismatch
def nonfinite_output(ctx: Context) -> Diagnosis | None:
    """Label ``nan``: NaN/inf where the reference is finite, most likely an out-of-bounds read:
    cos/sin loaded for padding lanes (docs/spec.md §7.2), position rows read packed (§7.6), from a
    guard region of properties/guards.py.

    Before the value rules: a NaN makes every error comparison meaningless (it would read as
    query_only, head_subset or token_subset)."""
    nonfinite = ctx.nonfinite
    hit = [name for name, m in nonfinite.items() if bool(m.any())]
    if not hit:
        return _nonfinite_lost(ctx)
    spec = ctx.spec
    name, mask = hit[0], nonfinite[hit[0]]
    token, col = divmod(int(mask.flatten().nonzero()[0]), mask.shape[1])
    head, channel = divmod(col, spec.head_size)
    counts = ", ".join(f"{int(nonfinite[n].sum())} {n}" for n in hit)
    w = _where(spec, mask)
    spread = (f"tokens {ranges(w.tokens)} of {w.num_tokens}, frequencies {ranges(w.freqs)} of {spec.num_freqs} "
              f"(position rows {ranges(w.rows)})" + (f", pass-through channels {ranges(w.pass_through)}"
                                                     if w.pass_through else ""))
    traced = f"; the tracer saw {'; '.join(ctx.reads)}" if ctx.reads else ""
    return ctx.found("nan", f"{counts} element(s) are NaN/inf where the reference is finite, first at "
                            f"{name}[token {token}, head {head}, channel {channel}], over {name} {spread}: most "
                            f"likely an out-of-bounds read (cos/sin, positions or q/k loaded past the mask or "
                            f"the row, from a guard region or padding lanes){traced}")


def _nonfinite_lost(ctx: Context) -> Diagnosis | None:
    """The converse of nonfinite_output: NaN/inf in the inputs that the output does not carry
    where the reference does (IEEE arithmetic of a*cos - b*sin propagates them)."""
    lost = ctx.nonfinite_lost
    hit = [name for name, m in lost.items() if bool(m.any())]
    if not hit:
        return None
    name, mask = hit[0], lost[hit[0]]
    token, col = divmod(int(mask.flatten().nonzero()[0]), mask.shape[1])
    head, channel = divmod(col, ctx.spec.head_size)
    counts = ", ".join(f"{int(lost[n].sum())} {n}" for n in hit)
    return ctx.found("nan", f"{counts} element(s) are finite where the reference is NaN/inf (or the other "
                            f"non-finite value), first at {name}[token {token}, head {head}, channel {channel}]: "
                            f"non-finite inputs are swallowed (nan_to_num, a clamp, or a max/select that drops "
                            f"NaN), so an overflow upstream would go unseen")


@_on_mismatch
def out_of_bounds_read(ctx: Context) -> Diagnosis | None:
    """The values are right, but the guards' tracer saw reads outside the inputs: interleaved masks
    covering the padding lanes (docs/spec.md §7.2), which values alone cannot show.

    After the problem rules (writes and wrong outputs are worse, a NaN shows the read reached the
    output); it fires only when no element mismatches, so it is the last rule before the values."""
    if ctx.comparison.num_mismatched == 0:       # only out-of-bounds reads: the values are right
        return ctx.found("out_of_bounds_read",
                         f"the outputs match the reference, but the implementation reads outside its inputs: "
                         f"{'; '.join(ctx.reads)}: a load mask that covers padding lanes or a stride past the row "
                         f"(memory safety: the values read never reach the output here)")
    return None


def _explained_by(ctx: Context, label: str) -> Diagnosis | None:
    """The first neighbouring configuration of ``label`` that explains the output (at most
    ALTERNATIVE_RESIDUE of the mismatches left, to the declared precision)."""
    for result in ctx.neighbours(label):
        if _explains(result, ctx.comparison):
            return ctx.found(result.alt.label, result.alt.sentence)
    return None


@_on_mismatch
def pairing_swapped(ctx: Context) -> Diagnosis | None:
    """The output is the reference with the other pairing style: NeoX pairs (i, i + rotary_dim/2)
    for a GPT-J model or the reverse, the kernel ignoring is_neox_style (docs/spec.md §7.1).

    First of the neighbouring configurations (5-12): they come before the precision and subset
    rules because an exact alternative explains every error, small ones included (a structural bug
    can look like rounding, or hit only some tokens).  The pairing swap changes every pair, so it
    is tried before the alternatives that move only some frequencies."""
    return _explained_by(ctx, "pairing_swapped")


@_on_mismatch
def axis_map_wrong(ctx: Context) -> Diagnosis | None:
    """The output is the reference with the other layout's axis map (chunked for Qwen3-VL's
    interleaved T H W T H W, or the reverse; docs/spec.md §7.9, the map itself §2): which position
    row each frequency takes is wrong as a whole (three sections only).

    After pairing_swapped (the pairs themselves come first); before section_boundary_shifted, the
    finer error of one frequency on the wrong side of a bound."""
    return _explained_by(ctx, "axis_map_wrong")


@_on_mismatch
def section_boundary_shifted(ctx: Context) -> Diagnosis | None:
    """The output is the reference with one section boundary moved by one frequency (chunked: <=
    where < belongs, or a boundary that empties a row) or one interleaved bound 3*s off by one
    group (docs/spec.md §7.9).

    After axis_map_wrong (the whole map before one bound of it); before the position-row rules,
    which change every frequency of a row."""
    return _explained_by(ctx, "section_boundary_shifted")


@_on_mismatch
def position_rows_swapped(ctx: Context) -> Diagnosis | None:
    """The output is the reference with the position rows permuted: T/H/W read in the wrong order
    (the old "THTHWHTHW" docstring, docs/spec.md §7.9) or a wrong row offset.

    After the axis-map rules (they move frequencies between rows, this moves whole rows); before
    position_rows_misread, whose misreadings are not permutations of the rows."""
    return _explained_by(ctx, "position_rows_swapped")


@_on_mismatch
def position_rows_misread(ctx: Context) -> Diagnosis | None:
    """The output is the reference with the position rows read at a wrong row stride: row d at
    positions[0, t + d] (stride 1), or every row as row 0 (1-D positions); positions not read
    through their row stride (docs/spec.md §7.6).

    After position_rows_swapped (a permutation is the more specific misreading of the rows)."""
    return _explained_by(ctx, "position_rows_misread")


@_on_mismatch
def row_stride_ignored(ctx: Context) -> Diagnosis | None:
    """The output is the reference applied to q/k read as if their rows were packed back to back:
    the kernel ignores the row stride of views into a packed qkv tensor.

    After the position rules (it changes what is rotated, not by what); only q/k with a row
    stride can show it."""
    return _explained_by(ctx, "row_stride_ignored")


@_on_mismatch
def partial_rotary_stride(ctx: Context) -> Diagnosis | None:
    """The output is the reference with head_size/2 where rotary_dim/2 belongs (partial rotary,
    docs/spec.md §7.3): sin read at offset head_size/2 + i of the cache row (past the row's end),
    and/or the NeoX partner of frequency i at i + head_size/2.

    After the configurations of the spec's own shape (5-10): it reads the full cache, past the
    rows the positions use; partial rotary only (rotary_dim < head_size)."""
    return _explained_by(ctx, "partial_rotary_stride")


@_on_mismatch
def pair_rows_split(ctx: Context) -> Diagnosis | None:
    """The output is a rotation whose two NeoX pair members take different position rows: the
    chunked sections laid over the whole rotary head in blocks of 2*s_i instead of over each half
    (transformers' HunYuanVL layout, docs/spec.md §2).

    Last of the neighbouring configurations: the most unusual one, and text tokens (all rows
    equal) cannot show it."""
    return _explained_by(ctx, "pair_rows_split")


def _pass_through_sentence(ctx: Context) -> str:
    parts = ", ".join(f"{name} channels {ranges(w.pass_through)}" for name, w in ctx.touched.items())
    return (f"pass-through channels (>= rotary_dim={ctx.spec.rotary_dim} of head_size={ctx.spec.head_size}) differ "
            f"from the input ({parts}){'; rotary channels are wrong too' if ctx.rotary_wrong else ''}: they must "
            f"be copied bit-exactly (a store covering head_size, or a round trip through another dtype)")


@_on_mismatch
def pass_through_only(ctx: Context) -> Diagnosis | None:
    """Label ``pass_through_touched``: channels >= rotary_dim differ from the input, the rotary
    channels are right (a store covering head_size; a round trip through another dtype).

    Before the precision rules: pass-through channels must come back bit-exact, so even a tiny
    change there is a bug that lower_working_precision would otherwise excuse as rounding."""
    if ctx.touched and not ctx.rotary_wrong:
        return ctx.found("pass_through_touched", _pass_through_sentence(ctx))
    return None


@_on_mismatch
def modest_rounding(ctx: Context) -> Diagnosis | None:
    """Label ``precision_loss``: the worst error/bound ratio is modest (<= MODEST_RATIO): a
    truncating store, an extra intermediate rounding, a slightly lower working precision.

    After the structural rules (a structural bug with small errors is still that bug); before
    lower_working_precision, which would name a whole precision for one rounding too many."""
    c = ctx.comparison
    if c.worst_ratio <= MODEST_RATIO:
        return ctx.found("precision_loss",
                         f"small errors spread over {ctx.spread} with a modest worst error/bound {c.worst_ratio:.3g}: "
                         f"rounding slightly worse than {ctx.declared} working precision allows (a truncating store, "
                         f"an extra intermediate rounding, or a slightly lower working precision)")
    return None


@_on_mismatch
def lower_working_precision(ctx: Context) -> Diagnosis | None:
    """Label ``precision_loss``: every error fits LOWER_PRECISION_SLACK x the bound of a lower
    working precision than declared (e.g. bf16 arithmetic in a kernel that declares float32; vLLM's
    Triton kernel rotates in the cos dtype, docs/spec.md §8.1).

    After modest_rounding; before imprecise_neighbour (one cause before two) and the gross-error
    rules, which only look beyond what this precision explains."""
    cos, sin = ctx.cos_sin
    lower = _fitting_precision(ctx.spec, cos, sin, ctx.tensors, ctx.comparison.errors, ctx.precision, ctx.out_dtype)
    if lower is not None:
        return ctx.found("precision_loss",
                         f"small errors spread over {ctx.spread} (worst error/bound {ctx.comparison.worst_ratio:.3g}), "
                         f"all within {LOWER_PRECISION_SLACK:g}x the bound of {_dtype_name(lower)} working precision: "
                         f"the implementation computes in {_dtype_name(lower)} although it declares {ctx.declared}")
    return None


@_on_mismatch
def imprecise_neighbour(ctx: Context) -> Diagnosis | None:
    """The labels of rules 5-12: a neighbouring configuration that explains the output only in a
    lower working precision than declared (a structural bug *and* imprecise arithmetic: a
    mutant of the float32 path run on fp16/bf16 inputs).

    After the exact neighbouring rules (those explain it to the declared precision) and the
    precision rules (one cause before two); before the gross-error rules, whose subsets a
    structural bug would otherwise masquerade as."""
    for label in NEIGHBOURS:
        for result in ctx.neighbours(label):
            alt = result.alt
            if result.num_unknown or _explains(result, ctx.comparison):
                continue
            alt_tensors = [("query", alt.query, result.outputs[0])] + (
                [("key", alt.key, result.outputs[1])] if "key" in result.errors else [])
            lower = _fitting_precision(alt.spec, alt.cos, alt.sin, alt_tensors, result.errors, ctx.precision,
                                       ctx.out_dtype)
            if lower is not None:
                return ctx.found(alt.label, f"{alt.sentence}; besides, the arithmetic fits {_dtype_name(lower)} "
                                            f"working precision, not the declared {ctx.declared}")
    return None


def _one_tensor_wrong(ctx: Context, name: str, other: str) -> Diagnosis | None:
    g = ctx.gross
    if g.grossly == [name] and other in g.where:
        x, out, _ = ctx.inputs[name]
        unrotated = torch.equal(out.detach().to("cpu"), x)
        how = "it comes back exactly as it went in (never rotated)" if unrotated else f"the {other} is right"
        return ctx.found_gross(f"{name}_only",
                               f"only the {name} is wrong, {how}{g.rounding_note}: the {name} path (pointer, row "
                               f"stride, head count{' or the key-present switch' if name == 'key' else ''}) differs "
                               f"from the {other}'s")
    return None


@_on_mismatch
def key_only(ctx: Context) -> Diagnosis | None:
    """Only the key has gross errors, the query is right: the key path (pointer, row stride, head
    count, the key-present switch) differs from the query's, e.g. the key never rotated.

    First of the gross-error rules: it is the more specific subset (one key head or token wrong
    would otherwise be head_subset or token_subset)."""
    return _one_tensor_wrong(ctx, "key", "query")


@_on_mismatch
def query_only(ctx: Context) -> Diagnosis | None:
    """Only the query has gross errors, the key is right: the query path differs from the key's.

    Beside key_only (they cannot both fire), before head_subset and token_subset for the same
    reason."""
    return _one_tensor_wrong(ctx, "query", "key")


@_on_mismatch
def head_subset(ctx: Context) -> Diagnosis | None:
    """Only some heads have gross errors: a head loop bound or per-head offset, e.g. a tile or grid
    sized with prev_power_of_2 that misses the heads beyond the first power of two.

    After key_only / query_only; before token_subset (a head subset of every token is a head bug)."""
    g = ctx.gross
    where, grossly = g.where, g.grossly
    if not grossly or not all(len(where[n].heads) < where[n].num_heads for n in grossly):
        return None
    parts = ", ".join(f"{n} heads {ranges(where[n].heads)} of {where[n].num_heads}" for n in grossly)
    if all(where[n].heads == list(range(_prev_power_of_2(where[n].num_heads), where[n].num_heads))
           for n in grossly):
        return ctx.found_gross("head_subset",
                               f"only heads beyond the first power of two are wrong ({parts}){g.rounding_note}: a "
                               f"tile or grid sized with a power of two (prev_power_of_2) does not cover every head")
    return ctx.found_gross("head_subset", f"only some heads are wrong ({parts}){g.rounding_note}: the head loop "
                                          f"bound or the per-head offset")


@_on_mismatch
def token_subset(ctx: Context) -> Diagnosis | None:
    """Only some tokens have gross errors: the tokens at the last cache row (an off-by-one bound on
    the cache), every token but the first (a token stride), or a per-token offset or loop bound.

    After head_subset; before wrong_positions, which would also recover other positions for
    these tokens but cannot say the bug is in the token loop."""
    g = ctx.gross
    if not g.grossly:
        return None
    tokens = sorted(set().union(*(g.where[n].tokens for n in g.grossly)))
    num_tokens = g.where[g.grossly[0]].num_tokens
    if len(tokens) >= num_tokens:
        return None
    last = ctx.cache.shape[0] - 1
    at_last = (ctx.rows == last).any(dim=0).nonzero().flatten().tolist()
    if tokens == at_last:
        hint = (f"exactly the tokens with a position at the last cache row ({last}): an off-by-one bound on "
                f"the cache (the last row masked or read from the wrong place)")
    elif tokens == list(range(1, num_tokens)):
        hint = "every token but the first: a token (row) stride or offset is wrong"
    else:
        hint = "a per-token offset, the token loop bound, or the positions of these tokens"
    return ctx.found_gross("token_subset",
                           f"only tokens {ranges(tokens)} of {num_tokens} are wrong{g.rounding_note}: {hint}")


@_on_mismatch
def wrong_positions(ctx: Context) -> Diagnosis | None:
    """The output is the reference for other positions than given (recovered per token and position
    row from the angles of the output's pairs, matched to cache rows): cos/sin kept on the op from
    an earlier call (docs/spec.md §7.7), positions of another chunk (§7.5), a wrong positions
    pointer.

    Late: the recovery searches the cache and only an exact rotation counts, so it comes after
    every cheaper, more specific explanation."""
    for alt in _wrong_positions_alternative(ctx.spec, ctx.rows, ctx.query, ctx.key, ctx.out_q, ctx.out_k, ctx.cache):
        result = _alternative_result(alt, ctx.out_q, ctx.out_k, ctx.ref_q, ctx.ref_k, ctx.precision)
        if result is not None and _explains(result, ctx.comparison):
            return ctx.found_gross(alt.label, alt.sentence)
    return None


@_on_mismatch
def pass_through_and_rotary(ctx: Context) -> Diagnosis | None:
    """Label ``pass_through_touched``: pass-through channels differ from the input and the rotary
    channels are wrong too (everything computed in another precision, or garbage everywhere).

    Last: with the rotary channels wrong as well, every more specific cause must be ruled out
    first; pass_through_only names the pass-through channels alone."""
    if ctx.touched and ctx.rotary_wrong:
        return ctx.found_gross("pass_through_touched", _pass_through_sentence(ctx))
    return None


RULES = (
    writes_outside, wrong_output, nonfinite_output, out_of_bounds_read,
    pairing_swapped, axis_map_wrong, section_boundary_shifted, position_rows_swapped, position_rows_misread,
    row_stride_ignored, partial_rotary_stride, pair_rows_split,
    pass_through_only, modest_rounding, lower_working_precision, imprecise_neighbour,
    key_only, query_only, head_subset, token_subset, wrong_positions, pass_through_and_rotary,
)


def unknown(ctx: Context) -> Diagnosis:
    """The fallback when no rule hits: the location is all there is."""
    location = ctx.gross.location
    summary = "; ".join(f"{n}: " + ", ".join(f"{k} {v}" for k, v in location[n].items()) for n in ctx.wrong)
    return ctx.found_gross("unknown", f"no single cause found (not a neighbouring pairing, layout, section split, "
                                      f"row order or stride; not a subset of heads or tokens; errors too large for "
                                      f"lower precision): {summary}")


# --------------------------------------------------------------------------- diagnose
def diagnose(spec: RopeSpec, positions, query, key, cos_sin_cache, out_q, out_k, *,
             precision: str = "float32", ref=None, comparison: Comparison | None = None) -> Diagnosis:
    """Locate the mismatch between (out_q, out_k) and the reference and name its likely cause:
    the first of :data:`RULES` that hits, else :func:`unknown`.

    ``positions``, ``query``, ``key`` and ``cos_sin_cache`` are the untouched inputs as CPU
    tensors, with the strides the implementation saw (views into their storage, so that a
    kernel ignoring the row stride can be recognised); ``out_q``/``out_k`` the implementation's
    outputs (any device); ``precision`` its declared working precision.  ``ref`` (the float64
    reference outputs) and ``comparison`` (compare_rotation's result, possibly with extra
    problems appended by the caller) are recomputed when not given.
    """
    ctx = Context.build(spec, positions, query, key, cos_sin_cache, out_q, out_k,
                        precision=precision, ref=ref, comparison=comparison)
    if ctx.comparison.ok:
        return Diagnosis("match", "the outputs match the reference")
    for rule in RULES:
        found = rule(ctx)
        if found is not None:
            return found
    return unknown(ctx)
