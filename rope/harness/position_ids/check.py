"""The position ids' check: call a position-id implementation on a batch of prompts, validate what it
returns, and hold it to the expected ids (the reference's, or a documented upstream departure's).

:func:`assert_matches` holds a position-id implementation to the expected ids of every prompt of a
:class:`PromptBatch`; on a mismatch it writes ``reports/cases/<id>.json`` (``ROPE_CASES_DIR`` as for
rotation cases; the kind: rope.harness.position_ids.case_file) and fails with the first differing
token, row and segment, the diagnosis (rope.harness.position_ids.diagnosis) and the replay command
(rope.harness.position_ids.replay).  The ids are integers computed on the host: the bound is equality.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from reference.position_ids import prompt_positions
from rope.harness import case_files, causes
from rope.harness.draws import current_test, hypothesis_example
from rope.harness.position_ids.case_file import case_record
from rope.harness.position_ids.diagnosis import PositionIdsMismatch, compare
from rope.harness.position_ids.implementations import ADAPTERS, get_position_ids_implementation
from rope.implementation import Implementation
from rope.prompts import KnownDeviation, Prompt, PromptBatch, family_num_dims


def implementation_path(name: str, fn: Callable) -> str:
    """A string :func:`get_position_ids_implementation` resolves to ``fn`` (rope.harness.case_files' rule)."""
    return case_files.implementation_path(name, fn, resolve=get_position_ids_implementation)


# ------------------------------------------------------------------------------------------ call
def check_result(family: str, prompt: Prompt, result) -> tuple[torch.Tensor, int]:
    """An implementation's return value as (int64 CPU positions [num_dims, L], int delta).

    Raises ValueError naming what is wrong: not a pair, positions not an integer tensor (or numpy
    array, or nested lists) of the family's shape for the prompt's length, delta not an integer (a
    numpy integer, a 0-d or 1-element integer tensor is read as its value).
    """
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise ValueError(f"result: must be a pair (positions, delta) (got {type(result).__name__}"
                         f"{'' if not isinstance(result, (tuple, list)) else f' of {len(result)}'})")
    positions, delta = result
    if type(positions).__module__ == "numpy" or isinstance(positions, (list, tuple)):
        try:                        # an engine's numpy array (vLLM returns one) or nested lists
            positions = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"positions: cannot be read as a tensor ({exc})") from None
    if not isinstance(positions, torch.Tensor):
        raise ValueError(f"positions: must be a torch.Tensor, numpy array or nested list "
                         f"(got {type(positions).__name__})")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise ValueError(f"positions: must have an integer dtype (got {positions.dtype})")
    length = prompt_positions(family, prompt).length
    want = (family_num_dims(family), length)
    if tuple(positions.shape) != want:
        raise ValueError(f"positions: shape must be {want} (num_dims of {family}, tokens of the prompt) "
                         f"(got {tuple(positions.shape)})")
    if isinstance(delta, torch.Tensor):
        if delta.numel() != 1 or delta.dtype.is_floating_point or delta.dtype == torch.bool:
            raise ValueError(f"delta: must be an int (got a tensor of shape {tuple(delta.shape)}, {delta.dtype})")
        delta = int(delta.reshape(()).item())
    elif hasattr(delta, "__index__") and not isinstance(delta, bool):
        delta = int(delta.__index__())
    else:
        raise ValueError(f"delta: must be an int (got {type(delta).__name__} {delta!r})")
    return positions.detach().to("cpu", torch.int64), delta


class ImplementationFailed(Exception):
    """The implementation raised: the test fails with what it raised, as a mismatch would."""


def _call(fn: Callable, *args):
    """Call under the call deadline (rope.harness.deadline: a hang raises ImplementationHung);
    whatever the implementation raises becomes :class:`ImplementationFailed` naming it."""
    from rope.harness.deadline import call_timeout, deadline
    with deadline(call_timeout(), what=f"the position-id implementation {getattr(fn, '__name__', fn)!r}"):
        try:
            return fn(*args)
        except Exception as exc:    # noqa: BLE001 - an implementation may raise anything
            raise ImplementationFailed(f"{type(exc).__name__}: {exc}") from exc


def run_batch(fn: Callable, family: str, batch: PromptBatch) -> list[tuple[torch.Tensor, int]]:
    """Run every prompt of ``batch``: in one call where ``fn`` has ``batch``, else one by one.
    Each result goes through :func:`check_result`."""
    batched = Implementation.of("", fn, "position_ids").batch
    if batched is not None:
        results = _call(batched, family, batch)
        if not isinstance(results, (list, tuple)) or len(results) != len(batch.prompts):
            raise ValueError(f"batch result: must be one (positions, delta) per prompt ({len(batch.prompts)}) "
                             f"(got {type(results).__name__})")
    else:
        results = [_call(fn, family, prompt) for prompt in batch.prompts]
    return [check_result(family, prompt, r) for prompt, r in zip(batch.prompts, results)]


def expected(fn: Callable, family: str, batch: PromptBatch) -> list[tuple[torch.Tensor, int, KnownDeviation | None]]:
    """Per prompt: the positions and delta ``fn`` must return, and the known deviation they come
    from (None: the reference's own)."""
    refs = [prompt_positions(family, p) for p in batch.prompts]
    declared = Implementation.of("", fn, "position_ids").known_deviations
    deviations = list(declared(family, batch)) if declared is not None else [None] * len(refs)
    if len(deviations) != len(refs):
        raise ValueError(f"known_deviations: must give one entry per prompt ({len(refs)}) (got {len(deviations)})")
    out = []
    for ref, dev in zip(refs, deviations):
        if dev is None:
            out.append((ref.positions, ref.delta, None))
        else:
            out.append((dev.positions, dev.delta, dev))
    return out


# ------------------------------------------------------------------------------------------ check
@dataclass
class BatchCheck:
    """What :func:`check` found: per prompt, None or the mismatch (and the deviation applied)."""
    mismatches: list[tuple[int, PositionIdsMismatch, object]]
    deviations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches


def check(fn: Callable, family: str, batch: PromptBatch) -> BatchCheck:
    """Run ``fn`` on the batch and compare every prompt with its expected ids.  A wrong return
    value (not a pair, wrong shape or dtype) raises ValueError."""
    got = run_batch(fn, family, batch)
    want = expected(fn, family, batch)
    mismatches, keys = [], set()
    for i, (prompt, (pos, delta), (w_pos, w_delta, dev)) in enumerate(zip(batch.prompts, got, want)):
        if dev is not None:
            keys.update(dev.keys)
        m = compare(family, prompt, pos, delta, w_pos, w_delta)
        if m is not None:
            mismatches.append((i, m, dev))
    return BatchCheck(mismatches, tuple(sorted(keys)))


def _tokens(family: str, prompt) -> int | None:
    """The prompt's length as the family lays it out (what orders a cause's failures), if known."""
    try:
        return int(prompt_positions(family, prompt).positions.shape[-1])
    except Exception:   # noqa: BLE001 - only an ordering hint
        return None


def assert_matches(name: str, fn: Callable, family: str, batch: PromptBatch) -> tuple[str, ...]:
    """Hold ``fn`` to the expected ids of every prompt of ``batch``; return the keys of the known
    deviations that applied.  On a mismatch, write the case file (once Hypothesis has shrunk) and
    raise AssertionError with the first difference, the diagnosis and the replay command."""
    try:
        result = check(fn, family, batch)
    except ImplementationFailed as exc:
        raise AssertionError(f"{name} on {family} raised {exc}\nbatch: {batch}") from None
    except ValueError as exc:
        raise AssertionError(f"{name} on {family}: wrong return value: {exc}\nbatch: {batch}") from None
    _record_check(name, family, batch, result)
    if result.ok:
        return result.deviations
    index, mismatch, deviation = result.mismatches[0]
    head = (f"{name} position ids for {family} do not match the "
            f"{'pinned upstream value' if deviation else 'reference'} (prompt {index} of {len(batch.prompts)}: "
            f"{batch.prompts[index]!r}; pads {list(batch.pads)} {batch.side})")
    message = f"{head}\n{mismatch.describe()}"
    if deviation is not None:
        message += f"\nexpected value pinned by: {deviation.reason}"
    failure = {"cause": mismatch.label, "headline": mismatch.sentence, "size": _tokens(family, batch.prompts[index]),
               "case": f"{family}, prompt {index} of {len(batch.prompts)}"}
    final, hypothesis = hypothesis_example()
    if final:
        try:
            implementation = implementation_path(name, fn)
            record = case_record(
                implementation=implementation, fn=fn, family=family, batch=batch, index=index,
                mismatch=mismatch, deviation=deviation, hypothesis=hypothesis)
            directory = case_files.cases_dir()
            if directory is None:
                message += f"\ncase file: not written ({case_files.CASES_DIR_ENV} is off)"
            else:
                path = case_files.write_case(record, directory)
                shown = case_files.display_path(path)
                impl = "" if implementation in ADAPTERS else f" --impl {implementation}"
                message += f"\ncase file: {shown}\nreplay: rope-harness repro {shown}{impl}"
                failure.update(case_file=shown, replay=f"rope-harness repro {shown}{impl}")
        except Exception as exc:     # noqa: BLE001 - the mismatch is reported all the same
            message += f"\n(case file not written: {type(exc).__name__}: {exc})"
    raise causes.tag(AssertionError(message), **failure)


def _record_check(name: str, family: str, batch: PromptBatch, result: BatchCheck) -> None:
    """The batch's check in the run report, as one exact comparison (the ids are integers, on the
    host): the matrix, a campaign and the run's "nothing compared" rule count it.  Never lets
    reporting break the check."""
    from rope.harness import report
    try:
        problem = result.mismatches[0][1].sentence if result.mismatches else None
        report.record_exact_check(test=current_test(), impl=name,
                                  device="cpu", what=f"position-ids-{family}", ok=result.ok,
                                  elements=len(batch.prompts), problem=problem)
    except Exception:   # noqa: BLE001 - the report is best effort, the check is not
        pass
