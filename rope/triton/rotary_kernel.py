"""The rotation kernel: one Triton kernel for every rotary variant: 1-D RoPE, M-RoPE (chunked or
interleaved sections, or any other map from frequencies to position rows), XD-RoPE (3 or 4 rows),
NeoX or GPT-J pairing, partial rotary, key present or absent; and, with INVERSE, the rotation by
-θ (the sine negated): the backward of the rotation, whose gradient with respect to q and k is the
upstream gradient rotated back (reference/rotation_grad.py).  Its launch plan (grid, tiles,
constexprs) is rope/triton/rotary_plan.py; the entry points that launch it, rope/triton/rotary.py.

Precision contract (docs/spec.md §3): load in the storage dtype, convert to fp32, compute in fp32 with
no FMA contraction, and round to the output dtype at the store (round to nearest even).  Under
TRITON_INTERPRET=1, bf16 arithmetic is wrong and fp32->bf16 casts truncate, so there the bf16
store rounds by bit arithmetic; compiled, the store's own convert rounds to nearest even (the same
bits, fewer instructions).  With this contract the interpreter and a GPU produce the same bits.

The kernel works in place on q and k (row strides allow views into a packed qkv tensor) and
never touches channels >= rotary_dim, heads >= num_heads or frequencies >= rotary_dim/2.

The jit functions keep their ``_name``s (the kernel's source text, and the name of the compiled
kernel); the two that other modules use are public under the names at the end of this module.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rope.triton.pdl import HAS_PDL

if HAS_PDL:     # programmatic dependent launch: rope/triton/pdl.py
    from rope.triton.pdl import gdc_launch_dependents, gdc_wait

__all__ = ["gather_cos_sin", "lane_axes", "load_positions", "load_tile", "rotary_kernel", "round_for_store"]


@triton.jit
def _round_for_store(x, ROUND_BF16: tl.constexpr):
    """fp32 -> storage value.  ROUND_BF16: round-to-nearest-even to bf16 on the bits, by hand
    (the interpreter's fp32 -> bf16 convert truncates): (1) take the fp32 bits, (2) add 0x7FFF
    plus the lowest kept bit (ties to even), (3) keep the high 16 bits; NaNs keep their sign and
    become quiet NaNs.  Else the store's convert rounds (compiled: round-to-nearest-even, the same
    bits for every non-NaN value; a NaN stays a NaN)."""
    if ROUND_BF16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(x != x, (bits >> 16) | 0x40, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x


@triton.jit
def _load_tile(row_ptrs, token_ok, heads, num_heads, head_size, freq, half,
               IS_NEOX: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr,
               EVICT: tl.constexpr):
    """Load the pairs (x1, x2) of the given heads of BLOCK_T token rows: [BLOCK_T, BLOCK_H, BLOCK_F]
    each, in the storage dtype.  ``row_ptrs`` [BLOCK_T] point at each token's row.

    NeoX pairs (i, i + half): two contiguous half-rows per head.  GPT-J pairs (2i, 2i + 1): one
    contiguous run of 2 * BLOCK_F channels per head, split into even/odd lanes in registers
    (strided 2-byte loads and stores would not coalesce)."""
    head_base = row_ptrs[:, None, None] + heads[None, :, None] * head_size          # [T, H, 1]
    row_ok = token_ok[:, None, None] & (heads[None, :, None] < num_heads)
    if IS_NEOX:
        mask = row_ok & (freq < half)[None, None, :]
        a_ptr = head_base + freq[None, None, :]
        x1 = tl.load(a_ptr, mask=mask, other=0.0, eviction_policy=EVICT)
        x2 = tl.load(a_ptr + half, mask=mask, other=0.0, eviction_policy=EVICT)
    else:
        chan = tl.arange(0, 2 * BLOCK_F)
        mask = row_ok & (chan < 2 * half)[None, None, :]
        x = tl.load(head_base + chan[None, None, :], mask=mask, other=0.0, eviction_policy=EVICT)
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, BLOCK_F, 2)))
    return x1, x2


@triton.jit
def _rotate_store_tile(row_ptrs, token_ok, heads, num_heads, head_size, freq, half, x1, x2, cos, sin,
                       IS_NEOX: tl.constexpr, ROUND_BF16: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr, EVICT: tl.constexpr,
                       INVERSE: tl.constexpr, STREAM: tl.constexpr):
    """Rotate the loaded pairs in fp32 (cos/sin: [BLOCK_T, 1 or BLOCK_H, BLOCK_F]) and store them in place,
    under the same masks as :func:`_load_tile`.  INVERSE: by -θ (the sine negated).  STREAM: no
    rotation: x1 scaled by cos and x2 by sin (one multiply an element; the benchmark's floor)."""
    c = cos     # [BLOCK_T, 1 or BLOCK_H, BLOCK_F]
    s = sin
    if INVERSE:
        s = -sin
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if STREAM:
        o1 = x1 * c
        o2 = x2 * s
    else:
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
    out_ty = row_ptrs.dtype.element_ty
    head_base = row_ptrs[:, None, None] + heads[None, :, None] * head_size
    row_ok = token_ok[:, None, None] & (heads[None, :, None] < num_heads)
    if IS_NEOX:
        mask = row_ok & (freq < half)[None, None, :]
        a_ptr = head_base + freq[None, None, :]
        tl.store(a_ptr, _round_for_store(o1, ROUND_BF16).to(out_ty), mask=mask, eviction_policy=EVICT)
        tl.store(a_ptr + half, _round_for_store(o2, ROUND_BF16).to(out_ty), mask=mask, eviction_policy=EVICT)
    else:
        chan = tl.arange(0, 2 * BLOCK_F)
        mask = row_ok & (chan < 2 * half)[None, None, :]
        o = tl.reshape(tl.join(o1, o2), (BLOCK_T, BLOCK_H, 2 * BLOCK_F))
        tl.store(head_base + chan[None, None, :], _round_for_store(o, ROUND_BF16).to(out_ty), mask=mask,
                 eviction_policy=EVICT)


@triton.jit
def _lane_axes(freq, half, map_ptr, sec0, sec1, sec2, NUM_DIMS: tl.constexpr, INTERLEAVED: tl.constexpr,
               MAP_TABLE: tl.constexpr):
    """The position row that drives each frequency lane (docs/spec.md §2): computed from the
    sections for the chunked and Qwen3-VL interleaved maps, read from the map's table (one row per
    frequency: rope.cache.axis_table) for every other map."""
    axis = tl.zeros(freq.shape, dtype=tl.int32)
    if MAP_TABLE:
        # Padding lanes (>= half) read nothing and take row 0; their loads stay masked.
        axis = tl.load(map_ptr + freq, mask=freq < half, other=0).to(tl.int32)
    elif INTERLEAVED:
        # Qwen3-VL: H at i%3==1 below 3*s_h, W at i%3==2 below 3*s_w, T elsewhere.
        axis = tl.where((freq % 3 == 1) & (freq < 3 * sec1), 1, axis)
        axis = tl.where((freq % 3 == 2) & (freq < 3 * sec2), 2, axis)
    else:
        # Chunked: row d owns [sec0+..+sec(d-1), sec0+..+sec(d)).
        if NUM_DIMS >= 2:
            axis += (freq >= sec0).to(tl.int32)
        if NUM_DIMS >= 3:
            axis += (freq >= sec0 + sec1).to(tl.int32)
        if NUM_DIMS >= 4:
            axis += (freq >= sec0 + sec1 + sec2).to(tl.int32)
    return axis


@triton.jit
def _load_positions(pos_ptr, pos_row_stride, token, num_tokens, NUM_DIMS: tl.constexpr):
    """The tile's tokens' positions, rows 0..NUM_DIMS-1 as loaded ([BLOCK_T] each; rows past NUM_DIMS
    repeat row 0 and load nothing).  Tokens past num_tokens read position 0 and store nothing."""
    token_ok = token < num_tokens
    pos_0 = tl.load(pos_ptr + token, mask=token_ok, other=0)
    pos_1 = pos_0
    pos_2 = pos_0
    pos_3 = pos_0
    for d in tl.static_range(1, NUM_DIMS):
        pos_d = tl.load(pos_ptr + d * pos_row_stride + token, mask=token_ok, other=0)
        if d == 1:
            pos_1 = pos_d
        elif d == 2:
            pos_2 = pos_d
        else:
            pos_3 = pos_d
    return pos_0, pos_1, pos_2, pos_3


@triton.jit
def _load_tile_and_positions(x_rows, token_ok, heads, x_heads, head_size, freq, half, pos_ptr, guess_ptr,
                             pos_row_stride, token, num_tokens, NUM_DIMS: tl.constexpr, IS_NEOX: tl.constexpr,
                             BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr,
                             QK_EVICT: tl.constexpr, PDL: tl.constexpr, EARLY_POSITIONS: tl.constexpr,
                             SPECULATE: tl.constexpr):
    """The q (or k) pairs of the tile (:func:`_load_tile`), its positions (:func:`_load_positions`)
    and the guesses of them the cos/sin rows are first read at: x1, x2, pos_0..pos_3, guess_0..guess_3.

    By default the q/k loads, which depend on nothing, are written first, and the guesses are the
    positions; ptxas still issues the q/k loads after the position loads (pinning them first with a
    barrier measured slower: docs/launch-defaults.md, "Measurements behind the code's comments").
    EARLY_POSITIONS: the positions first, then the PDL wait (and the next kernel's launch), then
    q/k.  SPECULATE: the guesses are read from guess_ptr (the positions themselves, or a test's
    stand-in) before the wait, the positions again after it, beside q/k (see _rotary_kernel)."""
    if EARLY_POSITIONS or SPECULATE:
        guess_0, guess_1, guess_2, guess_3 = _load_positions(guess_ptr, pos_row_stride, token, num_tokens, NUM_DIMS)
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        x1, x2 = _load_tile(x_rows, token_ok, heads, x_heads, head_size, freq, half,
                            IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT)
        if SPECULATE:
            pos_0, pos_1, pos_2, pos_3 = _load_positions(pos_ptr, pos_row_stride, token, num_tokens, NUM_DIMS)
        else:
            pos_0, pos_1, pos_2, pos_3 = guess_0, guess_1, guess_2, guess_3
    else:
        x1, x2 = _load_tile(x_rows, token_ok, heads, x_heads, head_size, freq, half,
                            IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT)
        pos_0, pos_1, pos_2, pos_3 = _load_positions(pos_ptr, pos_row_stride, token, num_tokens, NUM_DIMS)
        guess_0, guess_1, guess_2, guess_3 = pos_0, pos_1, pos_2, pos_3
    return x1, x2, pos_0, pos_1, pos_2, pos_3, guess_0, guess_1, guess_2, guess_3


@triton.jit
def _cos_sin_offsets(pos_0, pos_1, pos_2, pos_3, cache_row_stride, cache_rows, freq, half, map_ptr, sec0, sec1, sec2,
                     NUM_DIMS: tl.constexpr, INTERLEAVED: tl.constexpr, MAP_TABLE: tl.constexpr, BLOCK_T: tl.constexpr,
                     BLOCK_H: tl.constexpr,
                     BLOCK_F: tl.constexpr, POS_RUN: tl.constexpr, GATHER_3D: tl.constexpr, CACHE_I64: tl.constexpr):
    """The cache offsets of cos = cache[positions[axis(i), t], i] (sin: + half) for the positions of
    :func:`_load_positions`, and their lane mask, for :func:`_load_cos_sin` (three steps, so that the
    positions can be read before a PDL wait and the arithmetic and the cache after it).

    GATHER_3D: gathered straight into the tile's 3-D layout (each head lane loads its copy; the
    copies hit L1).  Runs of POS_RUN lanes share one position row and start aligned (see
    rotary_plan.position_run), so the offsets are declared contiguous in runs of POS_RUN and the loads
    vectorize.  Else one gather per (token, lane) into [BLOCK_T, BLOCK_F], broadcast over heads
    (Triton converts that layout through shared memory), which issues one load per lane where the
    3-D gather issues one per lane and head lane (interleaved sections: POS_RUN 1).
    Lanes >= half are padding and masked."""
    freq_ok = freq < half
    axis = _lane_axes(freq, half, map_ptr, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE)
    # Positions are not range-checked on a GPU (a host sync; rope.spec.checks_values): each loaded
    # row is clamped to the cache's rows, so a bad position reads a wrong row of the cache, never
    # past it.  Per token, before the broadcast over lanes: a tile-wide clamp measured about 1%
    # slower on an H200 (Qwen2.5-VL-72B, 4096 and 16384 tokens).  Rows and cache offsets are 32-bit
    # unless CACHE_I64 (set by the launcher when an offset could pass 2^31 - 1): a position's low 32
    # bits, then one max and one min, where 64 bits took two compare-and-select pairs and a wide
    # multiply on the decode step's dependent chain, position -> cos/sin (docs/launch-defaults.md, cache_offsets_64).
    # A position outside the int32 range wraps before the clamp: still a row of the cache.
    ROW: tl.constexpr = tl.int64 if CACHE_I64 else tl.int32
    row_0 = tl.minimum(tl.maximum(pos_0.to(ROW), 0), cache_rows - 1)
    pos = row_0[:, None] + tl.zeros([BLOCK_T, BLOCK_F], dtype=ROW)
    for d in tl.static_range(1, NUM_DIMS):
        pos_d = pos_1 if d == 1 else (pos_2 if d == 2 else pos_3)
        pos_d = tl.minimum(tl.maximum(pos_d.to(ROW), 0), cache_rows - 1)
        pos = tl.where(axis[None, :] == d, pos_d[:, None], pos)
    offs = pos * cache_row_stride + freq[None, :]
    lane_ok = freq_ok[None, :]
    if GATHER_3D:
        if POS_RUN > 1:
            offs = tl.max_contiguous(tl.multiple_of(offs, [1, POS_RUN]), [1, POS_RUN])
        offs = tl.broadcast_to(offs[:, None, :], [BLOCK_T, BLOCK_H, BLOCK_F])
        lane_ok = tl.broadcast_to(freq_ok[None, None, :], [BLOCK_T, BLOCK_H, BLOCK_F])
    return offs, lane_ok


@triton.jit
def _load_cos_sin(cache_ptr, offs, lane_ok, half):
    """cos and sin at :func:`_cos_sin_offsets`' offsets, in the storage dtype and the offsets' layout."""
    cos = tl.load(cache_ptr + offs, mask=lane_ok, other=0.0)
    sin = tl.load(cache_ptr + half + offs, mask=lane_ok, other=0.0)
    return cos, sin


@triton.jit
def _gather_cos_sin(cache_ptr, cache_row_stride, cache_rows, pos_0, pos_1, pos_2, pos_3, guess_0, guess_1, guess_2,
                    guess_3, freq, half, map_ptr, sec0, sec1, sec2, NUM_DIMS: tl.constexpr, INTERLEAVED: tl.constexpr,
                    MAP_TABLE: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr, POS_RUN: tl.constexpr,
                    GATHER_3D: tl.constexpr, CACHE_I64: tl.constexpr, SPECULATE: tl.constexpr):
    """cos and sin of the tile's positions, as [BLOCK_T, BLOCK_H, BLOCK_F] fp32 in the q/k tile's layout.

    Read at the guesses' rows (the positions themselves unless SPECULATE).  SPECULATE: if any
    position read after the wait differs from its guess, the whole tile reads cos/sin again at the
    positions.  A branch, not a masked second load: ptxas counts a load on the critical path even when
    its predicate is off, and issued the first cos/sin loads only after the positions had arrived (two
    round trips again); the branch's condition is the only use of the positions on the common path."""
    offs, lane_ok = _cos_sin_offsets(guess_0, guess_1, guess_2, guess_3, cache_row_stride, cache_rows, freq, half,
                                     map_ptr, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE, BLOCK_T, BLOCK_H,
                                     BLOCK_F, POS_RUN, GATHER_3D, CACHE_I64)
    cos, sin = _load_cos_sin(cache_ptr, offs, lane_ok, half)
    if SPECULATE:
        # Compared as the rows are computed: only the low 32 bits, unless CACHE_I64 (the loads then
        # fetch 4 bytes of each position, as the default path's do).
        ROW: tl.constexpr = tl.int64 if CACHE_I64 else tl.int32
        wrong = ((pos_0.to(ROW) != guess_0.to(ROW)) | (pos_1.to(ROW) != guess_1.to(ROW))
                 | (pos_2.to(ROW) != guess_2.to(ROW)) | (pos_3.to(ROW) != guess_3.to(ROW)))
        if tl.max(wrong.to(tl.int32), axis=0) != 0:
            offs, lane_ok = _cos_sin_offsets(pos_0, pos_1, pos_2, pos_3, cache_row_stride, cache_rows, freq, half,
                                             map_ptr, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE, BLOCK_T,
                                             BLOCK_H, BLOCK_F, POS_RUN, GATHER_3D, CACHE_I64)
            cos, sin = _load_cos_sin(cache_ptr, offs, lane_ok, half)
    return _cos_sin_to_tile(cos, sin, GATHER_3D)


@triton.jit
def _cos_sin_to_tile(cos, sin, GATHER_3D: tl.constexpr):
    """cos and sin as [BLOCK_T, BLOCK_H, BLOCK_F] fp32 in the layout of the q/k tile."""
    if not GATHER_3D:
        # cos and sin joined into one [BLOCK_T, 1, BLOCK_F, 2] tensor: one layout conversion (one
        # barrier), and both loads issued before it (converted apart, sin's load waited for the
        # barrier of cos's conversion: a third round trip; docs/launch-defaults.md, gather_3d).
        cos, sin = tl.split(tl.join(cos, sin)[:, None, :, :])
    return cos.to(tl.float32), sin.to(tl.float32)


@triton.jit
def _rotate_tile(x_ptr, x_stride, token, heads, x_heads, cache_ptr, cache_row_stride, cache_rows, pos_ptr,
                 guess_ptr, map_ptr, pos_row_stride, num_tokens, head_size, half, sec0, sec1, sec2,
                 NUM_DIMS: tl.constexpr, INTERLEAVED: tl.constexpr, MAP_TABLE: tl.constexpr, IS_NEOX: tl.constexpr,
                 ROUND_BF16: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr, POS_RUN: tl.constexpr,
                 GATHER_3D: tl.constexpr, QK_EVICT: tl.constexpr, CACHE_I64: tl.constexpr, PDL: tl.constexpr,
                 EARLY_POSITIONS: tl.constexpr, SPECULATE: tl.constexpr, INVERSE: tl.constexpr,
                 STREAM: tl.constexpr):
    """Rotate the given tokens [BLOCK_T] (int64) x heads [BLOCK_H] of one tensor in place (the key-head
    branch of _rotary_kernel, whose two arms differ in tile shape; its default path writes this body out)."""
    freq = tl.arange(0, BLOCK_F)
    token_ok = token < num_tokens
    x_rows = x_ptr + token * x_stride
    x1, x2, pos_0, pos_1, pos_2, pos_3, guess_0, guess_1, guess_2, guess_3 = _load_tile_and_positions(
        x_rows, token_ok, heads, x_heads, head_size, freq, half, pos_ptr, guess_ptr, pos_row_stride, token,
        num_tokens, NUM_DIMS, IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT, PDL, EARLY_POSITIONS, SPECULATE)
    cos, sin = _gather_cos_sin(cache_ptr, cache_row_stride, cache_rows, pos_0, pos_1, pos_2, pos_3, guess_0, guess_1,
                               guess_2, guess_3, freq, half, map_ptr, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE,
                               BLOCK_T, BLOCK_H, BLOCK_F, POS_RUN, GATHER_3D, CACHE_I64, SPECULATE)
    # Rotate and store: NeoX pairs (i, i + half), GPT-J pairs (2i, 2i + 1).
    _rotate_store_tile(x_rows, token_ok, heads, x_heads, head_size, freq, half, x1, x2, cos, sin,
                       IS_NEOX, ROUND_BF16, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT, INVERSE, STREAM)


# Head counts, sections, the token count and the positions row stride vary per call but do not
# affect memory alignment: do not let Triton specialize (and recompile) on them.
@triton.jit(do_not_specialize=["pos_row_stride", "num_tokens", "num_q_heads", "num_kv_heads", "sec0", "sec1", "sec2",
                               "cache_rows"])
def _rotary_kernel(
    q_ptr, k_ptr, cache_ptr, pos_ptr, guess_ptr, map_ptr,
    q_row_stride, k_row_stride, cache_row_stride, pos_row_stride, cache_rows,
    num_tokens, num_q_heads, num_kv_heads, head_size, half, sec0, sec1, sec2,
    NUM_DIMS: tl.constexpr, INTERLEAVED: tl.constexpr, MAP_TABLE: tl.constexpr, IS_NEOX: tl.constexpr,
    HAS_KEY: tl.constexpr, ROUND_BF16: tl.constexpr,
    SPLIT_QK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr,
    POS_RUN: tl.constexpr, GATHER_3D: tl.constexpr, PDL: tl.constexpr, QK_EVICT: tl.constexpr,
    HEADS_FASTEST: tl.constexpr, BLOCK_HK: tl.constexpr, CACHE_I64: tl.constexpr, EARLY_POSITIONS: tl.constexpr,
    SPECULATE: tl.constexpr, INVERSE: tl.constexpr, STREAM: tl.constexpr,
):
    # PDL (launched with programmatic dependent launch): wait for the previous kernel in the stream
    # to finish and flush before reading anything (positions, the cache and q/k may all be its
    # outputs), then let the next kernel launch at once: its launch and prologue overlap this body.
    # That leaves two dependent round trips after the wait: position, then cos/sin at it.
    # SPECULATE: guess the positions before the wait (a read that races that kernel's writes: it may
    # see old, new or torn values), and after it read the positions again beside q/k and the cos/sin
    # rows at the guesses, one round trip; if any position differs from its guess, the tile reads
    # cos/sin again at the true ones.  Every value used is read after the wait (which returns only
    # once the previous grid's writes are visible to this one: the PTX ISA's griddepcontrol.wait),
    # and a guess is clamped like any position, so a wrong one costs a second round trip, never a
    # wrong answer or a read outside the cache (tests/kernels/test_pdl_order.py stages the race).
    # EARLY_POSITIONS (the caller vouches that the kernel launched just before does not write the
    # positions): the positions are read before the wait and trusted.
    # With either, the wait and the next kernel's launch after it are in the tile code below.
    if PDL and not (EARLY_POSITIONS or SPECULATE):
        gdc_wait()
        gdc_launch_dependents()
    # Program (token_block, head_block) rotates a tile of BLOCK_T tokens x BLOCK_H heads x all
    # frequencies.  SPLIT_QK: head blocks [0, cdiv(num_q_heads, BLOCK_H)) are q's and the rest
    # k's, one tensor per program; else each program does its heads of q, then of k.
    # Sizes are runtime ints (fewer recompiles; Triton still specializes multiples of 16);
    # only the variant switches and the power-of-two tile sizes are constexpr.
    # half = rotary_dim / 2; sec0..sec2 are the first three sections (row 3 takes the rest);
    # MAP_TABLE: the lanes' rows are read from map_ptr (every map but chunked and interleaved).
    # INVERSE: every pair is rotated by -θ (the sine negated at the rotation, nothing else changes):
    # the backward of the rotation, run on the upstream gradient in place of q and k.
    # STREAM: no rotation, every load and store as the rotation's (the benchmark's same-bytes floor:
    # rope/harness/bench_floor.py): x1 scaled by its cos, x2 by its sin.
    # HEADS_FASTEST: a 1-D grid whose consecutive programs take the head blocks of one token block
    # (programs in flight then cover a contiguous band of rows, walked once), else a 2-D grid
    # (token blocks fastest: each head block sweeps the whole tensor).
    if SPLIT_QK and BLOCK_HK < BLOCK_H:
        # Key programs with a smaller head block (few kv heads): BLOCK_HK heads x R * BLOCK_T tokens,
        # the q tile's size, so no head slot of a key program is empty.  Programs come in groups of
        # R * BLOCK_T tokens: R token blocks x the q head blocks, then the k head blocks.
        R: tl.constexpr = BLOCK_H // BLOCK_HK
        q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
        if HEADS_FASTEST:
            per_group = R * q_blocks + tl.cdiv(num_kv_heads, BLOCK_HK)
            group = tl.program_id(0) // per_group
            slot = tl.program_id(0) % per_group
        else:
            group = tl.program_id(0)
            slot = tl.program_id(1)
        # (Token and head vectors are passed inline: the two branches' tiles differ in shape, and
        # a name assigned in both would have to keep one type.)
        if slot < R * q_blocks:
            _rotate_tile(q_ptr, q_row_stride,
                         (group * R + slot // q_blocks).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T),
                         (slot % q_blocks) * BLOCK_H + tl.arange(0, BLOCK_H), num_q_heads,
                         cache_ptr, cache_row_stride, cache_rows, pos_ptr, guess_ptr, map_ptr, pos_row_stride, num_tokens,
                         head_size, half, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE, IS_NEOX, ROUND_BF16,
                         BLOCK_T, BLOCK_H, BLOCK_F, POS_RUN, GATHER_3D, QK_EVICT, CACHE_I64, PDL, EARLY_POSITIONS,
                         SPECULATE, INVERSE, STREAM)
        else:
            _rotate_tile(k_ptr, k_row_stride,
                         group.to(tl.int64) * (R * BLOCK_T) + tl.arange(0, R * BLOCK_T),
                         (slot - R * q_blocks) * BLOCK_HK + tl.arange(0, BLOCK_HK), num_kv_heads,
                         cache_ptr, cache_row_stride, cache_rows, pos_ptr, guess_ptr, map_ptr, pos_row_stride, num_tokens,
                         head_size, half, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE, IS_NEOX, ROUND_BF16,
                         R * BLOCK_T, BLOCK_HK, BLOCK_F, POS_RUN, GATHER_3D, QK_EVICT, CACHE_I64, PDL,
                         EARLY_POSITIONS, SPECULATE, INVERSE, STREAM)
    else:
        if HEADS_FASTEST:
            if SPLIT_QK:
                head_blocks = tl.cdiv(num_q_heads, BLOCK_H) + tl.cdiv(num_kv_heads, BLOCK_H)
            else:
                head_blocks = tl.cdiv(tl.maximum(num_q_heads, num_kv_heads), BLOCK_H)
            head_block = tl.program_id(0) % head_blocks
            token_block = tl.program_id(0) // head_blocks
        else:
            head_block = tl.program_id(1)
            token_block = tl.program_id(0)

        # The tensor and heads this program rotates (selected, not branched: one code path).
        if SPLIT_QK:
            q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
            is_k = head_block >= q_blocks
            x_ptr = tl.where(is_k, k_ptr, q_ptr)
            x_stride = tl.where(is_k, k_row_stride, q_row_stride).to(tl.int64)
            x_heads = tl.where(is_k, num_kv_heads, num_q_heads)
            heads = (head_block - tl.where(is_k, q_blocks, 0)) * BLOCK_H + tl.arange(0, BLOCK_H)
        else:
            x_ptr = q_ptr
            x_stride = q_row_stride
            x_heads = num_q_heads
            heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)

        # The body of _rotate_tile, written out: one call level less, which the Triton interpreter
        # (the CPU suite) runs markedly faster; compiled, the two are the same code.
        freq = tl.arange(0, BLOCK_F)
        token = token_block.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        token_ok = token < num_tokens
        x_rows = x_ptr + token * x_stride
        x1, x2, pos_0, pos_1, pos_2, pos_3, guess_0, guess_1, guess_2, guess_3 = _load_tile_and_positions(
            x_rows, token_ok, heads, x_heads, head_size, freq, half, pos_ptr, guess_ptr, pos_row_stride, token,
            num_tokens, NUM_DIMS, IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT, PDL, EARLY_POSITIONS, SPECULATE)
        cos, sin = _gather_cos_sin(cache_ptr, cache_row_stride, cache_rows, pos_0, pos_1, pos_2, pos_3, guess_0, guess_1,
                                   guess_2, guess_3, freq, half, map_ptr, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED,
                                   MAP_TABLE, BLOCK_T, BLOCK_H, BLOCK_F, POS_RUN, GATHER_3D, CACHE_I64, SPECULATE)
        # Rotate and store: NeoX pairs (i, i + half), GPT-J pairs (2i, 2i + 1).
        _rotate_store_tile(x_rows, token_ok, heads, x_heads, head_size, freq, half, x1, x2, cos, sin,
                           IS_NEOX, ROUND_BF16, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT, INVERSE, STREAM)
        if not SPLIT_QK and HAS_KEY:
            # The same tokens' heads of k, with the same cos/sin.
            k_rows = k_ptr + token * k_row_stride
            y1, y2 = _load_tile(k_rows, token_ok, heads, num_kv_heads, head_size, freq, half,
                                IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT)
            _rotate_store_tile(k_rows, token_ok, heads, num_kv_heads, head_size, freq, half, y1, y2, cos, sin,
                               IS_NEOX, ROUND_BF16, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT, INVERSE, STREAM)


# The public names: the kernel the entry points launch (rope/triton/rotary.py), and the lanes' position
# rows as the kernel computes them (tests/kernels/test_kernel_hints.py launches it on its own).
rotary_kernel = _rotary_kernel
lane_axes = _lane_axes
# The helpers the fused-op kernels reuse (rope/triton/fused_qk_norm_rope.py, rope/triton/rope_kv_cache.py):
# the pair loads, the positions, the cos/sin gather and the bf16 rounding at the store.
load_tile = _load_tile
load_positions = _load_positions
gather_cos_sin = _gather_cos_sin
round_for_store = _round_for_store
