"""The floor of a rotation row in ``rope-harness bench``: the fastest stream that moves the bytes a
rotation moves, in the pattern it moves them, and does nothing else, timed in the same run by the
same timers as the contenders; and beside it, the fastest stream over the rotated channels alone.

A rotation reads its tokens' positions, gathers for each frequency the cos and sin entries of the
cache row its position row names, and reads and writes the first ``rotary_dim`` channels of every
head row of q and k, where they lie.  Where the positions are spread over a long cache (the
benchmark draws them over the model's whole ``max_position``), the gather is not the few bytes it
counts: each frequency's entries come from the cache row of that frequency's position row, so an
interleaved map (lanes cycling through three rows) touches three cache rows a token, every 32-byte
sector of each, and those rows are mostly not in L2.  The streams:

- the same bytes (``same_bytes_calls``), whose fastest variant is the floor:

  - the rotation kernel with its STREAM switch on (``kernel``; ``kernel,block_t=N``: N tokens a
    program instead of the plan's): the rotation's launch plan, every load and store as the
    rotation's, each pair (x1, x2) stored back as (x1 * cos, x2 * sin), one multiply an element
    (rope.triton.rotary.stream_launch), launched without programmatic dependent launch, as the
    graph timer races ours;
  - a gathering stream written apart from the rotation (``tile=TxH``): one Triton launch over q's and
    k's head rows, ``T`` tokens x ``H`` heads a program (the key's programs as many heads as it has,
    rounded up to a power of two, and proportionally more tokens).  Each program reads its tokens'
    positions through the spec's map, gathers the cos/sin entry of every rotated channel (channel
    ``j`` reads the cache column ``j`` of the row named by frequency ``j mod rotary_dim/2``'s
    position: the entries a rotation reads, for either pairing; runs of channels that share a row as
    one vector load), and scales each rotated channel in place by its entry;

- the rotated channels alone (``channels_calls``): torch's in-place ``mul_`` of q's and k's rotated
  channels, and a Triton stream over their head rows, ``R`` rows a program (``rows=R``): fewer
  bytes than a rotation moves (no positions, no cos/sin), so faster than any rotation can be where
  the cache rows it gathers miss L2; reported beside the floor, never as it.

The 1 GiB device copy (``rope.harness.bench.copy_bandwidth``) measures the device's bandwidth, not
what a stream reaches at a row's size; its figure is quoted from 16,384 tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from rope.cache import axis_table
from rope.spec import RopeSpec
from rope.triton.grid import cdiv, next_power_of_2
from rope.triton.rotary import stream_launch
from rope.triton.rotary_plan import position_run

__all__ = ["CHANNEL_ROWS", "Floor", "GATHER_TILES", "channels_bytes", "channels_calls", "gathering_calls",
           "kernel_stream_calls", "measure_floor", "same_bytes_calls"]

GATHER_TILES = ((1, 8), (2, 8), (2, 16))   # (tokens, heads) a program of the gathering stream's variants
CHANNEL_ROWS = (16, 32, 64)     # head rows per program of the channels-only stream's variants
_SCALE = 1.0000001              # the channels-only stream's factor: any, its values are never read


@triton.jit
def _scale_rotated_channels(q_ptr, k_ptr, q_rows, k_rows, scale, ROW: tl.constexpr, PREFIX: tl.constexpr,
                            PREFIX_P2: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    # Programs [0, cdiv(q_rows, BLOCK_ROWS)) take q's head rows, the rest k's, as a rotation kernel
    # launches one grid over both.  A head row is ROW elements; its first PREFIX are scaled in place
    # (PREFIX_P2: the power of two tl.arange needs, the lanes past PREFIX masked off).
    q_blocks = tl.cdiv(q_rows, BLOCK_ROWS)
    pid = tl.program_id(0)
    is_k = pid >= q_blocks
    x_ptr = tl.where(is_k, k_ptr, q_ptr)
    rows = tl.where(is_k, k_rows, q_rows)
    block = pid - tl.where(is_k, q_blocks, 0)
    r = block.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    c = tl.arange(0, PREFIX_P2)
    offs = r[:, None] * ROW + c[None, :]
    mask = (r < rows)[:, None] & (c < PREFIX)[None, :]
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(x_ptr + offs, (x * scale).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scale_tile_by_entries(x_ptr, pos_ptr, cache_ptr, map_ptr, t_block, h_block, tokens, heads, pos_row_stride,
                           cache_stride, ROW: tl.constexpr, ROT: tl.constexpr, ROT_P2: tl.constexpr,
                           HALF: tl.constexpr, RUN: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    # The rotated channels as [ROT_P2 // RUN, RUN]: RUN neighbouring channels always share a position
    # row (rope.triton.rotary_plan.position_run), so each run's entries are one contiguous (vector)
    # load from one cache row, as the rotation gathers them; RUN 1 for maps whose lanes alternate rows.
    t = t_block.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
    run = tl.arange(0, ROT_P2 // RUN) * RUN
    j = run[:, None] + tl.arange(0, RUN)[None, :]                         # [runs, RUN]: the channel
    run_ok = run < ROT
    lane_ok = j < ROT
    # Channel j's entry: column j of the cache row named by the position of frequency j mod HALF's
    # row (the map); j < HALF is that frequency's cos, j >= HALF its sin.
    axis = tl.load(map_ptr + run % HALF, mask=run_ok, other=0)
    t_ok = t < tokens
    pos = tl.load(pos_ptr + axis[None, :] * pos_row_stride + t[:, None], mask=t_ok[:, None] & run_ok[None, :],
                  other=0)
    entry_ok = t_ok[:, None, None] & lane_ok[None, :, :]
    entry = tl.load(cache_ptr + pos[:, :, None] * cache_stride + j[None, :, :], mask=entry_ok,
                    other=0.0).to(tl.float32)                              # [BLOCK_T, runs, RUN]
    offs = (t[:, None, None, None] * heads + h[None, :, None, None]) * ROW + j[None, None, :, :]
    mask = t_ok[:, None, None, None] & (h < heads)[None, :, None, None] & lane_ok[None, None, :, :]
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(x_ptr + offs, (x * entry[:, None, :, :]).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gather_and_scale(q_ptr, k_ptr, pos_ptr, cache_ptr, map_ptr, tokens, num_q, num_k, pos_row_stride, cache_stride,
                      ROW: tl.constexpr, ROT: tl.constexpr, ROT_P2: tl.constexpr, HALF: tl.constexpr,
                      RUN: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_TK: tl.constexpr, BLOCK_HK: tl.constexpr):
    # q's programs first, then k's; within each, the head blocks of one token block are neighbours
    # (their gathers read the same cache rows), as the rotation kernel's grid orders them.
    pid = tl.program_id(0)
    q_head_blocks = tl.cdiv(num_q, BLOCK_H)
    q_programs = tl.cdiv(tokens, BLOCK_T) * q_head_blocks
    if pid < q_programs:
        _scale_tile_by_entries(q_ptr, pos_ptr, cache_ptr, map_ptr, pid // q_head_blocks, pid % q_head_blocks,
                               tokens, num_q, pos_row_stride, cache_stride, ROW, ROT, ROT_P2, HALF, RUN, BLOCK_T, BLOCK_H)
    else:
        k_head_blocks = tl.cdiv(num_k, BLOCK_HK)
        p = pid - q_programs
        _scale_tile_by_entries(k_ptr, pos_ptr, cache_ptr, map_ptr, p // k_head_blocks, p % k_head_blocks,
                               tokens, num_k, pos_row_stride, cache_stride, ROW, ROT, ROT_P2, HALF, RUN, BLOCK_TK, BLOCK_HK)


def channels_bytes(spec: RopeSpec, tokens: int, num_q: int, num_kv: int, elsize: int) -> int:
    """Bytes the channels-only streams move: the rotated channels of q and k, read and written."""
    return 2 * tokens * (num_q + num_kv) * spec.rotary_dim * elsize


def channels_calls(spec: RopeSpec, query: torch.Tensor, key: torch.Tensor | None) -> dict[str, Callable[[], None]]:
    """Each variant of the channels-only stream over these q [T, Hq * head_size] and k [T, Hk *
    head_size] (in place), by name."""
    d, rot = spec.head_size, spec.rotary_dim
    views = [x.view(x.shape[0], -1, d)[..., :rot] for x in (query, key) if x is not None and x.numel()]

    def mul_():
        for v in views:
            v.mul_(_SCALE)
    calls = {"mul_": mul_}
    q_rows = query.numel() // d
    k_rows = key.numel() // d if key is not None else 0
    k = key if key is not None and key.numel() else query
    for block_rows in CHANNEL_ROWS:
        grid = (cdiv(q_rows, block_rows) + cdiv(k_rows, block_rows),)
        calls[f"rows={block_rows}"] = (
            lambda g=grid, b=block_rows: _scale_rotated_channels[g](
                query, k, q_rows, k_rows, _SCALE, ROW=d, PREFIX=rot, PREFIX_P2=next_power_of_2(rot), BLOCK_ROWS=b))
    return calls


def gathering_calls(spec: RopeSpec, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                    cache: torch.Tensor) -> dict[str, Callable[[], None]]:
    """Each variant of the gathering stream over these inputs, as a rotation takes them (positions
    [T] or [num_dims, T], each in [0, cache rows), q [T, Hq * head_size], k [T, Hk * head_size] or
    None, the cos/sin cache [max_position, rotary_dim]), by name: q and k scaled in place by the
    gathered entries."""
    d, rot = spec.head_size, spec.rotary_dim
    tokens = query.shape[0]
    rows = 1 if positions.dim() == 1 else positions.shape[0]
    if rows != spec.num_dims or positions.shape[-1] != tokens or positions.stride(-1) != 1:
        raise ValueError(f"positions: shape {tuple(positions.shape)}, strides {positions.stride()}: must be "
                         f"[{tokens}] or [{spec.num_dims}, {tokens}] with contiguous rows")
    if cache.dim() != 2 or cache.shape[1] < rot or cache.stride(1) != 1:
        raise ValueError(f"cache: shape {tuple(cache.shape)}: must be [max_position, >= {rot}] with contiguous rows")
    if positions.numel() and not (0 <= int(positions.min()) and int(positions.max()) < cache.shape[0]):
        raise ValueError(f"positions: range [{int(positions.min())}, {int(positions.max())}]: must lie in "
                         f"[0, {cache.shape[0]}), the cache's rows")
    axes = axis_table(spec.axis_map(), query.device)
    num_q = query.shape[1] // d
    num_k = key.shape[1] // d if key is not None else 0
    k = key if key is not None and key.numel() else query
    row_stride = positions.stride(0) if positions.dim() == 2 else 0
    run = position_run(spec, cache.stride(0))
    calls = {}
    for block_t, block_h in GATHER_TILES:
        block_hk = min(block_h, next_power_of_2(max(1, num_k)))
        block_tk = block_t * block_h // block_hk
        grid = (cdiv(tokens, block_t) * cdiv(num_q, block_h) + cdiv(tokens, block_tk) * cdiv(num_k, block_hk),)
        calls[f"tile={block_t}x{block_h}"] = (
            lambda g=grid, bt=block_t, bh=block_h, btk=block_tk, bhk=block_hk: _gather_and_scale[g](
                query, k, positions, cache, axes, tokens, num_q, num_k, row_stride, cache.stride(0),
                ROW=d, ROT=rot, ROT_P2=next_power_of_2(rot), HALF=rot // 2, RUN=run,
                BLOCK_T=bt, BLOCK_H=bh, BLOCK_TK=btk, BLOCK_HK=bhk))
    return calls


def kernel_stream_calls(spec: RopeSpec, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                        cache: torch.Tensor) -> dict[str, Callable[[], None]]:
    """The rotation kernel's stream (rope.triton.rotary.stream_launch) over these inputs by name: at
    the rotation's plan (``kernel``), and with half and twice its tokens a program
    (``kernel,block_t=N``), q and k scaled in place."""
    calls = {"kernel": stream_launch(spec, positions, query, key, cache)}
    block_t = calls["kernel"].block_t
    for other in (block_t // 2, 2 * block_t):
        if other >= 1:
            calls[f"kernel,block_t={other}"] = stream_launch(spec, positions, query, key, cache, block_t=other)
    return calls


def same_bytes_calls(spec: RopeSpec, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     cache: torch.Tensor) -> dict[str, Callable[[], None]]:
    """Every variant of the streams that move a rotation's bytes in its pattern, by name: the kernel's
    (:func:`kernel_stream_calls`), then the gathering stream's (:func:`gathering_calls`)."""
    return kernel_stream_calls(spec, positions, query, key, cache) | gathering_calls(spec, positions, query, key, cache)


@dataclass(frozen=True)
class Floor:
    ms: float              # the floor under the contenders' graph / rotating timer: the fastest same-bytes variant
    how: str               # that timer's name and the fastest variant
    eager_ms: float        # the floor under the contenders' eager (flushed) timer
    eager_how: str         # the fastest variant there
    channels_ms: float     # the fastest channels-only variant (fewer bytes) under the graph / rotating timer
    channels_how: str      # ... and its name
    channels_eager_ms: float  # ... under the eager timer


def measure_floor(spec: RopeSpec, positions: torch.Tensor, num_q: int, num_kv: int, cache: torch.Tensor,
                  dtype: torch.dtype, sets: int, time_fn, eager_fn) -> Floor:
    """The row's floor: every variant of both kinds over ``sets`` fresh copies of the positions, q
    and k (as many as the contenders rotate through; the cache shared, as theirs is), timed by
    ``time_fn(calls, tokens) -> (ms, how)`` and by ``eager_fn(call) -> ms`` (the contenders' own
    timers).  The floor under each timer is the fastest same-bytes variant; the channels-only
    kind's fastest is kept beside it."""
    tokens, device = positions.shape[-1], positions.device
    width_q, width_k = num_q * spec.head_size, num_kv * spec.head_size
    inputs = [(positions.clone(), torch.randn(tokens, width_q, device=device, dtype=dtype),
               torch.randn(tokens, width_k, device=device, dtype=dtype) if num_kv else None) for _ in range(sets)]
    same = [same_bytes_calls(spec, p, q, k, cache) for p, q, k in inputs]
    per_set = [s | channels_calls(spec, q, k) for s, (_, q, k) in zip(same, inputs)]
    timed, eager = {}, {}
    for name in per_set[0]:
        calls = [variants[name] for variants in per_set]
        timed[name] = time_fn(calls, tokens)
        eager[name] = eager_fn(calls[0])
    floor = min(same[0], key=lambda name: timed[name][0])
    floor_eager = min(same[0], key=eager.get)
    channels = [name for name in per_set[0] if name not in same[0]]
    fastest = min(channels, key=lambda name: timed[name][0])
    return Floor(timed[floor][0], f"{timed[floor][1]}, {floor}", eager[floor_eager], floor_eager,
                 timed[fastest][0], fastest, min(eager[name] for name in channels))
