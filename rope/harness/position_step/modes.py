"""The position step as a model runner calls it: step after step on the same persistent buffers,
refilled in place, eagerly or captured once in a CUDA (HIP) graph and replayed (docs/spec.md §5).

vLLM's model runner keeps its step inputs (the prefill table, query_start_loc, the slots' computed
tokens and M-RoPE deltas, ``out``) in buffers allocated once, copies each step's values into them
and replays a graph captured on them.  An implementation that keeps a value of an earlier call (a
tensor read to a Python int, a copy cached per buffer) passes every check on fresh tensors and
gives the first step's positions again on the next one: the position step's twin of the rotation's
host-side offset baked into a graph (candle#3728) and its buffer left behind by a warm-up
(vllm#33800).

A sequence of steps (:class:`~rope.harness.position_step.cases.RaggedBatch`, each with the same
shapes: :func:`check_same_buffers`) runs on one set of buffers (:class:`StepBuffers`); each step is
held to the reference of its own inputs, and nothing may be written past its tokens (``out`` is
refilled with OUT_SENTINEL before each).  :func:`assert_steps_match` is what a property ends in.
Free of pytest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rope.devices import synchronize, torch_device
from rope.harness import causes
from rope.harness.case_files import wrap
from rope.harness.modes import GraphCaptureFailed, capture_graph
from rope.harness.position_step.case_file import write_sequence_case
from rope.harness.position_step.cases import (BUFFER_SHAPE_FIELDS, OUT_SENTINEL, STALE_LABELS, STEP_MODES,
                                             RaggedBatch, buffer_shape)
from rope.harness.position_step.check import (POSITION_ARGUMENTS, assert_positions_match, call_positions,
                                              check_positions)

__all__ = ["MODE_LABELS", "STEP_MODES", "StaleStep", "StepBuffers", "assert_steps_match", "check_same_buffers",
           "run_steps", "stale_step"]

# The causes a failure of a step sequence is grouped under (beside the slice's own LABELS, which a
# step that is wrong on fresh buffers too gets): a step on refilled buffers that does not follow
# their new values, eagerly or in a graph replay (cases.STALE_LABELS); a call that declares the graph
# mode and cannot be captured.
MODE_LABELS = {**STALE_LABELS, "capture": "graph_capture_failed"}
_VECTORS = ("prefill_positions", "prefill_delta", "idx_mapping", "query_start_loc", "prefill_lens",
            "num_computed_tokens")


def check_same_buffers(batches) -> None:
    """ValueError naming the field unless ``batches`` are 1 or more steps a runner's buffers hold
    alike: the same rows, slots, prefill-table length, request count and output columns."""
    batches = list(batches)
    if not batches or not all(isinstance(b, RaggedBatch) for b in batches):
        raise ValueError(f"batches: must be one or more RaggedBatch steps (got {len(batches)} items)")
    shapes = [buffer_shape(b) for b in batches]
    for i, field in enumerate(BUFFER_SHAPE_FIELDS):
        sizes = [shape[i] for shape in shapes]
        if len(set(sizes)) > 1:
            raise ValueError(f"batches' {field}: {sizes}: every step on one set of buffers must have the same")


class StepBuffers:
    """A runner's persistent buffers on ``device``, shaped by ``first``: :meth:`fill` copies a step's
    values into them in place (and OUT_SENTINEL into ``out``), :meth:`call` calls an implementation on
    them, positionally, ``out`` last."""

    def __init__(self, first: RaggedBatch, device: str):
        self.args = {k: v.to(torch_device(device)) if isinstance(v, torch.Tensor) else v
                     for k, v in first.tensors("cpu").items()}
        self.out = torch.full((first.num_dims, first.num_tokens + first.padding), OUT_SENTINEL, dtype=torch.int64,
                              device=torch_device(device))

    def fill(self, batch: RaggedBatch) -> None:
        values = batch.tensors("cpu")
        for name in _VECTORS:
            self.args[name].copy_(values[name])
        self.out.fill_(OUT_SENTINEL)

    def call(self, fn) -> None:
        fn(*(self.args[name] for name in POSITION_ARGUMENTS), self.out)


def run_steps(fn, batches, device: str, mode: str = "eager", warmups: int = 2) -> list[torch.Tensor]:
    """Each step's ``out`` on the CPU, ``[num_dims, num_tokens + padding]``, the steps run in order on
    one set of buffers: ``"eager"``, each a call (under the call deadline); ``"graph"``, one call
    captured after ``warmups`` eager calls on the first step, then a replay per step.  Raises
    GraphCaptureFailed when the call cannot be captured."""
    if mode not in STEP_MODES:
        raise ValueError(f"mode={mode!r}: must be one of {STEP_MODES}")
    batches = list(batches)
    check_same_buffers(batches)
    buffers = StepBuffers(batches[0], device)
    outs = []
    if mode == "eager":
        for batch in batches:
            buffers.fill(batch)
            call_positions(fn, buffers.args, buffers.out)
            outs.append(buffers.out.cpu().clone())
        return outs
    graph, _ = capture_graph(lambda: buffers.call(fn), lambda: buffers.fill(batches[0]), device, warmups)
    for batch in batches:
        buffers.fill(batch)
        graph.replay()
        synchronize(device)
        outs.append(buffers.out.cpu().clone())
    return outs


@dataclass
class StaleStep:
    """The first step of a sequence whose positions are not the reference of its own inputs."""
    index: int
    steps: int
    batch: RaggedBatch
    problems: list

    def sentence(self, mode: str) -> str:
        how = "graph replay" if mode == "graph" else "step"
        return (f"{how} {self.index + 1} of {self.steps} on the same buffers does not match the reference "
                f"of its own inputs")


def stale_step(name: str, fn, batches, device: str, mode: str = "eager") -> StaleStep | None:
    """Run ``batches`` on one set of buffers (:func:`run_steps`) and hold each step to the reference
    of its own inputs (each check goes into the run report): the first that fails, or None."""
    batches = list(batches)
    for i, (batch, out) in enumerate(zip(batches, run_steps(fn, batches, device, mode))):
        n = batch.num_tokens
        past = [] if torch.all(out[:, n:] == OUT_SENTINEL) else [f"wrote columns past the step's {n} tokens"]
        problems = check_positions(name, device, batch.tensors("cpu"), out[:, :n], past)
        if problems:
            return StaleStep(i, len(batches), batch, problems)
    return None


def assert_steps_match(name: str, fn, batches, device: str, mode: str = "eager") -> None:
    """Hold ``fn`` to the reference on every step of ``batches``, run on one set of buffers.  A step
    that is wrong called alone on fresh buffers fails as the one-step check does (its cause, its
    case file); one right alone fails under the mode's stale label (MODE_LABELS), with the steps
    summarized and a case file of the whole sequence and its mode (its path and replay command in
    the failure's block: rope.harness.position_step.case_file); a capture that raises under
    ``graph_capture_failed``."""
    batches = list(batches)
    brief = f"{len(batches)} steps of {batches[0].brief()}" if batches else "no steps"
    try:
        stale = stale_step(name, fn, batches, device, mode)
    except GraphCaptureFailed as exc:
        lines = [f"{name} on {device} declares the graph mode and cannot be captured in a CUDA graph", *wrap(str(exc)),
                 "(declare modes without 'graph' if it is not meant to be captured)"]
        raise causes.tag(AssertionError("\n".join(lines)), cause=MODE_LABELS["capture"], headline=causes.clip(str(exc)),
                         size=batches[0].num_tokens, case=brief) from None
    if stale is None:
        return
    batch = stale.batch
    assert_positions_match(name, fn, batch, device)     # wrong alone too: the one-step failure, its case file
    fresh = "called alone on fresh buffers" if mode == "eager" else "called eagerly on fresh buffers"
    lines = [f"{name} on {device}: {stale.sentence(mode)}",
             *[piece for p in stale.problems for piece in wrap(p)],
             *wrap(f"the same step is right {fresh}: a value of an earlier "
                   f"{'step' if mode == 'eager' else 'step or of the capture'} was kept (read on the host, or "
                   f"cached per buffer)"),
             *[piece for k, b in enumerate(batches) for piece in wrap(_step_line(k, b))]]
    failure = {"cause": MODE_LABELS[mode], "headline": causes.clip(stale.problems[0]), "size": batch.num_tokens,
               "case": brief}
    lines += [piece for line in write_sequence_case(name, fn, batches, batch, device, mode,
                                                          [stale.sentence(mode), *stale.problems], failure)
              for piece in wrap(line)]
    raise causes.tag(AssertionError("\n".join(lines)), **failure)


def _step_line(k: int, b: RaggedBatch) -> str:
    """One step of a sequence, as the failure lists it."""
    tokens = f"{b.num_tokens} token{'s' if b.num_tokens != 1 else ''}"
    return (f"step {k + 1}: {tokens}; slots {list(b.idx_mapping)}, query lens {list(b.query_lens)}, "
            f"computed {list(b.num_computed_tokens)}, prefill lens {list(b.prefill_lens)}, "
            f"deltas {list(b.prefill_delta)}")
