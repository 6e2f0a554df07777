"""The Triton position step (docs/spec.md §5): programs (b, s) for request b of the step, split s.

Program (b, s) reads its request slot r = idx_mapping[b] and writes the columns
[query_start_loc[b], query_start_loc[b+1]) of every row of ``out``, nothing else: the blocks
s, s + splits, s + 2 * splits, ... of BLOCK tokens of that range.

Why splits: the step's lengths live on the device (the grid must be sized without a host sync),
and one program per request walked a 4096-token prefill chunk in 16 dependent load -> store
rounds on one SM (23 us for 16 such chunks on an H200: docs/launch-defaults.md, TARGET_PROGRAMS).
The host sizes the split from what it knows, the request count and the output's capacity;
programs whose blocks start past their request's length exit after the request's scalars.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from rope.spec import check_position_inputs
from rope.devices import device_name, triton_runs_on
from rope.runner_positions import check_out
from rope.triton.checked import CheckedCalls
from rope.triton.grid import cdiv, next_power_of_2
from rope.triton.launcher import launch
from rope.triton.pdl import HAS_PDL
from rope.triton.targets import launch_target

if HAS_PDL:     # programmatic dependent launch: rope/triton/pdl.py
    from rope.triton.pdl import gdc_launch_dependents, gdc_wait

__all__ = ["BLOCK", "TARGET_PROGRAMS", "default_splits", "launch_prepare_positions", "prepare_positions_triton"]

BLOCK = 256
TARGET_PROGRAMS = 1024      # about 8 programs per SM of an H200: enough blocks in flight to hide latency


@triton.jit(do_not_specialize=["prefill_row_stride", "out_row_stride", "max_reqs", "max_len", "out_cols"])
def _prepare_positions_kernel(
    out_ptr, out_row_stride, prefill_ptr, prefill_row_stride, delta_ptr, idx_mapping_ptr,
    query_start_loc_ptr, prefill_lens_ptr, num_computed_ptr, max_reqs, max_len, out_cols,
    NUM_DIMS: tl.constexpr, DIMS_P2: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # PDL: wait for the previous kernel (it may have written the step's inputs) before any read,
    # then let the next one (the rotation, which reads ``out``, waits in turn) launch at once.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    # (1) The request's range of the step and its slot (loaded together: one round trip), then
    #     the slot's progress: prefill while nc < prefill_len (decided per request, not per token).
    qs = tl.load(query_start_loc_ptr + b).to(tl.int64)
    ql = tl.load(query_start_loc_ptr + b + 1).to(tl.int64) - qs
    r = tl.load(idx_mapping_ptr + b).to(tl.int64)
    # On a GPU the public entry does not read the step's values (a host sync; rope.spec.checks_values),
    # so the kernel stays in bounds whatever they are: a slot outside [0, max_reqs) writes nothing,
    # reads stay inside the prefill table's max_len columns, stores inside out's out_cols columns.
    if (split * BLOCK < ql) & (r >= 0) & (r < max_reqs):
        nc = tl.load(num_computed_ptr + r).to(tl.int64)
        is_prefill = nc < tl.load(prefill_lens_ptr + r)
        delta = tl.load(delta_ptr + r).to(tl.int64)
        # (2) A [DIMS_P2, BLOCK] tile: row d of the output, token i of the query (absolute index
        #     nc + i; rows of slot r start at NUM_DIMS * r).  All rows load before any store.
        d = tl.arange(0, DIMS_P2)[:, None]
        dims_ok = d < NUM_DIMS
        for start in range(split * BLOCK, ql, splits * BLOCK):
            i = start + tl.arange(0, BLOCK)[None, :]
            valid = dims_ok & (i < ql) & (qs + i >= 0) & (qs + i < out_cols)
            column = nc + i
            if is_prefill:
                row = prefill_ptr + (NUM_DIMS * r + d) * prefill_row_stride
                in_table = valid & (column >= 0) & (column < max_len)
                pos = tl.load(row + column, mask=in_table, other=0).to(tl.int64)
            else:
                pos = column + delta + tl.zeros([DIMS_P2, BLOCK], dtype=tl.int64)
            tl.store(out_ptr + d * out_row_stride + qs + i, pos, mask=valid)


def prepare_positions_triton(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                             num_computed_tokens, num_dims, out) -> None:
    """Write out[:, :num_tokens] with the Triton kernel."""
    vectors = (prefill_delta, idx_mapping, query_start_loc, prefill_lens, num_computed_tokens)
    if _check_inputs(prefill_positions, *vectors, num_dims, out):
        # The kernel indexes the 1-D inputs with unit stride: strided views are copied, never misread.
        vectors = tuple(t.contiguous() for t in vectors)
    launch_prepare_positions(prefill_positions, *vectors, num_dims, out)


# Calls whose metadata passed the checks where the values are not read (a GPU without
# ROPE_CHECK_VALUES=1; rope/triton/checked.py), each with whether a 1-D input is strided.  Where
# the values are checked (the CPU) every call is checked whole: it reads them anyway.
_CHECKED = CheckedCalls()


def _check_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                  num_computed_tokens, num_dims, out) -> bool:
    """The step's checks, the metadata's once per signature; returns whether a 1-D input must be
    copied to unit stride."""
    tensors = (prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens, num_computed_tokens, out)
    signature = CheckedCalls.signature((num_dims,), tensors, values_read_from=idx_mapping)
    strided = _CHECKED.get(signature)
    if strided is not None:
        return strided
    num_tokens = check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                       prefill_lens, num_computed_tokens, num_dims)
    check_out(out, num_dims, num_tokens, prefill_positions.device)
    device = device_name(out.device)
    if not triton_runs_on(device):
        raise ValueError(f"out.device={out.device}: Triton needs a GPU tensor here, or TRITON_INTERPRET=1")
    for name, t in (("prefill_positions", prefill_positions), ("out", out)):
        if t.stride(1) != 1:
            raise ValueError(f"{name}.stride={t.stride()}: the last dim must be contiguous")
    strided = any(t.stride(0) != 1 for t in tensors[1:6])
    _CHECKED.add(signature, strided)   # only metadata was checked (else no signature): the same passes again
    return strided


def default_splits(num_reqs: int, capacity: int, block: int = BLOCK, target: int = TARGET_PROGRAMS) -> int:
    """Programs per request: ``target`` in all, but no more than the blocks of the longest
    request could need (the output's ``capacity`` columns bound every request's length)."""
    return max(1, min(cdiv(target, max(num_reqs, 1)), cdiv(capacity, block)))


def launch_prepare_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                             num_computed_tokens, num_dims, out, *, block: int = BLOCK,
                             splits: int | None = None, pdl: bool = True) -> None:
    """The launch alone (no checks: the benchmark's hot path).  ``block`` and ``splits`` change
    which program writes which column, never what is written (tests/kernels/test_launch_options.py);
    ``pdl``: programmatic dependent launch where available (rope/triton/pdl.py)."""
    num_reqs = idx_mapping.shape[0]
    if num_reqs == 0:
        return
    if splits is None:
        splits = default_splits(num_reqs, out.shape[1], block)
    pdl = bool(pdl) and launch_target(out.device).pdl
    launch(_prepare_positions_kernel, (num_reqs, splits, 1), (
        out, out.stride(0), prefill_positions, prefill_positions.stride(0), prefill_delta, idx_mapping,
        query_start_loc, prefill_lens, num_computed_tokens,
        prefill_positions.shape[0] // num_dims, prefill_positions.shape[1], out.shape[1],
    ), _constexprs(num_dims, block, pdl), (num_dims, block, pdl))


@functools.lru_cache(maxsize=64)
def _constexprs(num_dims: int, block: int, pdl: bool) -> dict:
    """The step's constexprs and compile options (read, never modified, by the launch)."""
    return dict(NUM_DIMS=num_dims, DIMS_P2=next_power_of_2(num_dims), BLOCK=block, PDL=pdl,
                **({"launch_pdl": True} if pdl else {}))


prepare_positions_triton.supports = lambda device: triton_runs_on(device)
prepare_positions_triton.unchecked = launch_prepare_positions   # hot path for the benchmark
