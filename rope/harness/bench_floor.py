"""The floor of a rotation row in ``rope-harness bench``: the bytes a rotation moves in place, in
the pattern it moves them, by kernels that do nothing else, timed in the same run by the same timers
as the contenders.

A rotation reads and writes the first ``rotary_dim`` channels of every head row of q and k, where
they lie.  The 1 GiB device copy (``rope.harness.bench.copy_bandwidth``) measures the device's
bandwidth, not what such a stream reaches at a row's size: an in-place stream over head rows came
to 0.73-0.77 of the copy at 4,096 tokens on the interleaved models, an in-place ``mul_`` 0.89 on
Qwen2.5-VL-72B (H200, ``python -m lab.bench.inplace_ceiling``).  So each row gets its own floor,
the fastest of these streams under each timer:

- ``mul_``: torch's in-place multiply of q's and of k's rotated channels (``[T, H, rotary_dim]``
  views, strided where the rotation is partial): two launches;
- ``rows=R``: one Triton launch over the head rows of q, then of k, ``R`` rows per program, each
  row's rotated channels scaled in place.

The floor moves the rotated channels only: the cos/sin rows and the positions a rotation reads
besides (1-3% of its bytes at the benchmark's shapes) are not read, so the floor is, if anything,
below a stream of the rotation's exact bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from rope.spec import RopeSpec

__all__ = ["Floor", "STREAM_ROWS", "floor_bytes", "floor_calls", "measure_floor"]

STREAM_ROWS = (16, 32, 64)      # head rows per program of the Triton stream's variants
_SCALE = 1.0000001              # any factor: the stream's values are never read


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


def floor_bytes(spec: RopeSpec, tokens: int, num_q: int, num_kv: int, elsize: int) -> int:
    """Bytes the floor moves: the rotated channels of q and k, read and written."""
    return 2 * tokens * (num_q + num_kv) * spec.rotary_dim * elsize


def floor_calls(spec: RopeSpec, query: torch.Tensor, key: torch.Tensor | None) -> dict[str, Callable[[], None]]:
    """Each variant of the stream over these q [T, Hq * head_size] and k [T, Hk * head_size] (in
    place), by name."""
    d, rot = spec.head_size, spec.rotary_dim
    views = [x.view(x.shape[0], -1, d)[..., :rot] for x in (query, key) if x is not None and x.numel()]

    def mul_():
        for v in views:
            v.mul_(_SCALE)
    calls = {"mul_": mul_}
    q_rows = query.numel() // d
    k_rows = key.numel() // d if key is not None else 0
    k = key if key is not None and key.numel() else query
    for block_rows in STREAM_ROWS:
        grid = (triton.cdiv(q_rows, block_rows) + triton.cdiv(k_rows, block_rows),)
        calls[f"rows={block_rows}"] = (
            lambda g=grid, b=block_rows: _scale_rotated_channels[g](
                query, k, q_rows, k_rows, _SCALE, ROW=d, PREFIX=rot, PREFIX_P2=triton.next_power_of_2(rot), BLOCK_ROWS=b))
    return calls


@dataclass(frozen=True)
class Floor:
    ms: float              # under the contenders' graph / rotating timer
    how: str               # that timer's name and the fastest variant
    eager_ms: float        # under the contenders' eager (flushed) timer
    eager_how: str         # the fastest variant there


def measure_floor(spec: RopeSpec, tokens: int, num_q: int, num_kv: int, dtype: torch.dtype, device: torch.device,
                  sets: int, time_fn, eager_fn) -> Floor:
    """The row's floor: every variant over ``sets`` fresh copies of q and k (as many as the
    contenders rotate through), timed by ``time_fn(calls, tokens) -> (ms, how)`` and by
    ``eager_fn(call) -> ms`` (the contenders' own timers); the fastest variant under each."""
    width_q, width_k = num_q * spec.head_size, num_kv * spec.head_size
    inputs = [(torch.randn(tokens, width_q, device=device, dtype=dtype),
               torch.randn(tokens, width_k, device=device, dtype=dtype) if num_kv else None) for _ in range(sets)]
    per_set = [floor_calls(spec, q, k) for q, k in inputs]
    timed, eager = {}, {}
    for name in per_set[0]:
        calls = [variants[name] for variants in per_set]
        timed[name] = time_fn(calls, tokens)
        eager[name] = eager_fn(calls[0])
    best = min(timed, key=lambda name: timed[name][0])
    best_eager = min(eager, key=eager.get)
    return Floor(timed[best][0], f"{timed[best][1]}, {best}", eager[best_eager], best_eager)
