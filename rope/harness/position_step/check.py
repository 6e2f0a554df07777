"""The one check every position-step property ends in: call an implementation on a step (positionally,
``out`` last, under the call deadline) and hold its positions to the reference exactly.

:func:`assert_positions_match` runs a :class:`~rope.harness.position_step.cases.RaggedBatch` on a
device and raises an AssertionError tagged with its cause (rope.harness.causes) when the positions
differ or the implementation wrote past the step; every check goes into the run report (a campaign
counts it).  The guarded variant is rope.harness.position_step.guards."""

from __future__ import annotations

import torch

import reference
from rope.devices import synchronize, torch_device
from rope.harness import causes, profiling, report
from rope.harness.case_files import wrap
from rope.harness.deadline import call_timeout, deadline
from rope.harness.draws import current_test, hypothesis_example
from rope.harness.placement import device_label
from rope.harness.position_step.cases import OUT_SENTINEL, RaggedBatch
from rope.harness.position_step.diagnosis import cause, wrong_positions

# The position step's arguments in their documented order (docs/implementations.md): an
# implementation is called positionally, so its parameter names are its own business.
POSITION_ARGUMENTS = ("prefill_positions", "prefill_delta", "idx_mapping", "query_start_loc", "prefill_lens",
                      "num_computed_tokens", "num_dims")


def call_positions(fn, args: dict, out) -> None:
    """Call a position-step implementation the documented way: positionally, ``out`` last, under
    the call deadline (rope.harness.deadline: a hang fails the test with ImplementationHung)."""
    with deadline(call_timeout(), what=f"the position-step implementation {getattr(fn, '__name__', fn)!r}"), \
            profiling.call_phase():
        fn(*(args[name] for name in POSITION_ARGUMENTS), out)
        synchronize(str(out.device.type) if isinstance(out, torch.Tensor) else "cpu")


def run_positions(fn, batch: RaggedBatch, device: str) -> torch.Tensor:
    """The step's output on the CPU: ``[num_dims, num_tokens + padding]``, the padding columns as the
    implementation left them (OUT_SENTINEL where it wrote nothing)."""
    args = batch.tensors(device)
    out = torch.full((batch.num_dims, batch.num_tokens + batch.padding), OUT_SENTINEL,
                     dtype=torch.int64, device=torch_device(device))
    call_positions(fn, args, out)
    synchronize(device)
    return out.cpu()


def assert_positions_match(name: str, fn, batch: RaggedBatch, device: str) -> None:
    """Hold ``fn`` to the reference on ``batch``: the positions of every token, and nothing written
    past the step's tokens; raises :func:`positions_failure` on a difference."""
    out = run_positions(fn, batch, device)
    n = batch.num_tokens
    past = [] if torch.all(out[:, n:] == OUT_SENTINEL) else [f"wrote columns past the step's {n} tokens"]
    problems = check_positions(name, device, batch.tensors("cpu"), out[:, :n], past)
    if problems:
        raise positions_failure(f"{name} on {device}: the step's positions are wrong", problems, tokens=n,
                                requests=len(batch.query_lens), written=(name, fn, batch, device))


def check_positions(impl_name: str, device: str, args: dict, out: torch.Tensor, more_problems=()) -> list[str]:
    """What is wrong with a position step: ``out`` [num_dims, num_tokens] (on the CPU) against the
    reference on ``args`` (the step's CPU inputs), then ``more_problems`` the caller found (guard
    violations, writes past the step).  The check goes into the run report (a campaign counts it)."""
    with profiling.phase("reference"):
        expected = reference.prepare_positions(**args)
    wrong = wrong_positions(out, expected)
    problems = ([wrong] if wrong else []) + list(more_problems)
    record_positions_check(impl_name, device, args["num_dims"], out.shape[-1], "; ".join(problems) or None)
    return problems


def positions_failure(header: str, problems: list[str], *, tokens: int, requests: int,
                      written: tuple | None = None) -> AssertionError:
    """The AssertionError of a position step that failed its check: the header, then each problem
    on lines of its own (wrapped short), tagged with its cause for the run's grouping
    (rope.harness.position_step.diagnosis.cause).  ``written``: (name, fn, batch, device) of a step
    whose case file is written once Hypothesis has shrunk it (rope.harness.position_step.case_file)."""
    lines = [header] + [piece for p in problems for piece in wrap(p)]
    failure = {"cause": cause(problems), "headline": causes.clip(problems[0]), "size": tokens,
               "case": f"{tokens} tokens, {requests} request{'s' if requests != 1 else ''}"}
    if written is not None:
        final, hypothesis = hypothesis_example()
        if final:       # the case file and its replay command go to the failure's block (a path may be long)
            note = _write_case(*written, problems, failure, hypothesis)
            lines += [piece for line in note for piece in wrap(line)]
    return causes.tag(AssertionError("\n".join(lines)), **failure)


def _write_case(name: str, fn, batch: RaggedBatch, device: str, problems: list[str], failure: dict,
                hypothesis) -> list[str]:
    """The step's case file (rope.harness.position_step.case_file.write_step_case)."""
    from rope.harness.position_step.case_file import write_step_case
    return write_step_case(name, fn, batch, device, problems, failure, hypothesis)


def record_positions_check(impl_name: str, device: str, num_dims: int, num_tokens: int, wrong: str | None) -> None:
    """A position step's check in the run report: never lets reporting break it."""
    try:
        with profiling.phase("record"):
            report.record_exact_check(test=current_test(), impl=impl_name, device=device_label(device),
                                      what=f"positions-{num_dims}rows", ok=not wrong, elements=num_dims * num_tokens,
                                      problem=wrong, tokens=num_tokens)
    except Exception:   # noqa: BLE001 - the report is best effort, the assertion is not
        pass
