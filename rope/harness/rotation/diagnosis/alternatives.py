"""The neighbouring configurations a broken kernel may have computed (the other pairing, axis map, a
shifted section boundary, permuted or misread position rows, packed rows, a partial-rotary stride,
split pair rows) and the positions an output was really rotated by: each rotates the inputs its own
way, held to the same per-element bound."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch

from rope.harness.rotation.diagnosis.verdict import ALTERNATIVE_KNOWN, ALTERNATIVE_RESIDUE
from rope.harness.rotation.bound import Comparison, rotation_bound
from rope.row_maps import CUSTOM, LAYOUT_ROWS, row_counts
from rope.spec import RopeSpec
from reference.rotation import pair_indices, rotate_heads, select_cos_sin


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


def moved_frequencies(old, new, *, shown: int = 3, count_the_rest: bool = False) -> str:
    """'frequency 61 takes row 1 instead of row 0': the first ``shown`` frequencies whose position
    row differs between two axis maps, and how many more (``count_the_rest``)."""
    moved = [i for i in range(len(old)) if old[i] != new[i]]
    text = ", ".join(f"frequency {i} takes row {new[i]} instead of row {old[i]}" for i in moved[:shown])
    return text + (f" (and {len(moved) - shown} more)" if count_the_rest and len(moved) > shown else "")


def _moved(spec: RopeSpec, alt: RopeSpec) -> str:
    """The frequencies whose row differs between the spec's map and ``alt``'s."""
    return moved_frequencies(spec.axis_map(), alt.axis_map(), count_the_rest=True)


def _positions_alt(label, sentence, spec, positions, query, key, cache):
    cos, sin = select_cos_sin(spec, positions, cache)
    return _Alt(label, sentence, spec, cos, sin, query, key)


def _empty_section_alt(spec: RopeSpec, secs, shifted, j, positions, query, key, cache):
    """A chunked boundary moved by one where it empties a section (sections (1, 1, 30) with the
    first boundary tested with > instead of >=: frequency 1 takes row 0, row 1 takes none)."""
    axis = spec.axis_map()
    new = [d for d, n in enumerate(shifted) for _ in range(n)]
    how = moved_frequencies(axis, new, shown=3)
    cos, sin = select_cos_sin(spec, positions, cache, new)
    return _Alt("section_boundary_shifted",
                f"the output matches the reference with sections={shifted} instead of {secs}: the boundary between "
                f"position rows {j} and {j + 1} is off by one frequency: {how} (e.g. > where >= belongs; row "
                f"{shifted.index(0)} is left with no frequency)", spec, cos, sin, query, key)


# The neighbouring configurations, one generator per label (positions renumbered to the rows of
# ``cache`` they use), each most specific first; NEIGHBOURS (below) lists them in rule order.
def pairing_alternatives(spec: RopeSpec, positions, query, key, cache):
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


def cos_sin_alternatives(spec: RopeSpec, positions, query, key, cache):
    """cos and sin misused in the rotation itself: sin's sign flipped (a rotation by -theta:
    x1*cos + x2*sin, x2*cos - x1*sin), or cos and sin swapped (cos read from the sin half of the
    cache row and the reverse)."""
    cos, sin = select_cos_sin(spec, positions, cache)
    yield _Alt("cos_sin_misused",
               "the output matches the reference with sin's sign flipped (a rotation by -theta: x1*cos + x2*sin, "
               "x2*cos - x1*sin where x1*cos - x2*sin, x2*cos + x1*sin belongs)", spec, cos, -sin, query, key)
    yield _Alt("cos_sin_misused",
               "the output matches the reference with cos and sin swapped (cos read from the second half of the "
               "cache row, sin from the first: the cache row is cos | sin)", spec, sin, cos, query, key)


def table_alternatives(spec: RopeSpec, positions, query, key, cache):
    """The table itself read wrong: an fp32 table rounded to the activations' dtype before use
    (where q's dtype is narrower than the table's), or cos and sin saturated to [-1, 1] (where the
    attention factor folded into a scaled spec's table scales them past 1)."""
    if query.dtype != cache.dtype and torch.finfo(query.dtype).eps > torch.finfo(cache.dtype).eps:
        cos, sin = select_cos_sin(spec, positions, cache.to(query.dtype))
        yield _Alt("table_misread",
                   f"the output matches the reference computed from the {str(cache.dtype)[6:]} table rounded to "
                   f"{str(query.dtype)[6:]}: the kernel casts the cos/sin table to the activations' dtype before "
                   f"its products", spec, cos, sin, query, key)
    largest = float(cache.abs().max()) if cache.numel() else 0.0
    if largest > 1.0:
        cos, sin = select_cos_sin(spec, positions, cache.clamp(-1.0, 1.0))
        yield _Alt("table_misread",
                   f"the output matches the reference computed with cos and sin clamped to [-1, 1]: the kernel "
                   f"saturates the table, whose attention factor scales its entries up to {largest:.4g}",
                   spec, cos, sin, query, key)


def axis_map_alternatives(spec: RopeSpec, positions, query, key, cache):
    """Every other named layout's map of the same sections (chunked for interleaved, interleaved
    or GLM round-robin for chunked, chunked for two-row interleaved, ...), then the spec's own map
    read one frequency off either way (every map but chunked and interleaved)."""
    secs = spec.sections
    if secs is None or len(secs) < 2:
        return
    axis = spec.axis_map()
    seen = {axis}
    for layout, rows in LAYOUT_ROWS.items():
        if layout == spec.layout or rows not in (None, len(secs)):
            continue
        alt = _replace(spec, layout=layout, freq_rows=None)
        if alt is None or alt.axis_map() in seen:
            continue
        seen.add(alt.axis_map())
        yield _positions_alt(
            "axis_map_wrong",
            f"the output matches the reference with layout={layout!r} instead of {spec.layout!r}: "
            f"the axis map of sections={secs} is wrong: {_moved(spec, alt)} (docs/spec.md §2)",
            alt, positions, query, key, cache)
    if spec.layout == "interleaved":
        # The round-robin T H W T H W over every frequency, the bounds 3*s of the rows ignored.
        rows = tuple(i % len(secs) for i in range(spec.num_freqs))
        if rows in _bound_shift_maps(spec):
            rows = axis                          # no more than a bound off by one group: the next rule's
        alt = None if rows in seen else _replace(spec, layout=CUSTOM, freq_rows=rows,
                                                  sections=row_counts(rows, len(secs)))
        if alt is not None:
            seen.add(rows)
            yield _positions_alt(
                "axis_map_wrong",
                f"the output matches the interleaved map without its bounds: frequency i takes row i % {len(secs)} "
                f"over every frequency, where rows 1-{len(secs) - 1} stop at 3*s (sections={secs}): "
                f"{_moved(spec, alt)} (docs/spec.md §2)", alt, positions, query, key, cache)
    if spec.layout in ("chunked", "interleaved"):
        return
    # Custom maps next to the spec's own: the round-robin without its pass-on, the map one frequency off.
    candidates = []
    if spec.layout == "glm_round_robin":
        candidates.append((tuple(i % len(secs) for i in range(spec.num_freqs)), lambda alt: (
            f"the output matches the GLM round-robin map without its pass-on: frequency i takes row i % 3 even "
            f"where that row already drives its section's count: {_moved(spec, alt)} (SGLang's "
            f"mrope_interleaved_glm passes on to the next row with room)")))
    for step, how in ((1, "i + 1 (the last that of 0)"), (-1, "i - 1 (the first that of the last)")):
        candidates.append((axis[step:] + axis[:step], lambda alt, how=how: (
            f"the output matches the reference with the {spec.layout} map read one frequency off: frequency i "
            f"takes the row of frequency {how}: {_moved(spec, alt)} (e.g. a map table indexed from 1)")))
    for rows, sentence in candidates:
        alt = None if rows in seen else _replace(spec, layout=CUSTOM, freq_rows=rows,
                                                  sections=row_counts(rows, len(secs)))
        if alt is not None:
            seen.add(rows)
            yield _positions_alt("axis_map_wrong", sentence(alt), alt, positions, query, key, cache)


def chunked_bounds(secs) -> list[int]:
    """The section boundaries of a chunked map: the first frequency of every section after the
    first (cumsum(sections)[:-1]); frequency i takes row ``#{b <= i}``."""
    return list(itertools.accumulate(secs))[:-1]


def _bound_shift_maps(spec: RopeSpec) -> set:
    """The interleaved maps with one bound, or every bound, off by one group (the maps
    section_boundary_shifted tries)."""
    secs, n = spec.sections, len(spec.sections)
    shifts = [tuple((step if r == j + 1 else -step if r == j else 0) for r in range(n))
              for j in range(n - 1) for step in (1, -1)]
    shifts += [tuple(-(n - 1) * step if r == 0 else step for r in range(n)) for step in (1, -1)]
    maps = set()
    for shift in shifts:
        shifted = tuple(s + d for s, d in zip(secs, shift))
        alt = _replace(spec, sections=shifted) if min(shifted) > 0 else None
        if alt is not None:
            maps.add(alt.axis_map())
    return maps


def _systematic_shift_alternatives(spec: RopeSpec, positions, query, key, cache):
    """Every section boundary moved by the same offset, +1 and -1: the slip of a ``<`` / ``<=`` in
    the one comparison every boundary goes through (``torch.bucketize(i, cumsum(sections))`` with
    its default right=False, ``i <= bound``; interleaved ``i // 3 <= s`` for every row), which moves
    all boundaries at once.  Only where there are two boundaries or more (one boundary: the
    single-boundary alternatives are the same thing)."""
    secs = spec.sections
    if secs is None or len(secs) < 3 or spec.layout not in ("chunked", "interleaved"):
        return
    axis = spec.axis_map()
    for step in (1, -1):
        if spec.layout == "chunked":
            bounds = chunked_bounds(secs)
            moved_bounds = [b + step for b in bounds]
            new = tuple(sum(b <= i for b in moved_bounds) for i in range(spec.num_freqs))
            if new == axis:
                continue
            counts = tuple(new.count(d) for d in range(len(secs)))
            which = ("the first frequency of every section after the first reads the previous section's row"
                     if step > 0 else "the last frequency of every section before the last reads the next "
                                      "section's row")
            slip = ("e.g. torch.bucketize(i, cumsum(sections)) with its default right=False, or i <= bound "
                    "where i < bound belongs" if step > 0 else "e.g. i < bound - 1, or i + 1 >= bound, where "
                                                               "i < bound belongs")
            how = moved_frequencies(axis, new, shown=4)
            cos, sin = select_cos_sin(spec, positions, cache, new)
            yield _Alt("section_boundary_shifted",
                       f"the output matches the reference with every section boundary moved by {step:+d} frequency "
                       f"(boundaries {', '.join(map(str, bounds))} of sections={secs} act as "
                       f"{', '.join(map(str, moved_bounds))}: sections {counts}): {which}: {how} ({slip})",
                       spec, cos, sin, query, key)
        else:
            shifted = (secs[0] - (len(secs) - 1) * step,) + tuple(s + step for s in secs[1:])
            alt = _replace(spec, sections=shifted) if min(shifted) > 0 else None
            if alt is None or alt.axis_map() == axis:
                continue
            bounds = " and ".join(f"i < 3*s_{r} = {3 * secs[r]} acts as i < {3 * shifted[r]}"
                                  for r in range(1, len(secs)))
            yield _positions_alt(
                "section_boundary_shifted",
                f"the output matches the reference with sections={shifted} instead of {secs}: every interleaved "
                f"bound is off by {step:+d} group ({bounds}): {_moved(spec, alt)} (e.g. i // 3 <= s where i < 3*s "
                f"belongs, in the one comparison every row goes through; docs/spec.md §7.9)",
                alt, positions, query, key, cache)


def section_boundary_alternatives(spec: RopeSpec, positions, query, key, cache):
    """Every section boundary moved by the same offset (:func:`_systematic_shift_alternatives`),
    then each section boundary (each interleaved bound 3*s) moved by one frequency either way."""
    secs = spec.sections
    if secs is None or len(secs) < 2:
        return
    yield from _systematic_shift_alternatives(spec, positions, query, key, cache)
    axis = spec.axis_map()
    for j in range(len(secs) - 1):
        for step in (1, -1):
            shifted = list(secs)
            shifted[j] += step
            shifted[j + 1] -= step
            if min(shifted) < 0:
                continue
            if spec.layout not in ("chunked", "interleaved"):
                continue                          # the other maps: axis_map_alternatives
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


def row_order_alternatives(spec: RopeSpec, positions, query, key, cache):
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


def row_misread_alternatives(spec: RopeSpec, positions, query, key, cache):
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


def row_stride_alternatives(spec: RopeSpec, positions, query, key, cache):
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


def _misread_views(x, head_size: int):
    """``x`` (a [T, H * D] view with a column stride c != 1) read the ways a kernel that assumes
    unit-stride heads reads it: (how, misread view) with each head at the contiguous head stride D
    from its token's start, channels at the column stride (heads after the first read elsewhere:
    aiter#3841's non-contiguous q), and with the column stride taken as 1 (channels back to back
    from the token's start); the reinterpretations that stay inside the storage."""
    if x is None or x.shape[0] == 0 or x.stride(1) == 1 or x.shape[1] == 0:
        return
    tokens, width = x.shape
    heads, size = width // head_size, x.untyped_storage().nbytes() // x.element_size()
    for how, shape, stride in (
            ("each head at the contiguous head stride (head h from channel h*head_size of the token's start, "
             "channels at the column stride)", (tokens, heads, head_size), (x.stride(0), head_size, x.stride(1))),
            ("channels read back to back (the column stride taken as 1)", (tokens, width), (x.stride(0), 1))):
        last = x.storage_offset() + sum((n - 1) * s for n, s in zip(shape, stride))
        if last < size:
            yield how, x.as_strided(shape, stride, x.storage_offset()).reshape(tokens, width)


def view_misread_alternatives(spec: RopeSpec, positions, query, key, cache):
    """q/k with a column stride (heads-major views) read as if heads or channels were unit-stride."""
    misread = {name: list(_misread_views(x, spec.head_size)) for name, x in (("query", query), ("key", key))}
    for i in range(2):
        q = misread["query"][i] if i < len(misread["query"]) else None
        k = misread["key"][i] if i < len(misread["key"]) else None
        if q is None and k is None:
            continue
        how = (q or k)[0]
        strides = ", ".join(f"{n} strides {tuple(x.stride())}" for n, x in (("query", query), ("key", key))
                            if x is not None)
        yield _positions_alt(
            "view_misread",
            f"the output matches the reference applied to q/k read through another layout than their view "
            f"({strides}): {how}; the kernel ignores the view's head or column stride",
            spec, positions, q[1] if q else query, k[1] if k else key, cache)


def _rotate_members(spec: RopeSpec, x, cos_a, sin_a, cos_b, sin_b):
    """:func:`reference.rotation.rotate_heads` with member b of each pair rotated by its own
    cos/sin: member a's channels from the rotation by (cos_a, sin_a), b's from (cos_b, sin_b)."""
    out = rotate_heads(spec, x, cos_a, sin_a)
    other = rotate_heads(spec, x, cos_b, sin_b)
    _, b_idx = pair_indices(spec)
    shape = (x.shape[0], -1, spec.head_size)
    out.view(shape)[..., b_idx] = other.view(shape)[..., b_idx]
    return out


def pair_rows_split_alternatives(spec: RopeSpec, rows, query, key, cache):
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


def partial_rotary_alternatives(spec: RopeSpec, rows, query, key, cache):
    """head_size/2 used where rotary_dim/2 belongs (partial rotary, docs/spec.md §7.3): the sin offset into
    a cache row and/or the NeoX partner channel.  ``rows``: [num_dims, T] positions into ``cache``
    (the full cache: a sin read past its row's end lands in the next row)."""
    hs, rd, half = spec.head_size, spec.rotary_dim, spec.num_freqs
    if rd >= hs or hs % 2:
        return
    cos, sin = select_cos_sin(spec, rows, cache)
    flat = _storage_tail(cache)
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
    # head_size/2 as the lane bound too: every lane of the kernel's block rotates, up to head_size/2
    # (a block of a power of two lanes, or the whole head).
    lane_counts = sorted({hs // 2} | {1 << k for k in range(hs.bit_length()) if half < 1 << k < hs // 2})
    for lanes in lane_counts if wide is not None else ():
        found = _head_wide_lanes(spec, rows, flat, lanes)
        pairs = f"(i, i + {hs // 2})" if spec.is_neox_style else "(2i, 2i + 1)"
        yield _Alt("partial_rotary_stride",
                   f"the output matches the reference computed with head_size/2 = {hs // 2} where rotary_dim/2 = "
                   f"{half} belongs (partial rotary: rotary_dim={rd} < head_size={hs}) as the lane bound, the sin "
                   f"offset{' and the NeoX partner' if spec.is_neox_style else ''}: every pair {pairs} for i < "
                   f"{lanes} rotates, pass-through channels included, by cos/sin read from the cache row as if it "
                   f"were head_size wide (docs/spec.md §7.3)", wide, found[0], found[1], query, key)


def _head_wide_lanes(spec: RopeSpec, rows, flat, lanes: int):
    """cos, sin [T, head_size/2] of a kernel whose first ``lanes`` lanes rotate and read the cache
    row as if it were head_size wide: lane i reads element i (cos) and head_size/2 + i (sin) from
    the start of its position's row of rotary_dim elements (NaN past the cache); lanes past
    rotary_dim/2 take the row the map's rule gives them (chunked: the last; interleaved: row r
    where i % 3 == r and i < 3*s_r, else 0; 1-D: 0; a map table: unknowable, read past its end);
    lanes from ``lanes`` on leave their pair alone (cos 1, sin 0)."""
    hs, rd, secs = spec.head_size, spec.rotary_dim, spec.sections
    extra = lanes - spec.num_freqs
    if secs is None or len(secs) == 1:
        axis = [0] * lanes
    elif spec.layout == "chunked":
        axis = list(spec.axis_map()) + [len(secs) - 1] * extra
    elif spec.layout == "interleaved":
        axis = [i % 3 if i % 3 and i < 3 * secs[i % 3] else 0 for i in range(lanes)]
    else:
        axis = list(spec.axis_map()) + [None] * extra       # a map table read past its end: unknowable
    pos = torch.stack([rows[0] if a is None else rows[a] for a in axis], dim=1).long()    # [T, lanes]
    unknowable = torch.tensor([a is None for a in axis])
    out = []
    for offset, idle in ((0, 1.0), (hs // 2, 0.0)):
        index = pos * rd + offset + torch.arange(lanes)
        values = torch.full((pos.shape[0], hs // 2), idle, dtype=torch.float64)
        read = torch.full(index.shape, float("nan"), dtype=torch.float64)
        inside = (index < flat.numel()) & ~unknowable
        read[inside] = flat[index[inside]].to(torch.float64)
        values[:, :lanes] = read
        out.append(values)
    return tuple(out)


def _storage_tail(cache):
    """The cache flattened, continued to the end of its storage where it is a contiguous view into
    a longer table (the rows past max_position a read past the cache's end meets)."""
    flat = cache.reshape(-1)
    if not cache.is_contiguous():
        return flat
    available = cache.untyped_storage().nbytes() // cache.element_size() - cache.storage_offset()
    if available <= flat.numel():
        return flat
    return cache.as_strided((available,), (1,), cache.storage_offset())


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


def wrong_positions_alternative(spec, rows, query, key, out_q, out_k, cache):
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


def alternative_result(alt: _Alt, out_q, out_k, ref_q, ref_k, precision) -> _AltResult | None:
    """The alternative's outputs and how the implementation's outputs compare with them (the
    bound of rope.harness.rotation.bound for the alternative's pairs and cos/sin; NaN in the alternative:
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


def explains(result: _AltResult, comparison: Comparison) -> bool:
    """At most ALTERNATIVE_RESIDUE of the original mismatches left, and at least
    ALTERNATIVE_KNOWN of them (one at least) where the alternative is known: an alternative
    unknowable wherever the output is wrong (a read past the cache) explains nothing."""
    if result.num_mismatched > ALTERNATIVE_RESIDUE * comparison.num_mismatched:
        return False
    known = sum(int(((comparison.errors[name] > comparison.bounds[name]) & ~torch.isnan(err)).sum())
                for name, err in result.errors.items() if name in comparison.errors)
    return known >= max(1, ALTERNATIVE_KNOWN * comparison.num_mismatched)
