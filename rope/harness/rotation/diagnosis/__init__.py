"""Where a rotation mismatch lies, and what most likely caused it.

A package of single-job modules: verdict (the labels and :class:`Diagnosis`), locations (where
mismatched elements lie), alternatives (the neighbouring configurations and the recovered
positions), precision (errors against a lower working precision), context (what the rules share),
rules (the rules in order); :func:`diagnose` here walks them.

:func:`diagnose` takes what the comparison saw (the spec, the untouched inputs, the
implementation's outputs, the float64 reference and the :class:`~rope.harness.rotation.bound.Comparison`)
and returns a :class:`Diagnosis`: a label, one sentence, and the location of the mismatched
elements per tensor over tokens, heads, frequencies, position rows, pair members and
pass-through channels.

It builds a :class:`Context` once (inputs, outputs, reference, comparison, and what several rules
share, each computed on first use) and walks :data:`RULES`: named functions
``rule(ctx) -> Diagnosis | None``, the first hit wins, :func:`unknown` when none hits.  Outputs
that match the reference are ``match`` before any rule runs (and every rule returns None on them).
The order is elimination, most specific first (each rule's docstring says why it sits where it
does; the label it gives follows the rule's name where the two differ):
 1. ``writes_outside``: positions, the cache or a guard were written.
 2. ``wrote_outside_view``: q's and k's own buffer written outside their views (V's heads, the
    gaps between strided rows), or a same-buffer view holding neither its input nor the output.
 3. ``wrong_output``: a tensor came back with the wrong shape, dtype or device (or None).
 4. ``nonfinite_output`` (label ``nan``): NaN/inf where the reference is finite (an out-of-bounds
    read from a guard region), or finite where it is NaN/inf (non-finite inputs swallowed).
 5. ``out_of_bounds_read``: the values are right but the guards' tracer saw reads outside the
    inputs (rope/harness/guards.py reports them as problems).
 6. ``pairing_swapped``: the output is the reference with the other of NeoX / GPT-J pairs.
 7. ``cos_sin_misused``: ... with sin's sign flipped (a rotation by -theta), or cos and sin swapped.
 8. ``table_misread``: ... from the table rounded to the activations' dtype (an fp32 table beside
    bf16/fp16 q and k), or with cos and sin clamped to [-1, 1] (a scaled table's attention factor
    takes them past 1).
 9. ``axis_map_wrong``: ... with another layout's axis map, or the map one frequency off.
10. ``section_boundary_shifted``: ... with every section boundary moved by the same offset (+1 or
    -1: the ``<`` / ``<=`` slip of torch.bucketize's default right=False), or one section boundary,
    or one interleaved bound 3*s, moved by one.
11. ``position_rows_swapped``: ... with the position rows permuted.
12. ``position_rows_misread``: ... with row d read at a wrong row stride (positions[0, t + d], or
    row 0 for every frequency).
13. ``row_stride_ignored``: ... of q/k rows read as if packed back to back.
14. ``view_misread``: ... of q/k read through another layout than their view (a heads-major
    view's heads at the contiguous head stride, or its channels as unit-stride).
15. ``partial_rotary_stride``: ... with head_size/2 where rotary_dim/2 belongs (sin read past its
    row, or the NeoX partner at i + head_size/2).
16. ``pair_rows_split``: ... with the sections laid over the whole rotary head in blocks of 2*s_i,
    so the two members of a NeoX pair take different position rows (transformers' HunYuanVL,
    docs/spec.md §2).
    (6-16 are the neighbouring configurations, NEIGHBOURS: each candidate rotates the inputs by
    its own cos/sin and pairs and is held to the same per-element bound, to the declared precision.)
17. ``pass_through_only`` (label ``pass_through_touched``): channels >= rotary_dim differ from the
    input, the rotary ones do not.
18. ``own_angles_off`` (label ``angle_error``): an implementation computing its own angles is off
    by small angles beyond their float32 error (at frequency-1 pairs: its sine and cosine do not
    reduce the argument exactly, fast-math __sinf).
19. ``modest_rounding`` (label ``precision_loss``): the worst error/bound ratio is modest
    (<= MODEST_RATIO: truncating stores, an extra rounding).
20. ``lower_working_precision`` (label ``precision_loss``): every error fits the bound of a lower
    working precision than declared (LOWER_PRECISION_SLACK x).
21. ``imprecise_neighbour`` (labels of 6-16): a neighbouring configuration again, allowing the
    lower precision (a kernel with a structural bug *and* imprecise arithmetic).
    From here only gross errors count (beyond bfloat16 rounding: Context.gross):
22. ``key_only``: the query is right, the key is not.
23. ``query_only``: the key is right, the query is not.
24. ``head_subset``: only some heads are wrong (e.g. only the first power-of-two heads are right).
25. ``token_subset``: only some tokens are wrong (e.g. only tokens at the last cache row).
26. ``wrong_positions``: the output is an exact rotation by other positions than given (recovered
    per token and position row from the angles of the output's pairs, matched to cache rows):
    stale cos/sin, another chunk's positions, a wrong positions pointer.
27. ``pass_through_and_rotary`` (label ``pass_through_touched``): pass-through channels touched and
    the rotary channels wrong too.
Else ``unknown``: the location is all there is.
"""

from __future__ import annotations

from rope.spec import RopeSpec
from rope.harness.rotation.bound import Comparison
from rope.harness.rotation.diagnosis.alternatives import recover_positions
from rope.harness.rotation.diagnosis.context import NEIGHBOURS, Context
from rope.harness.rotation.diagnosis.locations import channel_location, ranges
from rope.harness.rotation.diagnosis.precision import loose_bound
from rope.harness.rotation.diagnosis.rules import RULES, unknown
from rope.harness.rotation.diagnosis.verdict import (ALTERNATIVE_RESIDUE, LABELS, LOWER_PRECISION_SLACK,
                                                     LOWER_PRECISIONS, MODEST_RATIO, Diagnosis)

__all__ = ["ALTERNATIVE_RESIDUE", "LABELS", "LOWER_PRECISIONS", "LOWER_PRECISION_SLACK", "MODEST_RATIO", "NEIGHBOURS",
           "RULES", "Context", "Diagnosis", "channel_location", "diagnose", "loose_bound", "ranges",
           "recover_positions", "unknown"]


def diagnose(spec: RopeSpec, positions, query, key, cos_sin_cache, out_q, out_k, *,
             precision: str = "float32", ref=None, comparison: Comparison | None = None,
             angles: str = "cache") -> Diagnosis:
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
                        precision=precision, ref=ref, comparison=comparison, angles=angles)
    if ctx.comparison.ok:
        return Diagnosis("match", "the outputs match the reference")
    for rule in RULES:
        found = rule(ctx)
        if found is not None:
            return found
    return unknown(ctx)
