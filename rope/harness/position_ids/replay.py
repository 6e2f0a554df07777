"""The position ids' replay: a position-id case file (rope.harness.position_ids.case_file) run again
against its recorded adapter (a registered name only: a module path stored in a case file is never
imported) or the one named on the command line, through the same check the suite runs
(rope.harness.position_ids.check).  ``rope-harness repro FILE`` (rope.harness.repro dispatches by
kind) and ``pytest --rope-repro FILE`` (properties/position_ids/test_replay.py, whose pytest params
:func:`replay_params` builds) replay it.

Exit status of :func:`run_repro`: 0 fixed, 1 still differs, 2 cannot replay.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from rope import registry
from rope.harness import case_files
from rope.harness.case_files import display_path
from rope.harness.position_ids.case_file import PositionIdsCase, load_case
from rope.harness.position_ids.check import BatchCheck, check
from rope.harness.position_ids.implementations import ADAPTERS, get_position_ids_implementation, unsupported_reason

def resolve_recorded(name: str, source: str, trusted: tuple[str, ...] = ()) -> Callable:
    """A registered adapter only: a module path stored in a case file is never imported
    (``trusted`` packages excepted: the suite's own mutants, for its corpus)."""
    return registry.resolve_recorded(name, source=source, registered=ADAPTERS, get=get_position_ids_implementation,
                                     option="--rope-position-ids-impl", trusted=trusted)


def replay(path: Path | str, *, impl: str | None = None) -> tuple[PositionIdsCase, str, BatchCheck]:
    """Replay a position-id case file against its implementation (or ``impl``); ValueError when it
    cannot be replayed (bad file, unknown or unsupported implementation, a crash)."""
    case = load_case(path)
    name = impl or case.implementation
    fn = get_position_ids_implementation(impl) if impl else resolve_recorded(
        name, f"case file {display_path(case.path)}")
    reason = unsupported_reason(name, fn, case.family)
    if reason:
        raise ValueError(reason)
    with case_files.replayed_call(name, case.id):
        result = check(fn, case.family, case.batch)
    return case, name, result


def run_repro(path: Path | str, impl: str | None) -> int:
    """The ``repro`` subcommand for a position-id case file: 0 fixed, 1 still differs, 2 cannot replay."""
    try:
        case, name, result = replay(path, impl=impl)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return 2
    rec = case.record
    print(f"replaying {display_path(case.path)}: position ids, case {case.id}, recorded {rec['implementation']} "
          f"({rec['created']}) on {case.family}: {rec['diagnosis']['label']}")
    if result.ok:
        print(f"{name} matches the expected position ids on every prompt of the batch: fixed", flush=True)
        return 0
    for index, mismatch, deviation in result.mismatches:
        print(f"{name} still differs on prompt {index} ({case.batch.prompts[index]!r}):\n{mismatch.describe()}")
        if deviation is not None:
            print(f"expected value pinned by: {deviation.reason}")
    return 1


def replay_params(path: Path, config) -> list:
    """The pytest params replaying the position-id case file at ``path``: one per implementation, the
    recorded one (a registered name only) or each ``--rope-position-ids-impl`` (the user's word)."""
    return case_files.replay_params(load_case(path), config.getoption("--rope-position-ids-impl"))
