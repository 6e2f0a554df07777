"""The position step inside guard regions, and under the interpreter's memory tracer (the primitives:
rope.harness.guards): every int input a view into a sentinel-guarded allocation, ``out`` with guard
columns past the step, and the checks the suite's guarded property and the kernel mutants' searches
end in."""

from __future__ import annotations

import torch

from rope.devices import synchronize
from rope.harness.case_files import wrap
from rope.harness.guards import GUARDED, INT_SENTINEL, OUT_ROW_PAD, PLAIN, guard_tensor, trace_memory
from rope.harness.position_step.cases import OUT_SENTINEL, RaggedBatch
from rope.harness.position_step.check import assert_positions_match, call_positions, check_positions, positions_failure


_POSITION_INPUTS = ("prefill_positions", "prefill_delta", "idx_mapping", "query_start_loc", "prefill_lens",
                    "num_computed_tokens")


def guard_position_inputs(batch: RaggedBatch, device: str = "cpu"):
    """(kwargs, out, guards): every int input of a position-step call as a view into a
    guarded allocation (sentinel INT_SENTINEL: rows 8 elements apart for the table, 8 elements
    either side of the vectors), and ``out`` as the ``[num_dims, num_tokens + padding]`` view of an
    OUT_SENTINEL-filled allocation whose writable elements are the first ``num_tokens`` columns;
    the padding columns and OUT_ROW_PAD columns after every row are guard."""
    args = batch.tensors("cpu")
    guards, kwargs = [], {"num_dims": args["num_dims"]}
    for name in _POSITION_INPUTS:
        t = args[name]
        if t.dim() == 1:
            view, g = guard_tensor(name, t, fill=INT_SENTINEL, writable=False, device=device, lead=8, row_pad=8,
                                   rows_before=0, rows_after=0)
        else:
            view, g = guard_tensor(name, t, fill=INT_SENTINEL, writable=False, device=device)
        kwargs[name] = view
        guards.append(g)
    n = batch.num_tokens
    blank = torch.full((batch.num_dims, n + batch.padding), OUT_SENTINEL, dtype=torch.int64)
    out, g = guard_tensor("out", blank, fill=OUT_SENTINEL, writable=True, device=device, row_pad=OUT_ROW_PAD,
                          invalid_columns=((n, n + batch.padding),) if batch.padding else ())
    guards.append(g)
    return kwargs, out, guards


def run_positions_guarded(fn, batch: RaggedBatch, device: str = "cpu"):
    """Run a position-step implementation inside guards; returns (out [num_dims, num_tokens]
    on the CPU, violations)."""
    kwargs, out, guards = guard_position_inputs(batch, device)
    with trace_memory(guards if device == "cpu" else ()) as tracer:
        call_positions(fn, kwargs, out)
        synchronize(device)
    violations = []
    for g in guards:
        violations += g.modified()
    violations += tracer.messages()
    return out[:, :batch.num_tokens].cpu(), violations


def assert_positions_match_guarded(name: str, fn, batch: RaggedBatch, device: str = "cpu") -> None:
    out, violations = run_positions_guarded(fn, batch, device)
    problems = check_positions(name, device, batch.tensors("cpu"), out, [f"guard violation: {v}" for v in violations])
    if problems:
        raise positions_failure(f"{name} on {device} fails under guards", problems + wrap(f"batch: {batch}"),
                                tokens=batch.num_tokens, requests=len(batch.query_lens))


def check_plain_and_guarded(name: str, fn, batch: RaggedBatch) -> None:
    """The position property's check on a plain ``out`` inside the tracer (a spill past ``out`` is a
    wild write, suppressed), then on guarded inputs; the AssertionError holds every failure, each
    marked with the detector that saw it (PLAIN, GUARDED)."""
    failures = []
    with trace_memory() as tracer:
        try:
            assert_positions_match(name, fn, batch, "cpu")
        except AssertionError as exc:
            failures.append(f"{PLAIN} {exc}")
    failures += [f"{PLAIN} memory violation: {m}" for m in tracer.messages()]
    try:
        assert_positions_match_guarded(name, fn, batch, "cpu")
    except AssertionError as exc:
        failures.append(f"{GUARDED} {exc}")
    if failures:
        raise AssertionError("\n\n".join(failures))
