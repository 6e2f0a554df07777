"""The position step's check over a batch of steps, without pytest: every step called on the device
one after the other with no wait between them, the device waited for once, then each step's
positions held to the reference exactly, and a verdict per step.

A step's inputs are small (lists of ints), so they are carried to the device together: one
transfer per batch where one step at a time makes seven and waits for the device after its call.
The outputs come back in one copy too.  An error the device reports in the one wait cannot be told
to one step and is every unsettled step's raise.

What the one-step check (rope.harness.position_step.check) adds and this does not: the diagnosis of
a failure and its case file.  :func:`assert_batch_matches_reference` hands a batch's first step that
did not pass to the one-step check, which reports it in full (and Hypothesis shrinks the batch to
that step).
"""

from __future__ import annotations

import torch

import reference
from rope.devices import torch_device
from rope.harness import profiling
from rope.harness.deadline import call_timeout, deadline
from rope.harness.position_step.cases import OUT_SENTINEL, RaggedBatch
from rope.harness.position_step.check import POSITION_ARGUMENTS, assert_positions_match, record_positions_check
from rope.harness.position_step.diagnosis import wrong_positions
from rope.harness.stop import skip_if_stopped
from rope.harness.verdict import RAISED, Verdict, answered_two_ways, wait_for_calls

__all__ = ["assert_batch_matches_reference", "check_batch"]

def _carried(steps: list[RaggedBatch], device: str) -> list[tuple[dict, torch.Tensor]]:
    """Each step's arguments and its ``out`` (OUT_SENTINEL) on ``device``, every int32 input of the
    batch carried in one transfer and every ``out`` cut from one allocation (each its own tensor)."""
    dev = torch_device(device)
    host = [s.tensors("cpu") for s in steps]
    names = [n for n in POSITION_ARGUMENTS if n != "num_dims"]
    flat = torch.cat([h[n].reshape(-1) for h in host for n in names]).to(dev)
    out, start = [], 0
    for step, h in zip(steps, host):
        args = {"num_dims": step.num_dims}
        for n in names:
            size = h[n].numel()
            args[n] = flat[start:start + size].clone().reshape(h[n].shape)    # its own allocation
            start += size
        buffer = torch.full((step.num_dims, step.num_tokens + step.padding), OUT_SENTINEL, dtype=torch.int64,
                            device=dev)
        out.append((args, buffer))
    return out


def _call(fn, args: dict, out: torch.Tensor) -> str | None:
    """One step's call, positionally with ``out`` last and no wait; what it raised, if it did."""
    try:
        with deadline(call_timeout(), what=f"the position-step implementation {getattr(fn, '__name__', fn)!r}"), \
                profiling.call_phase():
            fn(*(args[name] for name in POSITION_ARGUMENTS), out)
    except Exception as exc:     # noqa: BLE001 - the implementation's failure is the finding
        return f"{RAISED} {type(exc).__name__}: {exc}"
    return None


def check_batch(impl_name: str, fn, steps, device: str) -> list[Verdict]:
    """A verdict per step, in order: passed (every token's positions exact and nothing written past
    the step), failed (with what is wrong) or raised."""
    steps = list(steps)
    if not steps:
        return []
    verdicts: list[Verdict | None] = [None] * len(steps)
    with profiling.phase("inputs"):
        carried = _carried(steps, device)
    for index, (step, (args, out)) in enumerate(zip(steps, carried)):
        skip_if_stopped()
        raised = _call(fn, args, out)
        if raised is not None:
            verdicts[index] = Verdict(step, "raised", float("inf"), raised)
    late = wait_for_calls(device, "the batch's position-step calls")
    if late is not None:
        return [v if v is not None else Verdict(s, "raised", float("inf"), late) for s, v in zip(steps, verdicts)]
    settled = [i for i, v in enumerate(verdicts) if v is None]
    outputs = torch.cat([carried[i][1].reshape(-1) for i in settled]).cpu().split(
        [carried[i][1].numel() for i in settled]) if settled else []
    for i, flat in zip(settled, outputs):
        step = steps[i]
        got = flat.reshape(step.num_dims, -1)
        n = step.num_tokens
        problems = [] if torch.all(got[:, n:] == OUT_SENTINEL) else [f"wrote columns past the step's {n} tokens"]
        with profiling.phase("reference"):
            wrong = wrong_positions(got[:, :n], reference.prepare_positions(**step.tensors("cpu")))
        problems = ([wrong] if wrong else []) + problems
        verdicts[i] = (Verdict(step, "passed", 0.0, elements=step.num_dims * n) if not problems else
                       Verdict(step, "failed", float("inf"), "; ".join(problems), step.num_dims * n))
    return verdicts


def assert_batch_matches_reference(impl_name: str, fn, steps, device: str) -> list[Verdict]:
    """:func:`check_batch` as a pytest outcome: every step passed, each recorded in the run report as
    the one-step check records it; the first step that did not pass goes to the one-step check, which
    fails with its diagnosis and case file.  Where that step alone matches, the implementation
    answered the same step two ways: an AssertionError says so."""
    verdicts = check_batch(impl_name, fn, steps, device)
    for verdict in verdicts:
        if verdict.passed:
            record_positions_check(impl_name, device, verdict.case.num_dims, verdict.case.num_tokens, None)
    for verdict in verdicts:
        if not verdict.passed:
            assert_positions_match(impl_name, fn, verdict.case, device)       # raises, reported in full
            raise answered_two_ways(impl_name, device, verdict, f"step {verdict.case.brief()}", verdict.case.num_tokens)
    return verdicts
