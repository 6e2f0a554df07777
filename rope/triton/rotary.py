"""One Triton kernel for every rotary variant: 1-D RoPE, M-RoPE (chunked or interleaved
sections, or any other map from frequencies to position rows), XD-RoPE (3 or 4 rows), NeoX or
GPT-J pairing, partial rotary, key present or absent.

Precision contract (docs/spec.md §3): load in the storage dtype, convert to fp32, compute in fp32 with
no FMA contraction, and round to the output dtype at the store (round to nearest even).  Under
TRITON_INTERPRET=1, bf16 arithmetic is wrong and fp32->bf16 casts truncate, so there the bf16
store rounds by bit arithmetic; compiled, the store's own convert rounds to nearest even (the same
bits, fewer instructions).  With this contract the interpreter and a GPU produce the same bits.

The kernel works in place on q and k (row strides allow views into a packed qkv tensor) and
never touches channels >= rotary_dim, heads >= num_heads or frequencies >= rotary_dim/2.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from rope.cache import axis_table
from rope.devices import device_name, triton_runs_on
from rope.spec import RopeSpec, check_position_range, check_rotation_inputs, checks_values

from rope.triton.checked import CheckedCalls
from rope.triton.grid import cdiv, next_power_of_2
from rope.triton.launcher import launch
from rope.triton.pdl import HAS_PDL
from rope.triton.targets import launch_target

if HAS_PDL:     # programmatic dependent launch: rope/triton/pdl.py
    from rope.triton.pdl import gdc_launch_dependents, gdc_wait

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_TILE = 1024            # tokens x heads x frequency pairs handled by one program at large batch sizes
SMALL_BATCH_TOKENS = 128   # below this, split heads over more programs (decode latency)
PDL_MAX_TOKENS = 64        # up to this, launch with programmatic dependent launch
                           # (docs/launch-defaults.md, PDL_MAX_TOKENS: 127 tokens lost 3%)
# Where one wave of programs holds the whole grid (H200 sweeps at 1-4096 tokens; docs/launch-defaults.md,
# ONE_WAVE_TOKENS):
ONE_WAVE_TOKENS = (SMALL_BATCH_TOKENS, 256)   # PDL again, with tiles that let two launches share the SMs
FEW_TOKENS = 16            # up to this, interleaved sections (the per-lane cos/sin gather) take 2-head programs
SMALL_GRID_PROGRAMS = 576  # below SMALL_BATCH_TOKENS, 8-head programs once 4-head ones would exceed this many
ONE_WAVE_PROGRAMS = 1152   # in ONE_WAVE_TOKENS, 1-token x 8-head programs of 2 warps up to this many, else 4 x 8
PER_LANE_WIDE_TOKENS = 192  # in ONE_WAVE_TOKENS, the per-lane gather: 2-token x 8-head programs below this
PER_LANE_TILE_TOKENS = 4096  # above ONE_WAVE_TOKENS up to this, the per-lane gather: 4-token x 8-head programs
EVICT_FIRST_TOKENS = (SMALL_BATCH_TOKENS, 16384)   # q/k evict_first between these
                                                   # (docs/launch-defaults.md, EVICT_FIRST_TOKENS: 65536 gained nothing)
EVICT_FIRST_MAX_BYTES = 512 << 20   # ... and while the rotated q/k bytes (read + written) are at most this
                                    # (docs/launch-defaults.md, EVICT_FIRST_MAX_BYTES)
KEY_HEAD_BLOCK_TOKENS = 16384  # above this, key programs take the key's head count
                               # (docs/launch-defaults.md, KEY_HEAD_BLOCK_TOKENS)
SPECULATE_MAX_TOKENS = PDL_MAX_TOKENS  # with PDL up to this, guess the positions before the wait
                                       # (docs/launch-defaults.md, SPECULATE_MAX_TOKENS)
MIN_BLOCK_F = 32           # frequency lanes per head in a program, at least (docs/launch-defaults.md, MIN_BLOCK_F)


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
                       BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr, EVICT: tl.constexpr):
    """Rotate the loaded pairs in fp32 (cos/sin: [BLOCK_T, 1 or BLOCK_H, BLOCK_F]) and store them in place,
    under the same masks as :func:`_load_tile`."""
    c = cos     # [BLOCK_T, 1 or BLOCK_H, BLOCK_F]
    s = sin
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
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
    barrier measured slower on an H200: Qwen2.5-VL-72B at 4096 tokens 48.2 us against 43.0).
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
    _position_run), so the offsets are declared contiguous in runs of POS_RUN and the loads
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
                 EARLY_POSITIONS: tl.constexpr, SPECULATE: tl.constexpr):
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
                       IS_NEOX, ROUND_BF16, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT)


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
    SPECULATE: tl.constexpr,
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
                         SPECULATE)
        else:
            _rotate_tile(k_ptr, k_row_stride,
                         group.to(tl.int64) * (R * BLOCK_T) + tl.arange(0, R * BLOCK_T),
                         (slot - R * q_blocks) * BLOCK_HK + tl.arange(0, BLOCK_HK), num_kv_heads,
                         cache_ptr, cache_row_stride, cache_rows, pos_ptr, guess_ptr, map_ptr, pos_row_stride, num_tokens,
                         head_size, half, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE, IS_NEOX, ROUND_BF16,
                         R * BLOCK_T, BLOCK_HK, BLOCK_F, POS_RUN, GATHER_3D, QK_EVICT, CACHE_I64, PDL,
                         EARLY_POSITIONS, SPECULATE)
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
                           IS_NEOX, ROUND_BF16, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT)
        if not SPLIT_QK and HAS_KEY:
            # The same tokens' heads of k, with the same cos/sin.
            k_rows = k_ptr + token * k_row_stride
            y1, y2 = _load_tile(k_rows, token_ok, heads, num_kv_heads, head_size, freq, half,
                                IS_NEOX, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT)
            _rotate_store_tile(k_rows, token_ok, heads, num_kv_heads, head_size, freq, half, y1, y2, cos, sin,
                               IS_NEOX, ROUND_BF16, BLOCK_T, BLOCK_H, BLOCK_F, QK_EVICT)


def lane_block(spec: RopeSpec) -> int:
    """BLOCK_F: the frequency lanes of a head in one program, rotary_dim / 2 rounded up to a power of
    two and at least MIN_BLOCK_F (lanes past rotary_dim / 2 are masked).  Every model of
    rope/models.yaml rotates 32 or 64 pairs, so the floor changes none of their launches; the narrow
    widths a search draws (1-31 pairs, five powers of two) then share one compiled kernel instead of
    five (docs/launch-defaults.md, MIN_BLOCK_F)."""
    return max(MIN_BLOCK_F, next_power_of_2(spec.num_freqs))


def _position_run(spec: RopeSpec, cache_row_stride: int) -> int:
    """The longest aligned run of frequency lanes (a power of two, at most 8) that always share one
    position row and whose cache offsets are aligned to it: the vector width of the cos/sin gather."""
    rows = spec.axis_map()
    run = 8
    while run > 1 and (spec.num_freqs % run or cache_row_stride % run
                       or any(len(set(rows[i:i + run])) > 1 for i in range(0, len(rows), run))):
        run //= 2
    return run


def _map_table_for(spec: RopeSpec) -> bool:
    """Whether the kernel reads the lanes' rows from a table: every map but 1-D, chunked and the
    Qwen3-VL interleaved one, which it computes from the sections."""
    return spec.num_dims > 1 and spec.layout not in ("chunked", "interleaved")


def map_table(spec: RopeSpec, device: torch.device) -> torch.Tensor:
    """The table the kernel reads the lanes' rows from (rope.cache.axis_table: once per map and device)."""
    return axis_table(spec.axis_map(), device)


def _default_tile(num_tokens: int, num_q: int, num_k: int, split_qk: bool, gather_3d: bool,
                  interleaved: bool, speculate: bool = False) -> tuple[int, int, int]:
    """(block_t, block_h, num_warps) of the default launch; block_t 0: as many tokens as fill MAX_TILE
    pairs.  From the H200 sweeps (docs/launch-defaults.md: MAX_TILE, SMALL_BATCH_TOKENS, ONE_WAVE_TOKENS,
    SPECULATE_MAX_TOKENS and the tile row); q and k always in separate programs.

    * Speculating (the positions guessed before the PDL wait, up to SPECULATE_MAX_TOKENS): 1 token
      x 8 heads on 2 warps at every token count, layout and head count (the launcher does not
      narrow the head block to fewer heads there).  One compiled kernel per shape for the whole
      band: 2-64 tokens 8-22% faster than the tiles below, and faster than 2-head programs for
      few heads (HunyuanOCR at TP 8, 16 tokens: 0.954 -> 0.874 us); at 1 token 0.015-0.06 us
      slower than the 4-warp programs before on the five layouts (Qwen2.5-VL-72B 0.785 -> 0.842, the
      most), faster at Qwen2.5-VL-72B at TP 8 (0.842 -> 0.792): docs/launch-defaults.md, SPECULATE_MAX_TOKENS
      and the tile row.

    * Below SMALL_BATCH_TOKENS, one token per program (more, shorter programs: latency): 4 heads;
      interleaved sections (the per-lane gather) 2 up to FEW_TOKENS (their lane-axis selects,
      i % 3 against each section, are the chain's longest link there; the per-lane gather of
      chunked sections has no such selects, and 2-head programs there were not measured faster
      while doubling the programs that Triton's interpreter runs one by one); the 3-D gather 8
      once 4-head programs would number more than SMALL_GRID_PROGRAMS (Qwen2.5-VL-72B at 64 tokens: with PDL, 1152 programs
      took 1.78 us, 576 of 8 heads 1.31; at 32 tokens 576 programs of 4 heads took 1.31, 288 of 8
      heads 1.41).
    * In ONE_WAVE_TOKENS, launched with PDL, the grid is sized so that the next launch's programs
      fit beside it: 1 token x 8 heads on 2 warps up to ONE_WAVE_PROGRAMS programs, else 4 tokens x
      8 heads; the per-lane gather 2 x 8 on 4 warps below PER_LANE_WIDE_TOKENS, then 1 x 8 on 2.
    * Above: 8 heads and MAX_TILE pairs (Qwen2.5-VL-72B, head 128: 2 tokens; GLM-4.1V, 64 rotary
      channels: 4), or 4 tokens for the per-lane gather up to PER_LANE_TILE_TOKENS.
    """
    def programs_per_token(heads: int) -> int:
        return cdiv(num_q, heads) + cdiv(num_k, heads) if split_qk else cdiv(max(num_q, num_k), heads)

    if num_tokens < SMALL_BATCH_TOKENS:
        if speculate:
            return 1, 8, 2
        if not gather_3d:
            return 1, 2 if interleaved and num_tokens <= FEW_TOKENS else 4, 4
        return 1, 8 if num_tokens * programs_per_token(4) > SMALL_GRID_PROGRAMS else 4, 4
    if num_tokens <= ONE_WAVE_TOKENS[1]:
        if not gather_3d:
            return (2, 8, 4) if num_tokens < PER_LANE_WIDE_TOKENS else (1, 8, 2)
        return (1, 8, 2) if num_tokens * programs_per_token(8) <= ONE_WAVE_PROGRAMS else (4, 8, 4)
    if not gather_3d and num_tokens <= PER_LANE_TILE_TOKENS:
        return 4, 8, 4
    return 0, 8, 4


def cache_offsets_need_64(cos_sin_cache, block_f: int) -> bool:
    """Whether an element offset into the cache (row * row stride + lane, lanes < block_f) can pass
    2^31 - 1, so that the kernel must index it in 64 bits."""
    return _offsets_need_64(cos_sin_cache.shape[0], cos_sin_cache.stride(0), block_f)


def _offsets_need_64(rows: int, row_stride: int, block_f: int) -> bool:
    return rows > 0 and (rows - 1) * row_stride + block_f > 2**31 - 1


def _sections_constexprs(spec: RopeSpec) -> tuple[int, int, int]:
    sections = tuple(spec.sections or ()) + (0, 0, 0)
    return sections[0], sections[1], sections[2]


def launch_rotary(spec: RopeSpec, positions, query, key, cos_sin_cache, *, block_h: int | None = None,
                  num_warps: int | None = None, block_t: int | None = None, split_qk: bool | None = None,
                  gather_3d: bool | None = None, pdl: bool | None = None, evict_first: bool | None = None,
                  heads_fastest: bool | None = None, bf16_rounding: str | None = None,
                  block_hk: int | None = None, cache_offsets_64: bool | None = None,
                  positions_before_wait: bool = False, speculate_positions: bool | None = None,
                  position_guesses=None):
    """Launch the kernel without validation (the caller has checked); returns (query, key), rotated
    in place (query/key must have unit stride in the last dim).

    Every option defaults to the launch measured fastest on an H200; docs/launch-defaults.md states
    each default with its measurement, and no option changes a value (tests/kernels/
    test_launch_options.py).  The tile: ``block_t`` tokens x ``block_h`` heads per program on
    ``num_warps`` warps; ``split_qk``: q and k in separate programs, the key's of ``block_hk`` heads
    (a power of two dividing ``block_h``; they take ``block_h // block_hk`` times the tokens);
    ``gather_3d``: cos/sin gathered straight into the tile's layout; ``heads_fastest``: a 1-D grid,
    the head blocks of a token block in consecutive programs.  ``pdl``: programmatic dependent
    launch, ``evict_first``: the q/k eviction hint (each only where the compile target has it:
    rope/triton/targets.py).  ``bf16_rounding``: ``"convert"`` (the store's own rounding, compiled)
    or ``"by_hand"`` (bit arithmetic, the same bits; under the interpreter, whose convert truncates).
    ``cache_offsets_64``: cache rows and offsets in 64-bit arithmetic (forced where a 32-bit offset
    could overflow).  ``positions_before_wait``: with PDL, read the positions before waiting for
    the previous kernel and trust them (valid only when that kernel does not write them; off by
    default: tests/kernels/test_pdl_order.py shows the hazard).  ``speculate_positions``: guess the
    positions before the PDL wait, check them after it, re-read cos/sin where a guess was wrong;
    ``position_guesses`` (tests): where the guesses are read from (see ``_check_guesses``).  The
    default launch's plan (grid, constexprs) is computed once per signature (``_default_plan``).
    """
    if bf16_rounding not in (None, "by_hand", "convert"):
        raise ValueError(f"bf16_rounding={bf16_rounding!r}: must be 'by_hand' or 'convert'")
    if positions.shape[-1] == 0:
        return query, key
    signature = _signature(spec, positions, query, key, cos_sin_cache)
    asked = (block_h, num_warps, block_t, split_qk, gather_3d, pdl, evict_first, heads_fastest, bf16_rounding,
             block_hk, cache_offsets_64, speculate_positions)
    if asked == _DEFAULTS and not positions_before_wait and position_guesses is None:
        grid, constexprs = _default_plan(*signature)              # once per signature
        plan_key = signature
    else:
        speculate_positions = _check_guesses(positions, position_guesses, speculate_positions, positions_before_wait)
        grid, constexprs = _plan(*signature, *asked[:-1], speculate_positions, positions_before_wait)
        plan_key = (signature, asked, positions_before_wait, speculate_positions)
    # Through the compiled kernel's launcher once Triton's path has launched this plan with
    # arguments specialized alike (rope/triton/launcher.py).
    launch(_rotary_kernel, grid, _arguments(signature, positions, query, key, cos_sin_cache, position_guesses,
                                            constexprs["MAP_TABLE"]), constexprs, plan_key)
    return query, key


def _signature(spec: RopeSpec, positions, query, key, cos_sin_cache) -> tuple:
    """What the default launch's plan depends on (``_default_plan``'s arguments): the spec, the token
    and head counts, whether there is a key, the dtype, the cache's rows and row stride, and the
    compile target (rope/triton/targets.py: PDL and the eviction hint exist on some targets only,
    and the interpreter takes no compile options)."""
    return (spec, positions.shape[-1], query.shape[1] // spec.head_size,
            key.shape[1] // spec.head_size if key is not None else 0, key is not None, query.dtype,
            cos_sin_cache.shape[0], cos_sin_cache.stride(0), launch_target(query.device))


def _arguments(signature: tuple, positions, query, key, cos_sin_cache, position_guesses, map_table_: bool) -> tuple:
    """The kernel's runtime arguments, in its parameter order (absent tensors stand in as unread pointers)."""
    spec, num_tokens, num_q, num_k = signature[:4]
    return (query, key if key is not None else query, cos_sin_cache, positions,
            position_guesses if position_guesses is not None else positions,
            map_table(spec, positions.device) if map_table_ else positions,
            query.stride(0), (key if key is not None else query).stride(0), cos_sin_cache.stride(0),
            positions.stride(0) if positions.dim() == 2 else 0,
            cos_sin_cache.shape[0], num_tokens, num_q, num_k, spec.head_size, spec.num_freqs,
            *_sections_constexprs(spec))


def bare_launch(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """The default launch of these inputs as a function of no arguments that launches it the way
    Triton's documentation does, ``kernel[grid](*args, **constexprs)``, with the plan and the
    arguments computed here once: the yardstick of the host path (rope-harness bench's
    ``triton-bare``).  Returns (query, key) per call, rotated in place."""
    signature = _signature(spec, positions, query, key, cos_sin_cache)
    grid, constexprs = _default_plan(*signature)
    args = _arguments(signature, positions, query, key, cos_sin_cache, None, constexprs["MAP_TABLE"])

    def call():
        if signature[1]:                # tokens
            _rotary_kernel[grid](*args, **constexprs)
        return query, key
    return call


_DEFAULTS = (None,) * 12        # launch_rotary's options, none given: the default launch


def _plan(spec: RopeSpec, num_tokens: int, num_q: int, num_k: int, has_key: bool, dtype: torch.dtype,
          cache_rows: int, cache_row_stride: int, target, block_h=None, num_warps=None, block_t=None, split_qk=None,
          gather_3d=None, pdl=None, evict_first=None, heads_fastest=None, bf16_rounding=None, block_hk=None,
          cache_offsets_64=None, speculate_positions=None, positions_before_wait: bool = False):
    """(grid, constexprs and compile options) of a launch: every option the caller left None takes
    its default (docs/launch-defaults.md), computed from the shapes alone."""
    if bf16_rounding is None:
        bf16_rounding = "convert" if target.compiled else "by_hand"
    block_f = lane_block(spec)
    # Without a key, split_qk too (by default): no key programs then (0 key heads), and the launch
    # compiles the very kernel of the same shape with a key (HAS_KEY is read only without split_qk),
    # one compile where there were two (docs/launch-defaults.md, split_qk).
    split_qk = split_qk is None or bool(split_qk)
    pos_run = _position_run(spec, cache_row_stride)
    if gather_3d is None:
        # The 3-D gather pays off only as vector loads: runs of lanes (POS_RUN > 1) and a lane mask
        # Triton can prove constant over them, i.e. half = num_freqs specialized as a multiple of 16
        # (docs/launch-defaults.md, gather_3d).
        gather_3d = pos_run > 1 and spec.num_freqs % 16 == 0
    if pdl is None:
        pdl = num_tokens <= PDL_MAX_TOKENS or ONE_WAVE_TOKENS[0] <= num_tokens <= ONE_WAVE_TOKENS[1]
    pdl = bool(pdl) and target.pdl
    if speculate_positions is None:
        speculate_positions = pdl and not positions_before_wait and num_tokens <= SPECULATE_MAX_TOKENS
    speculate = bool(speculate_positions)
    speculating = speculate and pdl     # the tile's band; the kernel reads the guesses whenever speculate is set
    block_t, block_h, num_warps = _tile(spec, num_tokens, num_q, num_k, split_qk, gather_3d, speculating,
                                        block_t, block_h, num_warps)
    if evict_first is None:
        rotated_bytes = 2 * num_tokens * (num_q + num_k) * spec.rotary_dim * dtype.itemsize
        evict_first = (EVICT_FIRST_TOKENS[0] <= num_tokens <= EVICT_FIRST_TOKENS[1]
                       and rotated_bytes <= EVICT_FIRST_MAX_BYTES)
    evict_first = bool(evict_first) and target.eviction_hints
    if heads_fastest is None:
        heads_fastest = num_tokens >= SMALL_BATCH_TOKENS
    cache_offsets_64 = _cache_offsets_64(cache_offsets_64, cache_rows, cache_row_stride, block_f)
    block_hk = _key_head_block(block_hk, block_h, split_qk, num_tokens, num_k)
    grid = _grid(num_tokens, num_q, num_k, split_qk, block_t, block_h, block_hk, bool(heads_fastest))
    extra = ({"enable_fp_fusion": False, "num_warps": num_warps} if target.compiled else {}) | (
        {"launch_pdl": True} if pdl else {})
    constexprs = dict(
        NUM_DIMS=spec.num_dims, INTERLEAVED=spec.num_dims > 1 and spec.layout == "interleaved",
        MAP_TABLE=_map_table_for(spec), IS_NEOX=spec.is_neox_style, HAS_KEY=has_key or split_qk,
        ROUND_BF16=dtype == torch.bfloat16 and bf16_rounding == "by_hand",
        SPLIT_QK=split_qk, BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_F=block_f,
        POS_RUN=pos_run, GATHER_3D=gather_3d, PDL=pdl, QK_EVICT="evict_first" if evict_first else "",
        HEADS_FASTEST=bool(heads_fastest), BLOCK_HK=block_hk, CACHE_I64=bool(cache_offsets_64),
        EARLY_POSITIONS=bool(positions_before_wait), SPECULATE=speculate, **extra,
    )
    return grid, constexprs


@functools.lru_cache(maxsize=4096)
def _default_plan(spec: RopeSpec, num_tokens: int, num_q: int, num_k: int, has_key: bool, dtype: torch.dtype,
                  cache_rows: int, cache_row_stride: int, target):
    """The default launch's plan, once per signature (the shapes, the dtype, the cache's rows and
    row stride, the compile target): a decode step's host path is a dictionary lookup and the launch."""
    return _plan(spec, num_tokens, num_q, num_k, has_key, dtype, cache_rows, cache_row_stride, target)


def _check_guesses(positions, position_guesses, speculate_positions, positions_before_wait: bool):
    """The caller's speculation options, checked: ``position_guesses`` (tests) is a tensor shaped
    and strided like ``positions`` that the guesses are read from instead, so that a wrong guess,
    which on a GPU needs a race, can be staged anywhere; it implies speculating (on any target: a
    test stages wrong guesses where there is no PDL wait).  Returns ``speculate_positions`` (None:
    the default, with PDL up to SPECULATE_MAX_TOKENS: docs/launch-defaults.md)."""
    if position_guesses is not None:
        if speculate_positions is False:
            raise ValueError("position_guesses: given with speculate_positions=False")
        if position_guesses.shape != positions.shape or position_guesses.stride() != positions.stride() \
                or position_guesses.dtype != positions.dtype or position_guesses.device != positions.device:
            raise ValueError(f"position_guesses: must be shaped, strided, typed and placed like positions "
                             f"{tuple(positions.shape)} {positions.stride()} {positions.dtype} {positions.device}, "
                             f"got {tuple(position_guesses.shape)} {position_guesses.stride()} "
                             f"{position_guesses.dtype} {position_guesses.device}")
        speculate_positions = True
    if speculate_positions and positions_before_wait:
        raise ValueError("speculate_positions=True with positions_before_wait=True: the early read is trusted, "
                         "there is nothing to verify")
    return speculate_positions


def _tile(spec: RopeSpec, num_tokens: int, num_q: int, num_k: int, split_qk: bool, gather_3d: bool,
          speculating: bool, block_t, block_h, num_warps) -> tuple[int, int, int]:
    """(block_t, block_h, num_warps): the caller's where given, else the default tile's."""
    tile = _default_tile(num_tokens, num_q, num_k, split_qk, gather_3d,
                         interleaved=spec.num_dims > 1 and spec.layout != "chunked", speculate=speculating)
    if block_h is None:
        # Narrowed to the heads there are, except in the speculating band: one head block for
        # every head count there (masked head lanes cost no memory traffic; docs/launch-defaults.md, the tile row).
        block_h = tile[1] if speculating else min(next_power_of_2(max(num_q, num_k)), tile[1])
    if block_t is None:
        block_t = tile[0] if tile[0] else max(1, min(8, MAX_TILE // (lane_block(spec) * block_h)))
    return block_t, block_h, tile[2] if num_warps is None else num_warps


def _cache_offsets_64(asked, cache_rows: int, cache_row_stride: int, block_f: int) -> bool:
    """64-bit cache offsets where asked, and always where a 32-bit offset could overflow
    (``cache_offsets_need_64``); 32-bit otherwise, a shorter position -> cos/sin chain."""
    needs_64 = _offsets_need_64(cache_rows, cache_row_stride, block_f)
    if asked is None:
        return needs_64
    if needs_64 and not asked:
        raise ValueError(f"cache_offsets_64=False: cos_sin_cache of {cache_rows} rows and row "
                         f"stride {cache_row_stride} has offsets past 2^31 - 1")
    return bool(asked)


def _key_head_block(block_hk, block_h: int, split_qk: bool, num_tokens: int, num_k: int) -> int:
    """The key programs' head block: ``block_h`` without split_qk; by default the key's head count
    rounded up to a power of two above KEY_HEAD_BLOCK_TOKENS (docs/launch-defaults.md), else block_h."""
    if not split_qk:
        return block_h
    if block_hk is None:
        return min(block_h, next_power_of_2(num_k)) if num_tokens > KEY_HEAD_BLOCK_TOKENS and num_k else block_h
    if block_hk < 1 or block_h % block_hk or block_hk & (block_hk - 1):
        raise ValueError(f"block_hk={block_hk}: must be a power of two dividing block_h={block_h}")
    return block_hk


def _grid(num_tokens: int, num_q: int, num_k: int, split_qk: bool, block_t: int, block_h: int, block_hk: int,
          heads_fastest: bool) -> tuple[int, int, int]:
    """The launch grid (3-D, as Triton's launcher takes it).  With split_qk, programs come in groups of ``rounds`` token blocks:
    ``rounds`` x the q head blocks, then the k head blocks (of block_hk heads and rounds * block_t
    tokens).  heads_fastest: one axis, the head blocks of a token block in consecutive programs."""
    rounds = block_h // block_hk
    head_blocks = (rounds * cdiv(num_q, block_h) + cdiv(num_k, block_hk) if split_qk
                   else cdiv(max(num_q, num_k), block_h))
    token_blocks = cdiv(num_tokens, rounds * block_t)
    return (token_blocks * head_blocks, 1, 1) if heads_fastest else (token_blocks, head_blocks, 1)


def _unit_last_stride(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or t.stride(-1) == 1:
        return t
    return t.contiguous()


def rotate_triton(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """Rotate query/key in place with the Triton kernel; returns the rotated tensors.

    Args:
        positions: int64/int32 [T] (1-D RoPE) or [spec.num_dims, T].
        query: [T, num_q_heads * head_size], any row stride; key: [T, num_kv_heads * head_size] or None.
        cos_sin_cache: [>= max position + 1, rotary_dim], cos | sin.
    Returns:
        (query, key): the same tensors, rotated (copies only if the last dim was strided).
    """
    signature = CheckedCalls.signature((spec,), (positions, query, key, cos_sin_cache))
    copies = _CHECKED.get(signature)
    if copies is None:                  # a signature not seen (or none): every check
        _check_inputs(spec, positions, query, key, cos_sin_cache)
        copies = (cos_sin_cache.stride(1) != 1 or positions.stride(-1) != 1 or query.stride(-1) != 1
                  or (key is not None and key.stride(-1) != 1))
        _CHECKED.add(signature, copies)
    elif checks_values(positions):      # the metadata passed before; the values are new
        check_position_range(positions, cos_sin_cache.shape[0])
    if copies:                          # the kernel reads unit-stride columns: strided inputs are copied
        if cos_sin_cache.stride(1) != 1:
            cos_sin_cache = cos_sin_cache.contiguous()
        if positions.stride(-1) != 1:       # 1-D or row-strided positions: columns must be contiguous
            positions = positions.contiguous()
        query, key = _unit_last_stride(query), _unit_last_stride(key)
    return launch_rotary(spec, positions, query, key, cos_sin_cache)


# Calls whose metadata passed the checks, each with whether it copies a strided input
# (rope/triton/checked.py).
_CHECKED = CheckedCalls()


def _check_inputs(spec: RopeSpec, positions, query, key, cos_sin_cache) -> None:
    """The public entry's checks: the contract's (rope.spec.check_rotation_inputs, the values among
    them where rope.spec.checks_values says so: on the CPU, or under ROPE_CHECK_VALUES=1), then the
    kernel's own limits (dtypes, devices)."""
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache)
    if query.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"query.dtype={query.dtype}: the Triton kernel supports {SUPPORTED_DTYPES}")
    device = device_name(query.device)
    if not triton_runs_on(device):
        raise ValueError(f"query.device={query.device}: Triton needs a GPU tensor here, or TRITON_INTERPRET=1")


def supports(spec: RopeSpec, dtype: torch.dtype, device: str) -> bool:
    return dtype in SUPPORTED_DTYPES and triton_runs_on(device)


rotate_triton.working_precision = "float32"
# Where launch_rotary's defaults change path by the token count alone: speculating (GPU, PDL) with
# 8-head programs of 2 warps up to SPECULATE_MAX_TOKENS; 2-head programs for
# interleaved sections up to FEW_TOKENS; PDL off above PDL_MAX_TOKENS, on again in ONE_WAVE_TOKENS; from
# SMALL_BATCH_TOKENS token x head x frequency tiles and the heads-fastest 1-D grid; the per-lane
# gather's tiles at PER_LANE_WIDE_TOKENS and above PER_LANE_TILE_TOKENS; evict_first off above
# 16384; key programs of the key's head count above KEY_HEAD_BLOCK_TOKENS.  (The program-count
# switches of _default_tile and evict_first's byte bound move with the head counts; test_launch_options
# holds every tile and hint to the default's bits.)
rotate_triton.switch_tokens = tuple(sorted({FEW_TOKENS + 1, PDL_MAX_TOKENS + 1, SPECULATE_MAX_TOKENS + 1,
                                            SMALL_BATCH_TOKENS, PER_LANE_WIDE_TOKENS,
                                            ONE_WAVE_TOKENS[1] + 1, PER_LANE_TILE_TOKENS + 1, EVICT_FIRST_TOKENS[1] + 1,
                                            KEY_HEAD_BLOCK_TOKENS + 1}))
rotate_triton.supports = supports
rotate_triton.unchecked = launch_rotary   # hot path for the benchmark: no validation, no host sync
rotate_triton.bare_launch = bare_launch   # the benchmark's yardstick of the host path
