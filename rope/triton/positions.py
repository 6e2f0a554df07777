"""Triton position preparation (SPEC §5): one program per request of the step.

Program b reads its request slot r = idx_mapping[b] and writes the columns
[query_start_loc[b], query_start_loc[b+1]) of every row of ``out``, nothing else.
"""

from __future__ import annotations

import triton
import triton.language as tl

from reference.runner import check_position_inputs
from rope.devices import device_name, triton_runs_on
from rope.positions import check_out

BLOCK = 256


@triton.jit(do_not_specialize=["prefill_row_stride", "out_row_stride"])
def _prepare_positions_kernel(
    out_ptr, out_row_stride, prefill_ptr, prefill_row_stride, delta_ptr, idx_mapping_ptr,
    query_start_loc_ptr, prefill_lens_ptr, num_computed_ptr,
    NUM_DIMS: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    # (1) The request slot and its progress: prefill while nc < prefill_len (per request).
    r = tl.load(idx_mapping_ptr + b).to(tl.int64)
    nc = tl.load(num_computed_ptr + r).to(tl.int64)
    is_prefill = nc < tl.load(prefill_lens_ptr + r)
    delta = tl.load(delta_ptr + r).to(tl.int64)
    qs = tl.load(query_start_loc_ptr + b).to(tl.int64)
    ql = tl.load(query_start_loc_ptr + b + 1).to(tl.int64) - qs
    # (2) Token i of the query is absolute index nc + i; rows of slot r start at NUM_DIMS * r.
    for start in range(0, ql, BLOCK):
        i = start + tl.arange(0, BLOCK)
        valid = i < ql
        column = nc + i
        for d in tl.static_range(NUM_DIMS):
            if is_prefill:
                row = prefill_ptr + (NUM_DIMS * r + d) * prefill_row_stride
                pos = tl.load(row + column, mask=valid, other=0).to(tl.int64)
            else:
                pos = column + delta
            tl.store(out_ptr + d * out_row_stride + qs + i, pos, mask=valid)


def prepare_positions_triton(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                             num_computed_tokens, num_dims, out) -> None:
    """Write out[:, :num_tokens] with the Triton kernel (grid: one program per request)."""
    num_tokens = check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                       prefill_lens, num_computed_tokens, num_dims)
    check_out(out, num_dims, num_tokens, prefill_positions.device)
    device = device_name(out.device)
    if not triton_runs_on(device):
        raise ValueError(f"out.device={out.device}: Triton needs a GPU tensor here, or TRITON_INTERPRET=1")
    for name, t in (("prefill_positions", prefill_positions), ("out", out)):
        if t.stride(1) != 1:
            raise ValueError(f"{name}.stride={t.stride()}: the last dim must be contiguous")
    # The kernel indexes the 1-D inputs with unit stride: strided views are copied, never misread.
    vectors = [t.contiguous() for t in (prefill_delta, idx_mapping, query_start_loc, prefill_lens, num_computed_tokens)]
    launch_prepare_positions(prefill_positions, vectors[0], vectors[1], vectors[2], vectors[3], vectors[4], num_dims, out)


def launch_prepare_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                             num_computed_tokens, num_dims, out) -> None:
    num_reqs = idx_mapping.shape[0]
    if num_reqs == 0:
        return
    _prepare_positions_kernel[(num_reqs,)](
        out, out.stride(0), prefill_positions, prefill_positions.stride(0), prefill_delta, idx_mapping,
        query_start_loc, prefill_lens, num_computed_tokens, NUM_DIMS=num_dims, BLOCK=BLOCK,
    )


prepare_positions_triton.supports = lambda device: triton_runs_on(device)
prepare_positions_triton.unchecked = launch_prepare_positions   # hot path for the benchmark
