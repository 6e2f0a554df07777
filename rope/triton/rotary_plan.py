"""The launch plan of the rotation kernel (rope/triton/rotary_kernel.py): from the shapes alone, the
grid, the tile, the constexprs and the compile options of a launch, and the kernel's runtime
arguments.  Every default here is a row of docs/launch-defaults.md, which states its measurement;
the code cites the row by name.  The entry points (rope/triton/rotary.py) check the inputs and
launch what this module plans.
"""

from __future__ import annotations

import functools

import torch

from rope.cache import axis_table
from rope.spec import RopeSpec

from rope.triton.grid import cdiv, next_power_of_2

__all__ = [
    "EVICT_FIRST_MAX_BYTES", "EVICT_FIRST_TOKENS", "FEW_TOKENS", "INTERPRETED_TILE", "KEY_HEAD_BLOCK_TOKENS", "MAX_TILE",
    "MIN_BLOCK_F",
    "ONE_WAVE_PROGRAMS", "ONE_WAVE_TOKENS", "PDL_MAX_TOKENS", "PER_LANE_TILE_TOKENS", "PER_LANE_WIDE_TOKENS",
    "SMALL_BATCH_TOKENS", "SMALL_GRID_PROGRAMS", "SPECULATE_MAX_TOKENS",
    "cache_offsets_need_64", "check_guesses", "default_plan", "kernel_arguments", "lane_block", "map_table", "plan",
    "position_run",
]

MAX_TILE = 1024            # tokens x heads x frequency pairs handled by one program at large batch sizes
INTERPRETED_TILE = 1 << 18  # ... under Triton's interpreter, whose cost is per program (_interpreted_block_t)
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


def lane_block(spec: RopeSpec) -> int:
    """BLOCK_F: the frequency lanes of a head in one program, rotary_dim / 2 rounded up to a power of
    two and at least MIN_BLOCK_F (lanes past rotary_dim / 2 are masked).  Every model of
    rope/models.yaml rotates 32 or 64 pairs, so the floor changes none of their launches; the narrow
    widths a search draws (1-31 pairs, five powers of two) then share one compiled kernel instead of
    five (docs/launch-defaults.md, MIN_BLOCK_F)."""
    return max(MIN_BLOCK_F, next_power_of_2(spec.num_freqs))


def position_run(spec: RopeSpec, cache_row_stride: int) -> int:
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
      band: at 2-64 tokens faster than the tiles below, and than 2-head programs for few heads; at
      1 token slightly slower than the 4-warp programs before on most layouts (docs/launch-defaults.md,
      SPECULATE_MAX_TOKENS, the tile row and "Measurements behind the code's comments").

    * Below SMALL_BATCH_TOKENS, one token per program (more, shorter programs: latency): 4 heads;
      interleaved sections (the per-lane gather) 2 up to FEW_TOKENS (their lane-axis selects,
      i % 3 against each section, are the chain's longest link there; the per-lane gather of
      chunked sections has no such selects, and 2-head programs there were not measured faster
      while doubling the programs that Triton's interpreter runs one by one); the 3-D gather 8
      once 4-head programs would number more than SMALL_GRID_PROGRAMS (docs/launch-defaults.md,
      SMALL_GRID_PROGRAMS and "Measurements behind the code's comments").
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


def plan(spec: RopeSpec, num_tokens: int, num_q: int, num_k: int, has_key: bool, dtype: torch.dtype,
          cache_rows: int, cache_row_stride: int, target, block_h=None, num_warps=None, block_t=None, split_qk=None,
          gather_3d=None, pdl=None, evict_first=None, heads_fastest=None, bf16_rounding=None, block_hk=None,
          cache_offsets_64=None, speculate_positions=None, positions_before_wait: bool = False,
          inverse: bool = False, stream: bool = False):
    """(grid, constexprs and compile options) of a launch: every option the caller left None takes
    its default (docs/launch-defaults.md), computed from the shapes alone.  ``inverse``: the rotation
    by -θ (the backward), the same plan with the kernel's INVERSE switch on.  ``stream``: the same
    plan with the STREAM switch on: the rotation's loads and stores, no rotation (the benchmark's
    floor, rope.triton.rotary.stream_launch)."""
    if bf16_rounding is None:
        bf16_rounding = "convert" if target.compiled else "by_hand"
    block_f = lane_block(spec)
    # Without a key, split_qk too (by default): no key programs then (0 key heads), and the launch
    # compiles the very kernel of the same shape with a key (HAS_KEY is read only without split_qk),
    # one compile where there were two (docs/launch-defaults.md, split_qk).
    split_qk = split_qk is None or bool(split_qk)
    pos_run = position_run(spec, cache_row_stride)
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
    if block_t is None and not target.compiled:
        block_t = _interpreted_block_t(spec, num_tokens, num_q, num_k)
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
        EARLY_POSITIONS=bool(positions_before_wait), SPECULATE=speculate, INVERSE=bool(inverse), STREAM=bool(stream),
        **extra,
    )
    return grid, constexprs


@functools.lru_cache(maxsize=4096)
def default_plan(spec: RopeSpec, num_tokens: int, num_q: int, num_k: int, has_key: bool, dtype: torch.dtype,
                  cache_rows: int, cache_row_stride: int, target, inverse: bool = False):
    """The default launch's plan, once per signature (the shapes, the dtype, the cache's rows and
    row stride, the compile target) and direction (``inverse``: the backward): a decode step's host
    path is a dictionary lookup and the launch."""
    return plan(spec, num_tokens, num_q, num_k, has_key, dtype, cache_rows, cache_row_stride, target, inverse=inverse)


def check_guesses(positions, position_guesses, speculate_positions, positions_before_wait: bool):
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


def _interpreted_block_t(spec: RopeSpec, num_tokens: int, num_q: int, num_k: int) -> int:
    """The interpreter's token block: its cost is per program (each a Python-level run of numpy
    operations), so a program there takes as many tokens as fill INTERPRETED_TILE elements of its
    heads, up to the batch.  Every element is computed alone (no reduction, no order), so the bits
    do not depend on the tile (tests/kernels/test_interpreter_agreement.py holds them to a GPU's);
    the GPU's own tiles are what its tests and a caller's block_t run."""
    per_token = lane_block(spec) * next_power_of_2(max(num_q, num_k, 1))
    return max(1, min(next_power_of_2(num_tokens), INTERPRETED_TILE // per_token))


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


def kernel_arguments(signature: tuple, positions, query, key, cos_sin_cache, position_guesses,
                     map_table_: bool) -> tuple:
    """The kernel's runtime arguments, in its parameter order (absent tensors stand in as unread pointers);
    ``signature``: the launch's (rope.triton.rotary.launch_signature, ``default_plan``'s arguments)."""
    spec, num_tokens, num_q, num_k = signature[:4]
    return (query, key if key is not None else query, cos_sin_cache, positions,
            position_guesses if position_guesses is not None else positions,
            map_table(spec, positions.device) if map_table_ else positions,
            query.stride(0), (key if key is not None else query).stride(0), cos_sin_cache.stride(0),
            positions.stride(0) if positions.dim() == 2 else 0,
            cos_sin_cache.shape[0], num_tokens, num_q, num_k, spec.head_size, spec.num_freqs,
            *_sections_constexprs(spec))
