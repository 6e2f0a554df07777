"""The rules, most specific first: each ``rule(ctx) -> Diagnosis | None`` (the order and why: the
package's docstring)."""

from __future__ import annotations

import functools

import torch

from rope.harness.rotation.diagnosis.alternatives import alternative_result, explains, wrong_positions_alternative
from rope.harness.rotation.diagnosis.context import Context, NEIGHBOURS
from rope.harness.rotation.diagnosis.locations import prev_power_of_2, mismatch_locations, ranges
from rope.harness.rotation.diagnosis.precision import (dtype_name, fitting_precision, is_view_write_problem,
                                                       is_write_problem)
from rope.harness.rotation.diagnosis.verdict import Diagnosis, LOWER_PRECISION_SLACK, MODEST_RATIO
from reference.rotation import exact_frequencies, pair_indices


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
    """Writes outside q/k: positions, the cos/sin cache or a guard modified, or traced out-of-bounds /
    wild / read-only writes (rope/harness/guards.py).

    First: not a numeric question, and a write outside may corrupt what every later rule reads.
    Writes to q's and k's own buffer outside their views are wrote_outside_view's, next."""
    outside = [p for p in ctx.comparison.problems if is_write_problem(p) and not is_view_write_problem(p)]
    if outside:
        return ctx.found("writes_outside", "; ".join(outside) + ": the implementation writes memory it may only read")
    return None


@_on_mismatch
def wrote_outside_view(ctx: Context) -> Diagnosis | None:
    """Writes to q's and k's buffer outside their views: V's heads of a packed or heads-major qkv
    buffer, the gaps between strided rows (a store past the row width, a row taken as wide as its
    stride), or a same-buffer view left holding neither its input nor the returned output (an
    in-place result written elsewhere than returned, llama.cpp#20274).

    After writes_outside (positions or the cache written is the graver fault); before every value
    rule: the values the rules would read may be what the stray write left."""
    outside = [p for p in ctx.comparison.problems if is_view_write_problem(p)]
    if outside:
        return ctx.found("wrote_outside_view", "; ".join(outside) + ": the implementation writes its buffer "
                                                                    "outside the q/k views it was handed")
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
    guard region of rope/harness/guards.py.

    Before the value rules: a NaN makes every error comparison meaningless (it would read as
    query_only, head_subset or token_subset).  On inputs with NaN/inf planted, a neighbouring
    configuration that explains the output, NaN/inf included, goes first (a misread of q/k or a
    wrong pairing carries the planted values elsewhere), and so does a partial-rotary stride that
    the changed channels show (its reads past the cache are what brings the NaN)."""
    if (ctx.planted_nonfinite and _neighbour_explains(ctx)) or _partial_rotary_channels(ctx) is not None:
        return None
    nonfinite = ctx.nonfinite
    hit = [name for name, m in nonfinite.items() if bool(m.any())]
    if not hit:
        return _nonfinite_lost(ctx)
    spec = ctx.spec
    name, mask = hit[0], nonfinite[hit[0]]
    token, col = divmod(int(mask.flatten().nonzero()[0]), mask.shape[1])
    head, channel = divmod(col, spec.head_size)
    counts = ", ".join(f"{int(nonfinite[n].sum())} {n}" for n in hit)
    w = mismatch_locations(spec, mask)
    spread = (f"tokens {ranges(w.tokens)} of {w.num_tokens}, frequencies {ranges(w.freqs)} of {spec.num_freqs} "
              f"(position rows {ranges(w.rows)})" + (f", pass-through channels {ranges(w.pass_through)}"
                                                     if w.pass_through else ""))
    traced = f"; the tracer saw {'; '.join(ctx.reads)}" if ctx.reads else ""
    return ctx.found("nan", f"{counts} element(s) are NaN/inf where the reference is finite, first at "
                            f"{name}[token {token}, head {head}, channel {channel}], over {name} {spread}: most "
                            f"likely an out-of-bounds read (cos/sin, positions or q/k loaded past the mask or "
                            f"the row, from a guard region or padding lanes){traced}")


def _neighbour_explains(ctx: Context) -> bool:
    """Some neighbouring configuration (rules 6-16) explains the output, NaN/inf included: it
    explains the values and is non-finite exactly where the output is."""
    def same_nonfinite(result) -> bool:
        return all(exp is None or out is None or torch.equal(torch.isfinite(exp),
                                                             torch.isfinite(out.detach().to("cpu", torch.float64)))
                   for exp, out in zip(result.outputs, (ctx.out_q, ctx.out_k)))
    return any(explains(result, ctx.comparison) and same_nonfinite(result)
               for label in NEIGHBOURS for result in ctx.neighbours(label))


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
    ALTERNATIVE_RESIDUE of the mismatches left, to the declared precision).  Where it leaves some
    mismatches, a neighbouring configuration of any label that leaves fewer is the better
    explanation (two maps can nearly coincide on an input: Ernie's H W alternation read one
    frequency off is nearly its rows swapped)."""
    for result in ctx.neighbours(label):
        if explains(result, ctx.comparison):
            best = result
            if best.num_mismatched:
                for other in NEIGHBOURS:
                    for candidate in ctx.neighbours(other):
                        if candidate.num_mismatched < best.num_mismatched and explains(candidate, ctx.comparison):
                            best = candidate
            return ctx.found(best.alt.label, best.alt.sentence)
    return None


@_on_mismatch
def pairing_swapped(ctx: Context) -> Diagnosis | None:
    """The output is the reference with the other pairing style: NeoX pairs (i, i + rotary_dim/2)
    for a GPT-J model or the reverse, the kernel ignoring is_neox_style (docs/spec.md §7.1).

    First of the neighbouring configurations (6-16): they come before the precision and subset
    rules because an exact alternative explains every error, small ones included (a structural bug
    can look like rounding, or hit only some tokens).  The pairing swap changes every pair, so it
    is tried before the alternatives that move only some frequencies."""
    return _explained_by(ctx, "pairing_swapped")


@_on_mismatch
def cos_sin_misused(ctx: Context) -> Diagnosis | None:
    """The output is the reference with cos and sin misused in the rotation: sin's sign flipped (a
    rotation by -theta) or cos and sin swapped (the two halves of the cache row read the other way).

    After pairing_swapped (which pairs, before what they are rotated by); before the axis-map rules:
    it changes every frequency of every row, they change the row of some frequencies."""
    return _explained_by(ctx, "cos_sin_misused")


@_on_mismatch
def table_misread(ctx: Context) -> Diagnosis | None:
    """The output is the reference from the table read another way: an fp32 table rounded to the
    activations' dtype first (its low bits lost: a precision loss the kernel does not declare), or
    cos and sin saturated to [-1, 1] where a scaled spec's attention factor takes them past 1.

    After cos_sin_misused (what cos and sin are, before where each frequency reads them); before
    the precision rules, which would call the rounded table a lower working precision."""
    return _explained_by(ctx, "table_misread")


@_on_mismatch
def axis_map_wrong(ctx: Context) -> Diagnosis | None:
    """The output is the reference with another layout's axis map of the same sections (chunked
    for Qwen3-VL's interleaved T H W T H W or the reverse, interleaved for GLM round-robin, chunked
    for the two-row map; docs/spec.md §7.9, the maps §2), or with a table-read map one frequency
    off: which position row each frequency takes is wrong as a whole.

    After pairing_swapped (the pairs themselves come first); before section_boundary_shifted, the
    finer error of one frequency on the wrong side of a bound."""
    return _explained_by(ctx, "axis_map_wrong")


@_on_mismatch
def section_boundary_shifted(ctx: Context) -> Diagnosis | None:
    """The output is the reference with every section boundary moved by the same offset, +1 or -1
    (one ``<`` / ``<=`` slip in the comparison every boundary goes through: torch.bucketize with its
    default right=False puts the first frequency of every section after the first in the previous
    section's row), with one section boundary moved by one frequency (chunked: <= where < belongs,
    or a boundary that empties a row), or with the interleaved bounds 3*s off by one group, all of
    them or one (docs/spec.md §7.9).  The systematic shift is tried first: one slip, one cause.

    After axis_map_wrong (the whole map before its bounds); before the position-row rules, which
    change every frequency of a row."""
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
def view_misread(ctx: Context) -> Diagnosis | None:
    """The output is the reference applied to q/k read through another layout than the view they
    came in: a heads-major view (column stride T) read with each head at the contiguous head stride,
    or with unit-stride channels (aiter#3841: heads after the first read outside the view).

    After row_stride_ignored (the row stride is the more common slip); only q/k with a column stride
    can show it."""
    return _explained_by(ctx, "view_misread")


@_on_mismatch
def partial_rotary_stride(ctx: Context) -> Diagnosis | None:
    """The output is the reference with head_size/2 where rotary_dim/2 belongs (partial rotary,
    docs/spec.md §7.3): sin read at offset head_size/2 + i of the cache row (past the row's end),
    and/or the NeoX partner of frequency i at i + head_size/2.

    Where every read went past the cache (every token at its last row), the values are
    unknowable, and the channels it changed tell it: the pass-through channels wrong are exactly
    those of pairs rotated by lanes up to head_size/2 (or a power-of-two block of them).

    After the configurations of the spec's own shape (6-13): it reads the full cache, past the
    rows the positions use; partial rotary only (rotary_dim < head_size)."""
    return _explained_by(ctx, "partial_rotary_stride") or _partial_rotary_channels(ctx)


def partial_rotary_lane_channels(spec, lanes: int) -> set:
    """The pass-through channels a kernel rotating ``lanes`` lanes with head_size/2 as the NeoX
    partner offset (GPT-J: pairs (2i, 2i + 1)) writes."""
    hs, rd = spec.head_size, spec.rotary_dim
    chans = ({i for i in range(lanes)} | {i + hs // 2 for i in range(lanes)} if spec.is_neox_style
             else set(range(2 * lanes)))
    return {c for c in chans if rd <= c < hs}


def _reads_past_cache_everywhere(ctx: Context) -> bool:
    """Every token's sin, read at head_size/2 + i of its rows, lies past the cache (every token at
    the cache's last rows), and the rotary channels are grossly wrong: the values are garbage a
    partial-rotary stride read, with no rounding to mistake them for."""
    spec = ctx.spec
    rows, numel = ctx.rows.long(), ctx.cache.numel()
    past = (rows.max(dim=0).values * spec.rotary_dim + spec.head_size // 2 + spec.num_freqs > numel)
    if not bool(past.all()) or ctx.comparison.worst_ratio <= MODEST_RATIO:
        return False
    cos, sin = ctx.cos_sin
    return fitting_precision(spec, cos, sin, ctx.tensors, ctx.finite_errors, ctx.precision, ctx.out_dtype) is None


def _partial_rotary_channels(ctx: Context) -> Diagnosis | None:
    """partial_rotary_stride from the location alone: rotary channels wrong, and the wrong
    pass-through channels exactly those of lanes up to head_size/2 or a power-of-two block (all of
    them only where every token's reads lie past the cache: elsewhere every pass-through channel
    wrong has no pattern to tell a stride by)."""
    spec = ctx.spec
    hs, half = spec.head_size, spec.num_freqs
    if spec.rotary_dim >= hs or not ctx.rotary_wrong or not ctx.touched:
        return None
    touched = set().union(*(set(w.pass_through) for w in ctx.touched.values()))
    if touched == set(range(spec.rotary_dim, hs)) and not _reads_past_cache_everywhere(ctx):
        return None          # every pass-through channel: no pattern (rounding, garbage) to tell it by
    for lanes in sorted({hs // 2} | {1 << k for k in range(hs.bit_length()) if half < 1 << k < hs // 2}):
        if touched == partial_rotary_lane_channels(spec, lanes):
            return ctx.found(
                "partial_rotary_stride",
                f"the rotary channels are wrong and the pass-through channels changed are exactly those of "
                f"{lanes} lanes with head_size/2 = {hs // 2} where rotary_dim/2 = {half} belongs (partial rotary: "
                f"rotary_dim={spec.rotary_dim} < head_size={hs}) as the lane bound"
                f"{' and the NeoX partner offset' if spec.is_neox_style else ''}; the values read are past the "
                f"cache (unknowable here), the channels written say the stride (docs/spec.md §7.3)")
    return None


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
def own_angles_off(ctx: Context) -> Diagnosis | None:
    """Label ``angle_error``: an implementation that computes its own angles (``angles =
    "own-float32"``) is off beyond their float32 error, by small angles only (every error under a
    tenth of |a| + |b|: not a wrong row, pairing or map).  Where every wrong frequency is exactly 1
    the angle is the position itself, exact in float32, and the error is the sine's and cosine's
    own: an argument reduction that is not exact (fast-math ``__sinf`` / ``__cosf``).

    After the neighbouring configurations (structural bugs first); before the precision rules,
    whose bounds are the cache's and know nothing of angles."""
    if ctx.angles == "cache":
        return None
    spec = ctx.spec
    a_idx, b_idx = pair_indices(spec)
    freqs = set()
    for name, (x, _, _) in ctx.inputs.items():
        err, bound = ctx.comparison.errors.get(name), ctx.comparison.bounds.get(name)
        if err is None or x is None:
            continue
        heads = x.to(torch.float64).reshape(x.shape[0], -1, spec.head_size).abs()
        size = (heads[..., a_idx] + heads[..., b_idx]).repeat(1, 1, 2)            # |a| + |b| per member
        err, bad = err.reshape(heads.shape), (err > bound).reshape(heads.shape)
        rotary_err, rotary_bad = err[..., torch.cat((a_idx, b_idx))], bad[..., torch.cat((a_idx, b_idx))]
        if bad[..., spec.rotary_dim:].any() or (rotary_err[rotary_bad] > 0.1 * size[rotary_bad]).any():
            return None
        freqs |= {int(i) % spec.num_freqs for i in torch.nonzero(rotary_bad.any(dim=(0, 1))).flatten()}
    if not freqs:
        return None
    exact = bool((exact_frequencies(spec)[sorted(freqs)] == 1.0).all())
    where = f"freqs {ranges(sorted(freqs))} of {spec.num_freqs}"
    if exact:
        return ctx.found("angle_error",
                         f"its own angles are off at {where}, whose frequency is 1: the angle is the position itself, "
                         f"exact in float32, so its sine and cosine do not reduce the argument exactly (fast-math "
                         f"__sinf / __cosf, 2 pi subtracted in float32)")
    return ctx.found("angle_error",
                     f"its own angles are off at {where} beyond their float32 error (the float32 products and powers "
                     f"of the frequencies): a lower-precision angle, or sine and cosine not reduced exactly")


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

    Elements where the reference is NaN/inf are left out (nonfinite_output judged them).  After
    modest_rounding; before imprecise_neighbour (one cause before two) and the gross-error rules,
    which only look beyond what this precision explains."""
    cos, sin = ctx.cos_sin
    lower = fitting_precision(ctx.spec, cos, sin, ctx.tensors, ctx.finite_errors, ctx.precision, ctx.out_dtype)
    if lower is not None:
        return ctx.found("precision_loss",
                         f"small errors spread over {ctx.spread} (worst error/bound {ctx.comparison.worst_ratio:.3g}), "
                         f"all within {LOWER_PRECISION_SLACK:g}x the bound of {dtype_name(lower)} working precision: "
                         f"the implementation computes in {dtype_name(lower)} although it declares {ctx.declared}")
    return None


@_on_mismatch
def imprecise_neighbour(ctx: Context) -> Diagnosis | None:
    """The labels of rules 6-16: a neighbouring configuration that explains the output only in a
    lower working precision than declared (a structural bug *and* imprecise arithmetic: a
    mutant of the float32 path run on fp16/bf16 inputs).

    After the exact neighbouring rules (those explain it to the declared precision) and the
    precision rules (one cause before two); before the gross-error rules, whose subsets a
    structural bug would otherwise masquerade as."""
    for label in NEIGHBOURS:
        for result in ctx.neighbours(label):
            alt = result.alt
            if result.num_unknown or explains(result, ctx.comparison):
                continue
            alt_tensors = [("query", alt.query, result.outputs[0])] + (
                [("key", alt.key, result.outputs[1])] if "key" in result.errors else [])
            lower = fitting_precision(alt.spec, alt.cos, alt.sin, alt_tensors, result.errors, ctx.precision,
                                       ctx.out_dtype)
            if lower is not None:
                return ctx.found(alt.label, f"{alt.sentence}; besides, the arithmetic fits {dtype_name(lower)} "
                                            f"working precision, not the declared {ctx.declared}")
    return None


def _one_tensor_wrong(ctx: Context, name: str, other: str) -> Diagnosis | None:
    """``name`` alone wrong, in every one of its heads (some of its heads right: head_subset's, the
    head loop or the heads past a power of two, whichever tensor it is)."""
    g = ctx.gross
    if g.grossly == [name] and other in g.where and len(g.where[name].heads) == g.where[name].num_heads:
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
    """Only the key has gross errors, in every key head, the query is right: the key path (pointer,
    row stride, head count, the key-present switch) differs from the query's, e.g. the key never
    rotated.  Some key heads right is head_subset's (a head loop bound, whichever tensor).

    First of the gross-error rules: it is the more specific subset (one key token wrong would
    otherwise be token_subset)."""
    return _one_tensor_wrong(ctx, "key", "query")


@_on_mismatch
def query_only(ctx: Context) -> Diagnosis | None:
    """Only the query has gross errors, in every query head, the key is right: the query path
    differs from the key's.

    Beside key_only (they cannot both fire), before token_subset for the same reason."""
    return _one_tensor_wrong(ctx, "query", "key")


@_on_mismatch
def head_subset(ctx: Context) -> Diagnosis | None:
    """Only some heads have gross errors: a head loop bound or per-head offset, e.g. a tile or grid
    sized with prev_power_of_2 that misses the heads beyond the first power of two.

    After key_only / query_only (a whole tensor wrong); before token_subset (a head subset of every
    token is a head bug)."""
    g = ctx.gross
    where, grossly = g.where, g.grossly
    if not grossly or not all(len(where[n].heads) < where[n].num_heads for n in grossly):
        return None
    parts = ", ".join(f"{n} heads {ranges(where[n].heads)} of {where[n].num_heads}" for n in grossly)
    if all(where[n].heads == list(range(prev_power_of_2(where[n].num_heads), where[n].num_heads))
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
    Right tokens whose position rows are all equal are no evidence (no row-map bug shows there):
    where every wrong token has distinct rows, at least one right token must have them too.

    Wrong tokens that are rotated, by positions wrong_positions recovers exactly, are its (a
    positions misread right at some tokens by chance); tokens left unrotated are the token loop's.

    After head_subset; before wrong_positions, which would also recover other positions (0) for
    unrotated tokens but cannot say the bug is in the token loop."""
    g = ctx.gross
    if not g.grossly:
        return None
    tokens = sorted(set().union(*(g.where[n].tokens for n in g.grossly)))
    num_tokens = g.where[g.grossly[0]].num_tokens
    if len(tokens) >= num_tokens:
        return _no_token_rotated(ctx)
    if ctx.spec.num_dims > 1:
        # A token whose position rows are all equal cannot show a bug in which row a frequency
        # reads (axis map, section boundaries, row order): being right there is no evidence that
        # the bug spares some tokens.  When every wrong token has distinct rows, only right tokens
        # with distinct rows count.
        distinct = (ctx.rows != ctx.rows[:1]).any(dim=0).tolist()
        right = set(range(num_tokens)) - set(tokens)
        if all(distinct[t] for t in tokens) and not any(distinct[t] for t in right):
            return None
    if not _unrotated(ctx, tokens) and wrong_positions(ctx) is not None:
        return None          # rotated, by other positions: wrong_positions says which
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


def _unrotated(ctx: Context, tokens) -> bool:
    """Whether q and k come back at ``tokens`` exactly as they went in."""
    for name in ("query", "key"):
        x, out, _ = ctx.inputs[name]
        if x is None:
            continue
        got, given = out.detach().to("cpu")[tokens], x[tokens]
        if not bool(((got == given) | (torch.isnan(got) & torch.isnan(given))).all()):
            return False
    return True


def _no_token_rotated(ctx: Context) -> Diagnosis | None:
    """Every token wrong, and q and k come back exactly as they went in: the token loop never ran
    (a bound one short on a one-token batch, a grid of no programs), the same slip as a token
    subset seen where the subset is every token."""
    if not _unrotated(ctx, list(range(ctx.rows.shape[1]))):
        return None
    num_tokens = ctx.gross.where[ctx.gross.grossly[0]].num_tokens
    return ctx.found_gross("token_subset",
                           f"every token ({num_tokens}) comes back exactly as it went in (never rotated): the token "
                           f"loop bound or the launch grid (one short, or no program ran), or the rotated values "
                           f"never stored")


@_on_mismatch
def wrong_positions(ctx: Context) -> Diagnosis | None:
    """The output is the reference for other positions than given (recovered per token and position
    row from the angles of the output's pairs, matched to cache rows): cos/sin kept on the op from
    an earlier call (docs/spec.md §7.7), positions of another chunk (§7.5), a wrong positions
    pointer.

    Late: the recovery searches the cache and only an exact rotation counts, so it comes after
    every cheaper, more specific explanation."""
    for alt in wrong_positions_alternative(ctx.spec, ctx.rows, ctx.query, ctx.key, ctx.out_q, ctx.out_k, ctx.cache):
        result = alternative_result(alt, ctx.out_q, ctx.out_k, ctx.ref_q, ctx.ref_k, ctx.precision)
        if result is not None and explains(result, ctx.comparison):
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
    writes_outside, wrote_outside_view, wrong_output, nonfinite_output, out_of_bounds_read,
    pairing_swapped, cos_sin_misused, table_misread, axis_map_wrong, section_boundary_shifted, position_rows_swapped,
    position_rows_misread, row_stride_ignored, view_misread, partial_rotary_stride, pair_rows_split,
    pass_through_only, own_angles_off, modest_rounding, lower_working_precision, imprecise_neighbour,
    key_only, query_only, head_subset, token_subset, wrong_positions, pass_through_and_rotary,
)


def unknown(ctx: Context) -> Diagnosis:
    """The fallback when no rule hits: the location is all there is."""
    location = ctx.gross.location
    summary = "; ".join(f"{n}: " + ", ".join(f"{k} {v}" for k, v in location[n].items()) for n in ctx.wrong)
    return ctx.found_gross("unknown", f"no single cause found (not a neighbouring pairing, layout, section split, "
                                      f"row order or stride; not a subset of heads or tokens; errors too large for "
                                      f"lower precision): {summary}")
