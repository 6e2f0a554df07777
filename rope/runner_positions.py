"""The "native" position step: the runner step (docs/spec.md §5) in vectorized torch ops."""

from __future__ import annotations

import torch

from rope.spec import check_position_inputs


def prepare_positions_native(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                             num_computed_tokens, num_dims, out) -> None:
    """Write out[:, :num_tokens]; columns past the step's tokens are left alone."""
    num_tokens = check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                       prefill_lens, num_computed_tokens, num_dims, check_values=True)
    check_out(out, num_dims, num_tokens, prefill_positions.device)
    if num_tokens:
        _write_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                         num_computed_tokens, num_dims, out, num_tokens)


def launch_positions_native(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                            num_computed_tokens, num_dims, out) -> None:
    """The same ops without the checks and without a host sync (the step's length stays on the
    device: every column of ``out`` is computed, those past it keep their values), so that a CUDA
    graph can capture it: the benchmark's eager baseline, which must not be timed on validation."""
    if idx_mapping.shape[0]:
        _write_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                         num_computed_tokens, num_dims, out, None)


def _write_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                     num_computed_tokens, num_dims, out, num_tokens) -> None:
    dev = prefill_positions.device
    columns = out.shape[1] if num_tokens is None else num_tokens
    token = torch.arange(columns, device=dev)
    starts = query_start_loc.long()
    batch = torch.searchsorted(starts[1:], token, right=True)       # slot b of each token
    batch = batch.clamp_(max=idx_mapping.shape[0] - 1)               # (columns past the step)
    offset = token - starts[batch]                                   # i within the request's query
    req = idx_mapping.long()[batch]                                  # r
    computed = num_computed_tokens.long()[req]                       # nc
    is_prefill = computed < prefill_lens.long()[req]
    column = computed + offset                                       # absolute index nc + i
    decode = column + prefill_delta.long()[req]
    in_step = token < starts[-1]
    safe_column = torch.where(is_prefill & in_step, column, torch.zeros_like(column))
    for d in range(num_dims):
        prefill = prefill_positions[num_dims * req + d, safe_column].long()
        value = torch.where(is_prefill, prefill, decode)
        out[d, :columns] = value if num_tokens is not None else torch.where(in_step, value, out[d, :columns])


prepare_positions_native.unchecked = launch_positions_native   # hot path for the benchmark
# It reads the step's values on the host (its checks, the step's length): a CUDA graph cannot capture it.
prepare_positions_native.modes = ("eager", "compile")


def check_out(out, num_dims: int, num_tokens: int | None, device) -> None:
    """``out`` must be int64 [num_dims, >= num_tokens] on ``device`` (num_tokens None: not known
    without reading the step's values; the kernel then masks its stores to out's columns)."""
    if not isinstance(out, torch.Tensor) or out.dtype != torch.int64:
        raise ValueError(f"out: must be an int64 tensor (got {getattr(out, 'dtype', type(out))})")
    if out.dim() != 2 or out.shape[0] != num_dims or out.shape[1] < (num_tokens or 0):
        raise ValueError(f"out.shape={tuple(out.shape)}: must be [num_dims={num_dims}, >= num_tokens={num_tokens}]")
    if out.device != device:
        raise ValueError(f"out.device={out.device}: must equal prefill_positions.device={device}")
