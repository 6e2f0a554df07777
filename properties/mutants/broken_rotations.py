"""Broken rotation implementations, each a mistake real kernels have made.

They wrap the native implementation so they run on every device; the kernel-level mutants of
the known-bug catalogue live beside them.

All take the registry signature ``fn(spec, positions, query, key, cos_sin_cache)``.
"""

from __future__ import annotations

import dataclasses

import torch

from properties.mutants.own_angles import fast_math_angles
from rope.native import rotate_native, rotate_native_unchecked
from rope.spec import RopeSpec, check_rotation_inputs


def neox_for_gptj(spec, positions, query, key, cache):
    """Pairs (i, i + rd/2) even when GPT-J pairs are asked (vllm#42016)."""
    return rotate_native(dataclasses.replace(spec, is_neox_style=True), positions, query, key, cache)


def chunked_for_interleaved(spec, positions, query, key, cache):
    """Uses the chunked axis map for Qwen3-VL interleaved sections (vllm-gaudi#1437)."""
    if spec.layout == "interleaved":
        spec = dataclasses.replace(spec, layout="chunked")
    return rotate_native(spec, positions, query, key, cache)


def _with_rows(spec: RopeSpec, rows) -> RopeSpec:
    """``spec`` with the map ``rows`` (the same rows, base, pairing and cache length)."""
    return RopeSpec.from_map(tuple(rows), head_size=spec.head_size, num_dims=spec.num_dims,
                             is_neox_style=spec.is_neox_style, base=spec.base, max_position=spec.max_position,
                             ntk_alpha=spec.ntk_alpha)


def chunked_for_two_row(spec, positions, query, key, cache):
    """Uses the chunked map for HunyuanImage-3.0's two-row interleaved one: the first half of the
    frequencies read y, the second x, so half of them take the wrong row (vllm-omni#1784)."""
    if spec.layout == "two_row_interleaved":
        spec = dataclasses.replace(spec, layout="chunked")
    return rotate_native(spec, positions, query, key, cache)


def glm_round_robin_without_skip(spec, positions, query, key, cache):
    """Cycles T H W over every frequency without skipping a row that has its section's count, so
    past 3 x the smallest section the rows' counts differ from the sections (SGLang's
    mrope_interleaved_glm map skips full rows)."""
    if spec.layout == "glm_round_robin":
        spec = _with_rows(spec, [i % 3 for i in range(spec.num_freqs)])
    return rotate_native(spec, positions, query, key, cache)


def ernie45_h_w_swapped(spec, positions, query, key, cache):
    """Ernie-4.5-VL's map with H and W swapped: even frequencies below s_h + s_w read W, odd ones
    H (sections read as (t, h, w) where Ernie's config writes (h, w, t))."""
    if spec.layout == "ernie45":
        spec = _with_rows(spec, [{1: 2, 2: 1}.get(r, r) for r in spec.axis_map()])
    return rotate_native(spec, positions, query, key, cache)


def row_map_shifted_by_one(spec, positions, query, key, cache):
    """Every map but chunked and interleaved read one frequency off: frequency i takes the row of
    i + 1 (the last that of 0), e.g. a table indexed from 1 or a lane offset by one."""
    if spec.num_dims > 1 and spec.layout not in ("chunked", "interleaved"):
        rows = spec.axis_map()
        spec = _with_rows(spec, rows[1:] + rows[:1])
    return rotate_native(spec, positions, query, key, cache)


def key_unrotated(spec, positions, query, key, cache):
    """Rotates the query only; the key comes back as it went in."""
    q, _ = rotate_native(spec, positions, query, None, cache)
    return q, key


def touches_pass_through(spec, positions, query, key, cache):
    """Rotates correctly but rounds the pass-through channels through bf16 (a copy-back bug)."""
    q, k = rotate_native(spec, positions, query, key, cache)

    def squash(x):
        if x is None:
            return None
        heads = x.reshape(x.shape[0], x.shape[1] // spec.head_size, spec.head_size).clone()
        heads[..., spec.rotary_dim:] = heads[..., spec.rotary_dim:].to(torch.bfloat16).to(x.dtype) * 1.0001
        return heads.reshape(x.shape)
    return squash(q), squash(k)


def first_pow2_heads(spec, positions, query, key, cache):
    """Rotates only the first power-of-two heads (a tile sized with prev_power_of_2)."""
    def cut(x):
        if x is None:
            return None, None
        heads = x.shape[1] // spec.head_size
        keep = 1 << (heads.bit_length() - 1)
        return x[:, : keep * spec.head_size], x
    q_part, q_full = cut(query)
    k_part, k_full = cut(key)
    q_rot, k_rot = rotate_native(spec, positions, q_part, k_part, cache)
    q_out = q_full.clone()
    q_out[:, : q_rot.shape[1]] = q_rot
    k_out = None
    if k_full is not None:
        k_out = k_full.clone()
        k_out[:, : k_rot.shape[1]] = k_rot
    return q_out, k_out


def assumes_contiguous(spec, positions, query, key, cache):
    """Reads q/k as if their rows were packed back to back (ignores the row stride)."""
    def as_packed(x):
        if x is None or x.is_contiguous():
            return x
        flat = x.as_strided((x.numel(),), (1,), x.storage_offset())
        return flat.view(x.shape)
    # Unchecked: the packed misreads of q and k overlap each other, which rotate_native refuses.
    return rotate_native_unchecked(spec, positions, as_packed(query), as_packed(key), cache)


def heads_at_contiguous_stride(spec, positions, query, key, cache):
    """Reads head h at the contiguous head stride, h * head_size elements from its token's start,
    with channels at the column stride: right on every row-major view, wrong for the heads after the
    first of a heads-major view (column stride T), which it reads elsewhere in the buffer
    (aiter#3841: a non-contiguous q's heads after the first read outside the view)."""
    def misread(x):
        if x is None or x.stride(1) == 1 or not x.numel():
            return x
        tokens, width = x.shape
        heads = width // spec.head_size
        # The last element read, offset + (T-1) + (H-1) D + (D-1) T, stays below offset + H D T: in the view's range.
        return x.as_strided((tokens, heads, spec.head_size), (x.stride(0), spec.head_size, x.stride(1)),
                            x.storage_offset()).reshape(tokens, width)
    return rotate_native_unchecked(spec, positions, misread(query), misread(key), cache)


def rows_as_wide_as_stride(spec, positions, query, key, cache):
    """Rotates in place every head that fits in a row's stride, not only the row's width: the head
    count taken from the row stride (stride(0) // head_size) writes past the width, into the gap
    between strided rows, or a packed tensor's k and V heads; right on rows back to back."""
    check_rotation_inputs(spec, positions, query, key, cache)

    def as_wide_as_stride(x):
        if x is None or x.stride(1) != 1 or x.stride(0) <= x.shape[1] or not x.numel():
            return x
        tokens = x.shape[0]
        room = x.untyped_storage().nbytes() // x.element_size() - x.storage_offset() - (tokens - 1) * x.stride(0)
        heads = min(x.stride(0), room) // spec.head_size       # what fits in the stride and the allocation
        return x.as_strided((tokens, heads * spec.head_size), (x.stride(0), 1), x.storage_offset())
    for x in (query, key):
        if x is not None:
            wide = as_wide_as_stride(x)
            wide.copy_(rotate_native_unchecked(spec, positions, wide, None, cache)[0])
    return query, key


def bf16_claiming_fp32(spec, positions, query, key, cache):
    """Computes in bf16 whatever the input dtype, while declaring float32 working precision."""
    bf = torch.bfloat16
    q, k = rotate_native(spec, positions, query.to(bf), None if key is None else key.to(bf), cache.to(bf))
    return q.to(query.dtype), None if k is None else k.to(query.dtype)


def hides_nonfinite(spec, positions, query, key, cache):
    """Turns NaN and infinities into finite numbers (nan_to_num, a clamp or a max in the epilogue):
    an overflow upstream no longer shows, which a comparison blind to non-finite values passes."""
    q, k = rotate_native(spec, positions, query, key, cache)
    return q.nan_to_num(0.0), None if k is None else k.nan_to_num(0.0)


def fp32_table_rounded_to_activations(spec, positions, query, key, cache):
    """Rounds the cos/sin table to the activations' dtype, then works in float32 as it declares: right
    where the table comes in q's dtype, wrong beside an fp32 table (FlashInfer's and SGLang's
    convention) with bf16 or fp16 q and k, where every cos and sin loses its low bits."""
    f32 = torch.float32
    q, k = rotate_native(spec, positions, query.to(f32), None if key is None else key.to(f32),
                         cache.to(query.dtype).to(f32))
    return q.to(query.dtype), None if k is None else k.to(query.dtype)


def table_clamped_to_unit(spec, positions, query, key, cache):
    """Saturates cos and sin to [-1, 1] (a kernel that derives sin from cos, or stores the table in a
    unit-range format): right for a plain table, wrong where YaRN's or LongRoPE's attention factor,
    folded into the table, scales them past 1."""
    return rotate_native(spec, positions, query, key, cache.clamp(-1.0, 1.0))


def skipped_under_compile(spec, positions, query, key, cache):
    """Returns q and k unrotated when torch.compile traces it: RoPE silently skipped only in the
    compiled model (olmoearth_pretrain#600); every eager call is right."""
    if torch.compiler.is_compiling():
        return query, key
    return rotate_native(spec, positions, query, key, cache)


_LARGE_CALLS = [0]


def wrong_in_half_of_large_calls(spec, positions, query, key, cache):
    """Every other call of 4 tokens or more returns one element wrong, a different one each time: a
    kernel reading positions from a tile still being filled answers differently on each call above
    a size (vllm-ascend#16674: 6 of 6 calls wrong, each differently)."""
    q, k = rotate_native(spec, positions, query, key, cache)
    if query.shape[0] < 4:
        return q, k
    _LARGE_CALLS[0] += 1
    if _LARGE_CALLS[0] % 2 == 0 and q.numel():
        q = q.clone()
        flat = q.view(-1)
        index = (_LARGE_CALLS[0] * 7919) % flat.numel()
        flat[index] = -flat[index] - 1.0
    return q, k


def positions_baked_into_graph(spec, positions, query, key, cache):
    """Inside a CUDA-graph capture, reads the positions the warm-up call saw (a copy taken on the
    host's side before capture) instead of the captured input: every replay rotates with the
    capture's positions (candle#3728; vllm#33800's buffer left behind by a warm-up).  The Triton
    entry underneath: a capturable kernel."""
    from rope.triton.rotary import rotate_triton
    if query.is_cuda and torch.cuda.is_current_stream_capturing():
        positions = _WARMUP_POSITIONS.get(positions.shape, positions)
    else:
        _WARMUP_POSITIONS[positions.shape] = positions.clone()
    return rotate_triton(spec, positions, query, key, cache)


_WARMUP_POSITIONS: dict = {}


# Wrappers of the native path compute in the activation dtype and say so, so the suite rejects
# them for their structural bug, not for precision (bf16_claiming_fp32's bug is the claim).
for _fn in (neox_for_gptj, chunked_for_interleaved, chunked_for_two_row, glm_round_robin_without_skip,
            ernie45_h_w_swapped, row_map_shifted_by_one, key_unrotated, touches_pass_through, first_pow2_heads,
            assumes_contiguous, hides_nonfinite, table_clamped_to_unit, skipped_under_compile,
            wrong_in_half_of_large_calls, heads_at_contiguous_stride, rows_as_wide_as_stride):
    _fn.working_precision = "activation"
# Like the native path they wrap, they are not captured in a CUDA graph (its checks read values).
for _fn in (neox_for_gptj, chunked_for_interleaved, chunked_for_two_row, glm_round_robin_without_skip,
            ernie45_h_w_swapped, row_map_shifted_by_one, key_unrotated, touches_pass_through, first_pow2_heads,
            assumes_contiguous, bf16_claiming_fp32, hides_nonfinite, fp32_table_rounded_to_activations,
            table_clamped_to_unit, skipped_under_compile, wrong_in_half_of_large_calls, heads_at_contiguous_stride,
            rows_as_wide_as_stride):
    _fn.modes = rotate_native.modes

BROKEN_ROTATIONS = {
    "neox_for_gptj": neox_for_gptj,
    "chunked_for_interleaved": chunked_for_interleaved,
    "chunked_for_two_row": chunked_for_two_row,
    "glm_round_robin_without_skip": glm_round_robin_without_skip,
    "ernie45_h_w_swapped": ernie45_h_w_swapped,
    "row_map_shifted_by_one": row_map_shifted_by_one,
    "key_unrotated": key_unrotated,
    "touches_pass_through": touches_pass_through,
    "first_pow2_heads": first_pow2_heads,
    "assumes_contiguous": assumes_contiguous,
    "bf16_claiming_fp32": bf16_claiming_fp32,
    "hides_nonfinite": hides_nonfinite,
    "fp32_table_rounded_to_activations": fp32_table_rounded_to_activations,
    "table_clamped_to_unit": table_clamped_to_unit,
    "fast_math_angles": fast_math_angles,
    "skipped_under_compile": skipped_under_compile,
    "wrong_in_half_of_large_calls": wrong_in_half_of_large_calls,
    "heads_at_contiguous_stride": heads_at_contiguous_stride,
    "rows_as_wide_as_stride": rows_as_wide_as_stride,
}
# Mutants whose bug a single eager call does not show (or shows only at random), and the property of
# properties/rotation/test_modes.py that catches each: its diagnosis is the mode's cause label.
MODE_ONLY = {"skipped_under_compile": "test_rotation_matches_reference_under_compile",
             "wrong_in_half_of_large_calls": "test_the_same_inputs_give_the_same_bits",
             "positions_baked_into_graph": "test_graph_replays_match_reference_of_their_own_inputs"}
# Mutants of how a view is read or written, and the property of properties/rotation/test_views.py that
# catches each: heads_at_contiguous_stride only there (the layouts every other property draws have unit
# column stride), rows_as_wide_as_stride there and on packed qkv.
# Mutants of how the table is read, and the property that catches each: an fp32 table beside bf16
# activations, a table scaled past 1, angles computed at long positions (properties/rotation/test_scaled_tables.py).
SCALED_TABLE_MUTANTS = {name: "test_scaled_tables_match_reference"
                        for name in ("fp32_table_rounded_to_activations", "table_clamped_to_unit", "fast_math_angles")}
VIEW_MUTANTS = {"heads_at_contiguous_stride": "test_views_match_reference",
                "rows_as_wide_as_stride": "test_views_match_reference"}
# Rotations wrong only where a GPU runs them (a CUDA graph): the catalogue says what they need.
GPU_ROTATION_MUTANTS = {"positions_baked_into_graph": positions_baked_into_graph}


# vllm#51049 (fixed by vllm#57681): vLLM's fused QK-norm + RoPE kernel takes several token-heads per
# warp on SM90 from num_tokens * (num_heads + num_kv_heads) >= 10,240, and there partial-rotary
# NeoX exchanges pair members from a divergent branch.  Caught only by a batch past that product:
# the rotation properties' small cases stay below it.
FUSED_TOKEN_HEADS = 10240


def partial_neox_partner_lost_past_token_heads(spec, positions, query, key, cache):
    """From tokens x (query + key heads) >= 10,240, partial-rotary NeoX reads each pair's second
    member from a lane that never arrived: it gets the first member's value (vllm#51049)."""
    heads = query.shape[1] // spec.head_size + (key.shape[1] // spec.head_size if key is not None else 0)
    if not (spec.is_neox_style and spec.rotary_dim < spec.head_size
            and query.shape[0] * heads >= FUSED_TOKEN_HEADS):
        return rotate_native(spec, positions, query, key, cache)

    def partner_lost(x):
        if x is None:
            return None
        half = spec.rotary_dim // 2
        lanes = x.reshape(x.shape[0], -1, spec.head_size).clone()
        lanes[..., half:spec.rotary_dim] = lanes[..., :half]
        return lanes.reshape(x.shape)
    return rotate_native(spec, positions, partner_lost(query), partner_lost(key), cache)


partial_neox_partner_lost_past_token_heads.working_precision = "activation"


# Bugs on a path chosen by the token x head product: (mutant, the product its wrong path starts at).
# tests/suite/test_kernel_mutants.py holds the product cases of test_prefill.py to catching them;
# `rope-harness mutants` does not list them yet.
TOKEN_HEAD_SWITCHES = {"partial_neox_partner_lost_past_token_heads": (partial_neox_partner_lost_past_token_heads,
                                                                      FUSED_TOKEN_HEADS)}
