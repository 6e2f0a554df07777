"""Position-id mismatches: the check the suite runs, and the replay of its case files.

:func:`assert_matches` holds a position-id implementation to the expected ids of every prompt of a
:class:`PromptBatch`; on a mismatch it writes ``reports/cases/<id>.json`` (``ROPE_CASES_DIR`` as for
rotation cases) and fails with the first differing token, row and segment, the diagnosis and the
replay command.  ``rope-harness repro FILE`` and ``pytest --rope-repro FILE`` replay it.

The case file's schema and its loader are rope/harness/case_files.py's (the ``position_ids``
kind).

A case file is data from a stranger: every field is validated (bounded sizes, known names), and a
replay resolves only registered names; a module path stored in it is never imported.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rope import registry
from rope.harness import case_files, causes
from rope.harness.position_ids import (
    ADAPTERS,
    ImplementationFailed,
    PromptBatch,
    expected,
    get_position_ids_implementation,
    run_batch,
    unsupported_reason,
)
from rope.harness.position_ids.diagnosis import PositionIdsMismatch, compare

KIND = case_files.POSITION_IDS_KIND


def implementation_path(name: str, fn: Callable) -> str:
    """A string :func:`get_position_ids_implementation` resolves to ``fn`` (case_files' rule)."""
    return case_files.implementation_path(name, fn, resolve=get_position_ids_implementation)


def is_position_ids_case(path: Path | str) -> bool:
    """Whether ``path`` holds a position-id case file (its ``kind``, read by the case files' one
    header reader); False for anything unreadable (the rotation loader then says what is wrong)."""
    return case_files.case_kind(path) == KIND


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
        import reference
        return int(reference.prompt_positions(family, prompt).positions.shape[-1])
    except Exception:   # noqa: BLE001 - only an ordering hint
        return None


def assert_matches(name: str, fn: Callable, family: str, batch: PromptBatch) -> tuple[str, ...]:
    """Hold ``fn`` to the expected ids of every prompt of ``batch``; return the keys of the known
    deviations that applied.  On a mismatch, write the case file (once Hypothesis has shrunk) and
    raise AssertionError with the first difference, the diagnosis and the replay command."""
    from rope.harness.comparison import hypothesis_example
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
            record = case_files.position_ids_case_record(
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
        report.record_exact_check(test=os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0], impl=name,
                                  device="cpu", what=f"position-ids-{family}", ok=result.ok,
                                  elements=len(batch.prompts), problem=problem)
    except Exception:   # noqa: BLE001 - the report is best effort, the check is not
        pass


# ------------------------------------------------------------------------------------------ replay
def resolve_recorded(name: str, source: str, trusted: tuple[str, ...] = ()) -> Callable:
    """A registered adapter only: a module path stored in a case file is never imported
    (``trusted`` packages excepted: the suite's own mutants, for its corpus)."""
    return registry.resolve_recorded(name, source=source, registered=ADAPTERS, get=get_position_ids_implementation,
                                     option="--rope-position-ids-impl", trusted=trusted)


def replay(path: Path | str, *, impl: str | None = None) -> tuple[case_files.PositionIdsCase, str, BatchCheck]:
    """Replay a position-id case file against its implementation (or ``impl``); ValueError when it
    cannot be replayed (bad file, unknown or unsupported implementation, a crash)."""
    case = case_files.load_position_ids_case(path)
    name = impl or case.implementation
    fn = get_position_ids_implementation(impl) if impl else resolve_recorded(
        name, f"case file {case_files.display_path(case.path)}")
    reason = unsupported_reason(name, fn, case.family)
    if reason:
        raise ValueError(reason)
    from rope.harness.deadline import ImplementationHung
    try:
        result = check(fn, case.family, case.batch)
    except ImplementationHung:
        raise ValueError(f"{name} did not return on case {case.id} within the call deadline "
                         f"($ROPE_CALL_TIMEOUT, default 120 s)") from None
    except Exception as exc:    # noqa: BLE001 - a crash of the implementation or a wrong return value
        raise ValueError(f"{name} failed on case {case.id} ({type(exc).__name__}: {exc})") from exc
    return case, name, result


def run_repro(path: Path | str, impl: str | None) -> int:
    """The ``repro`` subcommand for a position-id case file: 0 fixed, 1 still differs, 2 cannot replay."""
    try:
        case, name, result = replay(path, impl=impl)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return 2
    rec = case.record
    print(f"replaying {case_files.display_path(case.path)}: position ids, case {case.id}, recorded {rec['implementation']} "
          f"({rec['created']}) on {case.family}: {rec['diagnosis']['label']}")
    if result.ok:
        print(f"{name} matches the expected position ids on every prompt of the batch: fixed", flush=True)
        return 0
    for index, mismatch, deviation in result.mismatches:
        print(f"{name} still differs on prompt {index} ({case.batch.prompts[index]!r}):\n{mismatch.describe()}")
        if deviation is not None:
            print(f"expected value pinned by: {deviation.reason}")
    return 1
