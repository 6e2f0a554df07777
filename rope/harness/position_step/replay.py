"""The position step's replay: a position-step case file (rope.harness.position_step.case_file) run
again against its recorded implementation (a registered name only: a module path stored in a case file
is never imported) or the one named on the command line, on its device or another, through the same
check the suite runs (rope.harness.position_step.check); a file of a step sequence runs every step
again on one set of buffers in its recorded mode (rope.harness.position_step.modes: eagerly, or
captured in a CUDA graph and replayed, which needs a GPU).  ``rope-harness repro FILE``
(rope.harness.repro dispatches by kind) and ``pytest --rope-repro FILE``
(properties/position_step/test_replay.py, whose pytest params :func:`replay_params` builds) replay it.

Exit status of :func:`run_repro`: 0 fixed, 1 still differs, 2 cannot replay.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from rope import registry
from rope.devices import available_devices
from rope.harness import case_files
from rope.harness.case_files import display_path
from rope.harness.modes import declared_mode_reason, mode_words
from rope.harness.position_step.case_file import PositionStepCaseFile, load_case
from rope.harness.position_step.check import run_positions
from rope.harness.position_step.modes import stale_step

__all__ = ["replay", "replay_params", "replay_steps", "resolve_recorded", "run_repro", "sequence_unrunnable_reason"]


def resolve_recorded(name: str, source: str, trusted: tuple[str, ...] = ()) -> Callable:
    """A registered position-step implementation only (``trusted`` packages excepted: the suite's own mutants)."""
    return registry.get_recorded_positions_implementation(name, source=source, trusted=trusted)


def replay(path: Path | str, *, device: str | None = None, impl: str | None = None
           ) -> tuple[PositionStepCaseFile, str, list[str]]:
    """Replay a position-step case file against its implementation (or ``impl``) on its device (or
    ``device``): (the case file, the implementation's name, what is still wrong: empty once fixed).
    ValueError when it cannot be replayed (bad file, unknown implementation or device, a crash)."""
    from rope.harness.position_step.check import check_positions
    from rope.harness.position_step.cases import OUT_SENTINEL
    loaded = load_case(path)
    name = impl or loaded.implementation
    fn = registry.get_positions_implementation(impl) if impl else resolve_recorded(
        name, f"case file {display_path(loaded.path)}")
    where = device or loaded.device
    if loaded.steps:
        reason = sequence_unrunnable_reason(loaded, name, fn, where)
        if reason:
            raise ValueError(reason)
        return loaded, name, replay_steps(loaded, name, fn, where)
    if where.split(":", 1)[0] not in available_devices():
        raise ValueError(f"device={where!r}: not available here (rope-harness devices lists them); pass --device")
    batch = loaded.batch
    with case_files.replayed_call(name, loaded.id):
        out = run_positions(fn, batch, where)
    n = batch.num_tokens
    past = [] if bool((out[:, n:] == OUT_SENTINEL).all()) else [f"wrote columns past the step's {n} tokens"]
    return loaded, name, check_positions(name, where, batch.tensors("cpu"), out[:, :n], past)


def sequence_unrunnable_reason(loaded: PositionStepCaseFile, name: str, fn: Callable, device: str) -> str | None:
    """Why a sequence file cannot run ``fn`` on ``device`` here in its recorded mode (None: it can):
    a graph on a machine without a GPU, a device not here, an implementation that does not run on it
    or does not declare the mode.  ``rope-harness repro`` exits 2 with it, ``--rope-repro`` skips."""
    found = available_devices()
    if loaded.mode == "graph" and not {"cuda", "rocm"} & set(found):
        reason = f"a CUDA/HIP graph needs a GPU (found {', '.join(found)})"
    elif device.split(":", 1)[0] not in found:
        reason = f"device {device!r} is not available here (found {', '.join(found)}; pass --device)"
    else:
        reason = registry.positions_unsupported_reason(name, fn, device) or declared_mode_reason(
            registry.implementation_record(name, "position_step", fn), loaded.mode, device)
    return f"case {loaded.id} was recorded {mode_words(loaded.mode)}, and {reason}" if reason else None


def replay_steps(loaded: PositionStepCaseFile, name: str, fn: Callable, device: str) -> list[str]:
    """A sequence file's steps run again on one set of buffers in the recorded mode (on a device
    :func:`sequence_unrunnable_reason` allows), each held to the reference of its own inputs: what is
    wrong with the first step that is not (empty: none).  ValueError when the call cannot be
    captured, hangs or crashes."""
    from rope.harness.modes import GraphCaptureFailed
    mode = loaded.mode
    try:
        with case_files.replayed_call(name, loaded.id, own=(GraphCaptureFailed,)):
            stale = stale_step(name, fn, loaded.steps, device, mode)
    except GraphCaptureFailed as exc:
        raise ValueError(f"{name} on {device}: {exc}") from None
    return [] if stale is None else [stale.sentence(mode), *stale.problems]


def run_repro(path: Path | str, *, device: str | None, impl: str | None) -> int:
    """The ``repro`` subcommand for a position-step case file: 0 fixed, 1 still differs, 2 cannot replay."""
    try:
        loaded, name, problems = replay(path, device=device, impl=impl)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return 2
    rec = loaded.record
    steps = len(loaded.steps)
    stale = loaded.steps.index(loaded.batch) + 1 if steps else 0
    what = f"{steps} steps {mode_words(loaded.mode)} on one set of buffers, step {stale} stale: " if steps else ""
    print(f"replaying {display_path(loaded.path)}: position step, case {loaded.id}, recorded {rec['implementation']} "
          f"on {rec['device']} ({rec['created']}), {what}{loaded.batch.brief()}: {rec['diagnosis']['label']}")
    if not problems:
        every = "on every step " if steps else ""
        print(f"{name} gives the reference's positions {every}and writes nothing past the step: fixed", flush=True)
        return 0
    print(f"{name} still differs:\n" + "\n".join(problems))
    return 1


def replay_params(path: Path, config) -> list:
    """The pytest params replaying the position-step case file at ``path``: one per implementation, the
    recorded one (a registered name only) or each ``--rope-position-step-impl`` (the user's word)."""
    return case_files.replay_params(load_case(path), config.getoption("--rope-position-step-impl"))
