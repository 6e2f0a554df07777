"""Where a rotation mismatch lies, and what most likely caused it.

:func:`diagnose` takes what the comparison saw (the spec, the untouched inputs, the
implementation's outputs, the float64 reference and the :class:`~rope.harness.tolerance.Comparison`)
and returns a :class:`Diagnosis`: a label, one sentence, and the location of the mismatched
elements per tensor over tokens, heads, frequencies, position rows, pair members and
pass-through channels.

The cause is found by elimination, most specific first:

1. ``wrong_output`` / ``writes_outside``: a tensor came back with the wrong shape, dtype or device
   (or None); positions, the cache, a guard or the value slice of a packed qkv tensor were written.
2. ``nan``: NaN/inf where the reference is finite (an out-of-bounds read from a guard region);
   ``out_of_bounds_read``: the values are right but the guards' tracer saw reads outside the
   inputs (properties/guards.py reports them as problems).
3. The output *is* the reference of a neighbouring configuration, to the declared precision:
   each candidate rotates the inputs by its own cos/sin and pairs and is held to the same
   per-element bound.  ``pairing_swapped`` (the other of NeoX / GPT-J), ``interleave_map_wrong``
   (the other layout), ``section_boundary_shifted`` (one section boundary, or one interleaved
   bound 3*s, moved by one), ``position_rows_swapped`` (position rows permuted),
   ``position_rows_misread`` (row d read at a wrong row stride: positions[0, t + d], or row 0
   for every frequency), ``row_stride_ignored`` (q/k rows read as if packed back to back),
   ``partial_rotary_stride`` (head_size/2 where rotary_dim/2 belongs: sin read past its row, or
   the NeoX partner at i + head_size/2), ``pair_rows_split`` (the sections laid over the whole
   rotary head in blocks of 2*s_i, so the two members of a NeoX pair take different position rows:
   transformers' HunYuanVL, SPEC §2).
4. ``pass_through_touched``: channels >= rotary_dim differ from the input, the rotary ones do not.
5. ``precision_loss``: every error fits the bound of a lower working precision than declared
   (LOWER_PRECISION_SLACK x), or the worst error/bound ratio is modest (<= MODEST_RATIO:
   truncating stores, an extra rounding).
6. Step 3 again, allowing the lower precision (a kernel with a structural bug *and* imprecise
   arithmetic).
7. From here only gross errors count (beyond bfloat16 rounding): ``key_only`` / ``query_only``
   (one tensor is right), ``head_subset`` (e.g. only the first power-of-two heads are right),
   ``token_subset`` (e.g. only tokens at the last cache row are wrong).
8. ``wrong_positions``: the output is an exact rotation by other positions than given (recovered
   per token and position row from the angles of the output's pairs, matched to cache rows):
   stale cos/sin, another chunk's positions, a wrong positions pointer.
9. ``pass_through_touched`` with the rotary channels wrong too; else ``unknown``: the location
   is all there is.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import torch

from reference.rotation import pair_indices, rotate, rotate_heads, select_cos_sin
from rope.spec import RopeSpec
from rope.harness.tolerance import Comparison, compare_rotation, rotation_bound, unit_roundoff, working_dtype

LABELS = (
    "match", "wrong_output", "writes_outside", "nan", "out_of_bounds_read", "pairing_swapped",
    "interleave_map_wrong", "section_boundary_shifted", "position_rows_swapped", "position_rows_misread",
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
    heads = bad.reshape(num_tokens, -1, spec.head_size)
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


def _structural_alternatives(spec: RopeSpec, positions, query, key, cache):
    """The neighbouring configurations a broken kernel may effectively compute, most specific
    first (positions renumbered to the rows of ``cache`` they use)."""
    other = "GPT-J pairs (2i, 2i+1)" if spec.is_neox_style else "NeoX pairs (i, i + rotary_dim/2)"
    asked = "NeoX" if spec.is_neox_style else "GPT-J"
    swapped = _replace(spec, is_neox_style=not spec.is_neox_style)
    if swapped is not None:
        yield _positions_alt(
            "pairing_swapped",
            f"the output matches the reference computed with {other} although the spec asks for {asked} "
            f"(is_neox_style={spec.is_neox_style}): the kernel ignores the pairing style",
            swapped, positions, query, key, cache)
    secs = spec.sections
    if secs is not None and len(secs) >= 2:
        if len(secs) == 3:
            layout = "chunked" if spec.layout == "interleaved" else "interleaved"
            alt = _replace(spec, layout=layout)
            if alt is not None:
                yield _positions_alt(
                    "interleave_map_wrong",
                    f"the output matches the reference with layout={layout!r} instead of {spec.layout!r}: "
                    f"the frequency-to-row map of sections={secs} is wrong (SPEC §2)", alt, positions, query, key, cache)
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
                           f"i // 3 <= s where i < 3*s belongs; SPEC §7.9)")
                else:
                    how = (f"the boundary between position rows {j} and {j + 1} is off by one frequency: "
                           f"{_moved(spec, alt)} (e.g. <= where < belongs)")
                yield _positions_alt(
                    "section_boundary_shifted",
                    f"the output matches the reference with sections={tuple(shifted)} instead of {secs}: {how}",
                    alt, positions, query, key, cache)
        identity = tuple(range(len(secs)))
        for perm in itertools.permutations(identity):
            if perm != identity:
                yield _positions_alt(
                    "position_rows_swapped",
                    f"the output matches the reference with the position rows read in the order {perm} "
                    f"instead of {identity}: rows swapped (e.g. the T/H/W order of the interleaved lanes, or a "
                    f"wrong row offset)", spec, positions[list(perm)], query, key, cache)
        # Row d read at a wrong row stride s: positions.flatten()[d * s + t].
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
    take different rows (transformers' HunYuanVL from 5.13; SPEC §2)."""
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
                f"text tokens (all rows equal) are unaffected (transformers' HunYuanVL layout; SPEC §2)")
    yield _Alt("pair_rows_split", sentence, spec, cos_a, sin_a, query, key, cos_b, sin_b)


def _partial_rotary_alternatives(spec: RopeSpec, rows, query, key, cache):
    """head_size/2 used where rotary_dim/2 belongs (partial rotary, SPEC §7.3): the sin offset into
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
                    f"(SPEC §7.3)")
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
        h = x.to(torch.float64).reshape(num_tokens, -1, spec.head_size)
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


# --------------------------------------------------------------------------- diagnose
def diagnose(spec: RopeSpec, positions, query, key, cos_sin_cache, out_q, out_k, *,
             precision: str = "float32", ref=None, comparison: Comparison | None = None) -> Diagnosis:
    """Locate the mismatch between (out_q, out_k) and the reference and name its likely cause.

    ``positions``, ``query``, ``key`` and ``cos_sin_cache`` are the untouched inputs as CPU
    tensors, with the strides the implementation saw (views into their storage, so that a
    kernel ignoring the row stride can be recognised); ``out_q``/``out_k`` the implementation's
    outputs (any device); ``precision`` its declared working precision.  ``ref`` (the float64
    reference outputs) and ``comparison`` (compare_rotation's result, possibly with extra
    problems appended by the caller) are recomputed when not given.
    """
    cpu = torch.device("cpu")
    positions, cache = positions.to(cpu), cos_sin_cache.to(cpu)
    cache_rows = cache.shape[0]
    if ref is None:
        ref = rotate(spec, positions, query, key, cache)
    ref_q, ref_k = (None if r is None else r.to(cpu, torch.float64) for r in ref)
    if comparison is None:
        comparison = compare_rotation(spec, positions, query, key, cache, out_q, out_k, ref_q, ref_k, precision)
    if comparison.ok:
        return Diagnosis("match", "the outputs match the reference")

    inputs = {"query": (query, out_q, ref_q), "key": (key, out_k, ref_k)}
    where = {name: _where(spec, comparison.errors[name] > comparison.bounds[name]) for name in comparison.errors}
    location = {name: w.summary(spec) for name, w in where.items() if w.count}

    def found(label: str, sentence: str) -> Diagnosis:
        return Diagnosis(label, sentence, location)

    # 1. Not a numeric question.  Problems the guards of properties/guards.py report: writes
    #    outside q/k, NaN in the output (judged at 2 with the values), out-of-bounds reads (named
    #    at 2, or alone when the values are right).
    outside = [p for p in comparison.problems if _is_write_problem(p)]
    if outside:
        return found("writes_outside", "; ".join(outside) + ": the implementation writes memory it may only read")
    reads = [p for p in comparison.problems if _is_read_problem(p)]
    other = [p for p in comparison.problems if p not in reads and "NaN in output" not in p]
    if other:
        return found("wrong_output", "; ".join(other))

    # 2. NaN / inf where the reference is finite.
    nonfinite = {}
    for name in comparison.errors:
        _, out, exp = inputs[name]
        nonfinite[name] = ~torch.isfinite(out.detach().to(cpu, torch.float64)) & torch.isfinite(exp)
    hit = [name for name, m in nonfinite.items() if bool(m.any())]
    if hit:
        name, mask = hit[0], nonfinite[hit[0]]
        token, col = divmod(int(mask.flatten().nonzero()[0]), mask.shape[1])
        head, channel = divmod(col, spec.head_size)
        counts = ", ".join(f"{int(nonfinite[n].sum())} {n}" for n in hit)
        w = _where(spec, mask)
        spread = (f"tokens {ranges(w.tokens)} of {w.num_tokens}, frequencies {ranges(w.freqs)} of {spec.num_freqs} "
                  f"(position rows {ranges(w.rows)})" + (f", pass-through channels {ranges(w.pass_through)}"
                                                         if w.pass_through else ""))
        traced = f"; the tracer saw {'; '.join(reads)}" if reads else ""
        return found("nan", f"{counts} element(s) are NaN/inf where the reference is finite, first at "
                            f"{name}[token {token}, head {head}, channel {channel}], over {name} {spread}: most "
                            f"likely an out-of-bounds read (cos/sin, positions or q/k loaded past the mask or "
                            f"the row, from a guard region or padding lanes){traced}")
    if comparison.num_mismatched == 0:       # only out-of-bounds reads: the values are right
        return found("out_of_bounds_read",
                     f"the outputs match the reference, but the implementation reads outside its inputs: "
                     f"{'; '.join(reads)}: a load mask that covers padding lanes or a stride past the row "
                     f"(memory safety: the values read never reach the output here)")

    # Every check below recomputes the reference; model caches hold up to a million rows, so keep
    # only the rows the positions use (same values, positions renumbered): identical results.
    full_cache, rows = cache, positions.long().reshape(spec.num_dims, -1)
    used, renumbered = torch.unique(positions.long(), return_inverse=True)
    positions, cache = renumbered.reshape(positions.shape), cache[used]
    out_dtype = query.dtype
    declared = _dtype_name(working_dtype(precision, out_dtype))

    # 3. The output is the reference of a neighbouring configuration, to the declared precision.
    alternatives = []
    candidates = itertools.chain(
        _structural_alternatives(spec, positions, query, key, cache),
        _partial_rotary_alternatives(spec, rows, query, key, full_cache),
        _pair_rows_split_alternatives(spec, rows, query, key, full_cache))
    for alt in candidates:
        result = _alternative_result(alt, out_q, out_k, ref_q, ref_k, precision)
        if result is None:
            continue
        if _explains(result, comparison):
            return found(alt.label, alt.sentence)
        alternatives.append(result)

    # 4. Pass-through channels must come back bit-exact (judged at 8 when the rotary channels are
    #    wrong too: computing everything in a lower precision, or a subset of garbage tokens or
    #    heads, touches both).
    touched = {name: w for name, w in where.items() if w.pass_through}
    rotary_wrong = any(w.freqs for w in where.values())

    def pass_through_touched() -> Diagnosis:
        parts = ", ".join(f"{name} channels {ranges(w.pass_through)}" for name, w in touched.items())
        return found("pass_through_touched",
                     f"pass-through channels (>= rotary_dim={spec.rotary_dim} of head_size={spec.head_size}) differ "
                     f"from the input ({parts}){'; rotary channels are wrong too' if rotary_wrong else ''}: they must "
                     f"be copied bit-exactly (a store covering head_size, or a round trip through another dtype)")
    if touched and not rotary_wrong:
        return pass_through_touched()

    # 5. Small errors everywhere: a lower working precision than declared, or one rounding too many.
    wrong = [name for name, w in where.items() if w.count]
    tensors = [(name, inputs[name][0], inputs[name][2]) for name in comparison.errors]
    spread = "; ".join(f"{name} {where[name].count}/{where[name].total} elements over "
                       f"{len(where[name].tokens)}/{where[name].num_tokens} tokens and "
                       f"{len(where[name].heads)}/{where[name].num_heads} heads" for name in wrong)
    if comparison.worst_ratio <= MODEST_RATIO:
        return found("precision_loss",
                     f"small errors spread over {spread} with a modest worst error/bound {comparison.worst_ratio:.3g}: "
                     f"rounding slightly worse than {declared} working precision allows (a truncating store, an extra "
                     f"intermediate rounding, or a slightly lower working precision)")
    cos, sin = select_cos_sin(spec, positions, cache)
    lower = _fitting_precision(spec, cos, sin, tensors, comparison.errors, precision, out_dtype)
    if lower is not None:
        return found("precision_loss",
                     f"small errors spread over {spread} (worst error/bound {comparison.worst_ratio:.3g}), all within "
                     f"{LOWER_PRECISION_SLACK:g}x the bound of {_dtype_name(lower)} working precision: the "
                     f"implementation computes in {_dtype_name(lower)} although it declares {declared}")

    # 3'. A neighbouring configuration computed in a lower precision (two bugs at once).
    for result in alternatives:
        alt = result.alt
        if result.num_unknown:
            continue
        alt_tensors = [("query", alt.query, result.outputs[0])] + (
            [("key", alt.key, result.outputs[1])] if "key" in result.errors else [])
        lower = _fitting_precision(alt.spec, alt.cos, alt.sin, alt_tensors, result.errors, precision, out_dtype)
        if lower is not None:
            return found(alt.label, f"{alt.sentence}; besides, the arithmetic fits {_dtype_name(lower)} working "
                                    f"precision, not the declared {declared}")

    # From here on, judge only gross errors: beyond what the coarsest lower precision explains.
    coarse = LOWER_PRECISIONS[-1]
    gross = {name: _where(spec, comparison.errors[name] > torch.maximum(
                 comparison.bounds[name], loose_bound(spec, cos, sin, x, exp, coarse, out_dtype)))
             for name, x, exp in tensors}
    grossly = [name for name in wrong if gross[name].count] or wrong
    for name in grossly:
        if gross[name].count and gross[name].count < where[name].count:   # report where the gross errors are
            location[name] = {**gross[name].summary(spec), "elements": (
                f"{gross[name].count}/{gross[name].total} beyond {_dtype_name(coarse)} rounding "
                f"({where[name].count} mismatched)")}
    where = {**where, **{name: gross[name] for name in grossly if gross[name].count}}
    rounding_only = [name for name in wrong if name not in grossly]
    rounding_note = (f" ({', '.join(rounding_only)} differs only by rounding, within {_dtype_name(coarse)} "
                     f"working precision)") if rounding_only else ""

    # 6. One of the two tensors is right.
    for name, other in (("key", "query"), ("query", "key")):
        if grossly == [name] and other in where:
            x, out, _ = inputs[name]
            unrotated = torch.equal(out.detach().to(cpu), x)
            how = "it comes back exactly as it went in (never rotated)" if unrotated else f"the {other} is right"
            return found(f"{name}_only",
                         f"only the {name} is wrong, {how}{rounding_note}: the {name} path (pointer, row stride, "
                         f"head count{' or the key-present switch' if name == 'key' else ''}) differs from the "
                         f"{other}'s")

    # 7. A subset of heads, or of tokens.
    if all(len(where[n].heads) < where[n].num_heads for n in grossly):
        parts = ", ".join(f"{n} heads {ranges(where[n].heads)} of {where[n].num_heads}" for n in grossly)
        if all(where[n].heads == list(range(_prev_power_of_2(where[n].num_heads), where[n].num_heads))
               for n in grossly):
            return found("head_subset",
                         f"only heads beyond the first power of two are wrong ({parts}){rounding_note}: a tile or "
                         f"grid sized with a power of two (prev_power_of_2) does not cover every head")
        return found("head_subset", f"only some heads are wrong ({parts}){rounding_note}: the head loop bound or "
                                    f"the per-head offset")
    tokens = sorted(set().union(*(where[n].tokens for n in grossly)))
    num_tokens = where[grossly[0]].num_tokens
    if len(tokens) < num_tokens:
        rows = used[positions.reshape(spec.num_dims, -1)]
        last = cache_rows - 1
        at_last = (rows == last).any(dim=0).nonzero().flatten().tolist()
        if tokens == at_last:
            hint = (f"exactly the tokens with a position at the last cache row ({last}): an off-by-one bound on "
                    f"the cache (the last row masked or read from the wrong place)")
        elif tokens == list(range(1, num_tokens)):
            hint = "every token but the first: a token (row) stride or offset is wrong"
        else:
            hint = "a per-token offset, the token loop bound, or the positions of these tokens"
        return found("token_subset", f"only tokens {ranges(tokens)} of {num_tokens} are wrong{rounding_note}: {hint}")

    # 8. The reference for the positions the output was actually rotated by (recovered from the
    #    angles of its pairs), to the declared precision.
    for alt in _wrong_positions_alternative(spec, rows, query, key, out_q, out_k, full_cache):
        result = _alternative_result(alt, out_q, out_k, ref_q, ref_k, precision)
        if result is not None and _explains(result, comparison):
            return found(alt.label, alt.sentence)

    # 9. Pass-through channels written along with wrong rotary channels everywhere, or nothing
    #    more specific.
    if touched:
        return pass_through_touched()
    summary = "; ".join(f"{n}: " + ", ".join(f"{k} {v}" for k, v in location[n].items()) for n in wrong)
    return found("unknown", f"no single cause found (not a neighbouring pairing, layout, section split, row order "
                            f"or stride; not a subset of heads or tokens; errors too large for lower precision): "
                            f"{summary}")
