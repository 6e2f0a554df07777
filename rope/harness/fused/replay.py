"""The fused ops' replay: a fused case file (rope.harness.fused.case_file) run again against its
recorded implementation (a registered name only: a module path stored in a case file is never
imported) or the one named on the command line, through the same check the suite runs
(rope.harness.fused.check).  ``rope-harness repro FILE [--fused-impl NAME]`` (rope.harness.repro
dispatches by kind) and ``pytest --rope-repro FILE`` (properties/fused/test_replay.py, whose pytest
params :func:`replay_params` builds) replay it.

Exit status of :func:`run_repro`: 0 fixed, 1 still differs, 2 cannot replay (a bad file, an
implementation the file names by import path or that lacks the op, a crash, a hang).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from rope import registry
from rope.harness import case_files
from rope.harness.case_files import display_path
from rope.harness.fused.case_file import FusedCaseFile, load_case
from rope.harness.fused.check import FusedCheck, ImplementationFailed, check_case
from rope.harness.fused.diagnosis import diagnose

__all__ = ["implementation_of", "replay", "replay_params", "run_repro"]


def implementation_of(loaded: FusedCaseFile, name: str, user_named: bool, trusted: tuple[str, ...] = ()) -> Callable:
    """The callable of the case file's op: ``name`` as the user gave it (registered or an import
    path), else the name the file records (registered names only; ``trusted`` packages excepted: the
    suite's own mutants).  A ValueError when it cannot be had or has no such op."""
    if user_named:
        fn = registry.get_fused_implementation(name, loaded.op)
    else:
        fn = registry.get_recorded_fused_implementation(name, loaded.op, source=f"case file {display_path(loaded.path)}",
                                                         trusted=trusted)
    if fn is None:
        raise ValueError(f"{name} implements no {loaded.op} (the case file's op)")
    return fn


def replay(path: Path | str, *, device: str | None = None, impl: str | None = None
           ) -> tuple[FusedCaseFile, str, FusedCheck]:
    """Replay a fused case file against its implementation (or ``impl``) on its device (or
    ``device``); ValueError when it cannot be replayed."""
    loaded = load_case(path)
    name = impl or loaded.implementation
    fn = implementation_of(loaded, name, bool(impl))
    try:
        with case_files.replayed_call(name, loaded.id, own=(ImplementationFailed,)):
            result = check_case(loaded.op, fn, loaded.case, device or loaded.device)
    except ImplementationFailed as exc:
        raise ValueError(f"{name} failed on case {loaded.id} ({exc})") from None
    return loaded, name, result


def run_repro(path: Path | str, *, device: str | None, impl: str | None) -> int:
    """The ``repro`` subcommand for a fused case file: 0 fixed, 1 still differs, 2 cannot replay."""
    try:
        loaded, name, result = replay(path, device=device, impl=impl)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return 2
    rec = loaded.record
    print(f"replaying {display_path(loaded.path)}: fused {loaded.op}, case {loaded.id}, recorded "
          f"{rec['implementation']} ({rec['created']}) on {loaded.case.brief()}: {rec['diagnosis']['label']}")
    if result.ok:
        print(f"{name} matches the reference within its bounds: fixed", flush=True)
        return 0
    label, sentence = diagnose(result)
    print("\n".join([f"{name} still departs from the reference:", *result.problems, f"diagnosis: {label}: {sentence}"]))
    return 1


def replay_params(path: Path, config) -> list:
    """The pytest params replaying the fused case file at ``path``: one per implementation, the
    recorded one (a registered name only) or each ``--rope-fused-impl`` (the user's word)."""
    return case_files.replay_params(load_case(path), config.getoption("--rope-fused-impl"))
