"""Broken position-step implementations: the runner bugs this field has shipped
(docs/spec.md §7.5, vllm#10388, #10403), each a one-line deviation from the reference loop; and
one right on every fresh call that keeps a step's state for the next (STEP_MODE_MUTANTS)."""

from __future__ import annotations

import weakref

import torch

from rope.devices import triton_runs_on
from rope.spec import check_position_inputs
from rope.runner_positions import check_out


def _prepare(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens, num_computed_tokens,
             num_dims, out, *, bug: str) -> None:
    n = check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                              num_computed_tokens, num_dims)
    check_out(out, num_dims, n, prefill_positions.device)
    table = prefill_positions.tolist()
    qsl, lens, computed = query_start_loc.tolist(), prefill_lens.tolist(), num_computed_tokens.tolist()
    for b, r in enumerate(idx_mapping.tolist()):
        if bug == "slot_mapping_ignored":
            r = b if b < len(lens) else r
        qs, ql, nc = qsl[b], qsl[b + 1] - qsl[b], computed[r]
        if bug == "query_start_off_by_one":
            qs += 1
        is_prefill = nc < lens[r]
        delta = int(prefill_delta[r])
        if bug == "delta_in_16_bits":
            # The delta kept in a 16-bit slot: exact to +-32767, wrapped past it (an hour of video
            # at Qwen2.5-VL's rates gives deltas near -2^20).
            delta = (delta + (1 << 15)) % (1 << 16) - (1 << 15)
        for i in range(ql):
            col = qs + i
            if col >= out.shape[1]:
                continue
            for d in range(num_dims):
                if is_prefill:
                    src = i if bug == "prefill_reads_at_i" else nc + i
                    row = table[num_dims * r + d]
                    # The wrong slot's progress can point past its row: garbage, as a kernel would read.
                    value = row[src] if src < len(row) else -1
                    if bug == "delta_in_prefill":
                        value += delta
                else:
                    value = nc + i + (0 if bug == "delta_missing_in_decode" else delta)
                out[d, col] = value
        if bug == "delta_per_chunk" and is_prefill and ql:
            # Recomputes the request's delta from this chunk alone and stores it for decode.
            chunk = [table[num_dims * r + d][nc + i] for d in range(num_dims) for i in range(ql)]
            prefill_delta[r] = max(chunk) + 1 - ql


def _mutant(bug):
    def fn(*args, **kwargs):
        _prepare(*args, **kwargs, bug=bug)
    fn.__name__ = bug
    return fn


BUGS = ("prefill_reads_at_i", "delta_per_chunk", "delta_in_prefill", "delta_missing_in_decode",
        "slot_mapping_ignored", "query_start_off_by_one", "delta_in_16_bits")
BROKEN_POSITIONS = {bug: _mutant(bug) for bug in BUGS}
prefill_reads_at_i, delta_per_chunk, delta_in_prefill, delta_missing_in_decode, slot_mapping_ignored, \
    query_start_off_by_one, delta_in_16_bits = (BROKEN_POSITIONS[b] for b in BUGS)


def correct_loop(*args, **kwargs):
    """The same loop without a bug (checks that the mutants differ only by their bug)."""
    _prepare(*args, **kwargs, bug="none")


# The loop reads the step's values on the host (tolist): a CUDA graph cannot capture it.
for _fn in (*BROKEN_POSITIONS.values(), correct_loop):
    _fn.modes = ("eager",)

# id of a live query_start_loc buffer -> its first call's state (dropped with the buffer: a later
# tensor at the same address is a fresh buffer).  Keyed by id: a WeakKeyDictionary compares tensors with ==.
_FIRST_STATE: dict = {}


def request_state_cached_per_buffer(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                                    num_computed_tokens, num_dims, out) -> None:
    """Copies query_start_loc and num_computed_tokens on its first call on a query_start_loc buffer
    and reads the copies on every later call on it: a runner that refills its persistent buffers
    each step (or replays a CUDA graph captured on them) gets the first step's chunk bounds and
    progress again (a host-side value baked into a graph, candle#3728, vllm#33800).

    Right on fresh tensors, as every one-step property calls it; the Triton entry underneath, a
    capturable kernel, so that a graph replays the stale copies instead of failing to capture."""
    from rope.triton.positions import prepare_positions_triton
    key = id(query_start_loc)
    if key not in _FIRST_STATE:
        _FIRST_STATE[key] = (query_start_loc.clone(), num_computed_tokens.clone())
        weakref.finalize(query_start_loc, _FIRST_STATE.pop, key, None)
    query_start_loc, num_computed_tokens = _FIRST_STATE[key]
    prepare_positions_triton(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                             num_computed_tokens, num_dims, out)


request_state_cached_per_buffer.supports = triton_runs_on     # where the Triton entry underneath runs
# Mutants no single call on fresh tensors shows, and the property of
# properties/position_step/test_step_modes.py that catches each on any device, under its mode's cause
# label (rope.harness.position_step.modes.MODE_LABELS); on a GPU
# test_graph_replays_match_reference_of_their_own_inputs catches request_state_cached_per_buffer too.
STEP_MODE_MUTANTS = {"request_state_cached_per_buffer": request_state_cached_per_buffer}
MODE_ONLY = {"request_state_cached_per_buffer": "test_steps_on_reused_buffers_match_reference"}
