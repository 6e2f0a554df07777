"""The table's replay: a table case file (rope.harness.table.case_file) run again against its recorded
implementation (a registered name only: a module path stored in a case file is never imported) or the
one named on the command line, through the same check the suite runs (rope.harness.table.check).
``rope-harness repro FILE`` (rope.harness.repro dispatches by kind) and ``pytest --rope-repro FILE``
(properties/table/test_replay.py, whose pytest params :func:`replay_params` builds) replay it.

Exit status of :func:`run_repro`: 0 fixed, 1 still differs, 2 cannot replay.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from rope import registry
from rope.harness import case_files
from rope.harness.case_files import display_path
from rope.harness.table.case_file import TableCaseFile, load_case
from rope.harness.table.check import TableCheck, check
from rope.implementation import Implementation

__all__ = ["replay", "replay_params", "resolve_recorded", "run_repro"]


def resolve_recorded(name: str, source: str, trusted: tuple[str, ...] = ()) -> Callable:
    """A registered table implementation only (``trusted`` packages excepted: the suite's own mutants)."""
    return registry.get_recorded_table_implementation(name, source=source, trusted=trusted)


def unsupported_reason(name: str, fn: Callable, loaded: TableCaseFile, device: str) -> str | None:
    declared = Implementation.of(name, fn, "table").unsupported_reason
    why = declared(loaded.case.spec, loaded.case.dtype, device) if declared is not None else None
    return None if why is None else f"unsupported: {name} does not build {loaded.case.brief()}: {why}"


def replay(path: Path | str, *, device: str | None = None, impl: str | None = None
           ) -> tuple[TableCaseFile, str, TableCheck]:
    """Replay a table case file against its implementation (or ``impl``) on its device (or ``device``);
    ValueError when it cannot be replayed (bad file, unknown or unsupported implementation, a crash)."""
    loaded = load_case(path)
    name = impl or loaded.implementation
    fn = registry.get_table_implementation(impl) if impl else resolve_recorded(
        name, f"case file {display_path(loaded.path)}")
    where = device or loaded.device
    reason = unsupported_reason(name, fn, loaded, where)
    if reason:
        raise ValueError(reason)
    with case_files.replayed_call(name, loaded.id):
        result = check(fn, loaded.case, where)
    return loaded, name, result


def run_repro(path: Path | str, *, device: str | None, impl: str | None) -> int:
    """The ``repro`` subcommand for a table case file: 0 fixed, 1 still differs, 2 cannot replay."""
    try:
        loaded, name, result = replay(path, device=device, impl=impl)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return 2
    rec = loaded.record
    print(f"replaying {display_path(loaded.path)}: table, case {loaded.id}, recorded {rec['implementation']} "
          f"({rec['created']}) on {loaded.case.brief()}: {rec['diagnosis']['label']}")
    if result.ok:
        print(f"{name} matches the reference table within its bound: fixed", flush=True)
        return 0
    print(f"{name} still differs (error/bound ratio {result.worst_ratio:.3g}):\n{result.mismatch.describe()}")
    return 1


def replay_params(path: Path, config) -> list:
    """The pytest params replaying the table case file at ``path``: one per implementation, the recorded
    one (a registered name only) or each ``--rope-table-impl`` (the user's word)."""
    return case_files.replay_params(load_case(path), config.getoption("--rope-table-impl"))
