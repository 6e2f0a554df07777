"""Sequences of runner steps on one set of buffers (a case module of properties/position_step/):
each step drawn by the suite's ``ragged_batches``, then laid out on the buffers all of them share,
as a runner's persistent buffers hold every step alike (rope.harness.position_step.modes)."""

from __future__ import annotations

from hypothesis import strategies as st

from properties.position_step.known_steps import CHUNK_1, CHUNK_2, DECODE
from properties.strategies import RaggedBatch, ragged_batches

__all__ = ["CHUNKED_THEN_DECODE", "on_common_buffers", "request_state_sequences"]


def on_common_buffers(steps) -> list:
    """``steps`` laid out on the buffers they all fit: the most slots and prefill-table columns of
    any (unused slots and columns zero, never read), the most requests (a step with fewer gets
    zero-token requests on slots it does not use, as a runner pads a graph's batch) and the most
    output columns (a step's columns past its tokens are padding).  Each step's positions are the
    same as alone."""
    steps = list(steps)
    dims = steps[0].num_dims
    if any(s.num_dims != dims for s in steps):
        raise ValueError(f"steps: num_dims {[s.num_dims for s in steps]}: must be one")
    slots = max(len(s.prefill_lens) for s in steps)
    width = max(len(s.prefill_positions) // (len(s.prefill_lens) * dims) for s in steps)
    requests = max(1, *(len(s.idx_mapping) for s in steps))
    columns = max(s.num_tokens + s.padding for s in steps)
    return [_laid_out(s, slots, width, requests, columns) for s in steps]


def _laid_out(s: RaggedBatch, slots: int, width: int, requests: int, columns: int) -> RaggedBatch:
    dims, own = s.num_dims, len(s.prefill_lens)
    length = len(s.prefill_positions) // (own * dims)
    rows = [list(s.prefill_positions[i * length:(i + 1) * length]) + [0] * (width - length) for i in range(own * dims)]
    rows += [[0] * width] * ((slots - own) * dims)
    pad = lambda values: tuple(values) + (0,) * (slots - own)        # noqa: E731
    unused = [r for r in range(slots) if r not in s.idx_mapping][:requests - len(s.idx_mapping)]
    return RaggedBatch(dims, tuple(v for row in rows for v in row), pad(s.prefill_delta), pad(s.prefill_lens),
                       pad(s.num_computed_tokens), tuple(s.idx_mapping) + tuple(unused),
                       tuple(s.query_lens) + (0,) * len(unused), columns - s.num_tokens)


@st.composite
def request_state_sequences(draw, *, min_steps: int = 2, max_steps: int = 4):
    """2 to 4 steps (``min_steps`` to ``max_steps``) of one row count, each a ``ragged_batches`` step
    (new progress, chunk lengths, deltas and table per step), on their common buffers; shrinks to
    two steps of the simplest ragged batches."""
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"min_steps={min_steps}, max_steps={max_steps}: must satisfy 1 <= min_steps <= max_steps")
    dims = draw(st.sampled_from([3, 1, 4]), label="num_dims")
    count = draw(st.integers(min_steps, max_steps), label="steps")
    return on_common_buffers([draw(ragged_batches(num_dims=dims, max_reqs=4, max_model_len=32), label=f"step {i}")
                              for i in range(count)])


# vllm#10388 / #10403's request on one set of buffers: a 32-token chunk, the 8-token rest, then decode
# with the whole prompt's delta (fewer tokens each step: the later steps' columns past them are padding).
CHUNKED_THEN_DECODE = on_common_buffers([CHUNK_1, CHUNK_2, DECODE])
