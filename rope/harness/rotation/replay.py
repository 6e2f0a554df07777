"""The rotation's replay: a rotation case file (rope.harness.rotation.case_file) run again, for
``rope-harness repro CASE [--device D] [--impl NAME]`` (rope.harness.repro dispatches a file to its
kind's replay) and ``pytest --rope-repro CASE`` (properties/rotation/test_replay.py, whose pytest
params :func:`replay_params` builds).

The case's tensors are regenerated bit-identically from its seed (checked against the recorded
sha256 of the inputs), the implementation runs on the device, and the result goes through the
suite's own check (rope.harness.rotation.check).

Exit status: 0 once it matches (fixed); 1 while it still mismatches (the worst elements with their
error/bound and the diagnosis are printed); 2 when the case cannot be replayed: a bad or unreadable
case file, an implementation the file names by import path (never imported: pass ``--impl``), an
unknown implementation or unavailable device, inputs that do not regenerate to the recorded sha256
(a replay of other bits proves nothing), or an implementation that crashes.

``--impl`` replays against another implementation (a fixed kernel, or the recorded import path on
the user's word), ``--device`` on another device.

A case recorded in another mode than eager (its ``mode``) replays in it: under torch.compile, or
captured in a CUDA graph and replayed with the recorded sequence of real tokens (a GPU is needed).
Eagerly and under compile the case is called twice, as the properties call it: a second call that
mismatches, or (for an implementation that does not declare ``deterministic=False``) gives other bits
than the first, still mismatches (``nondeterministic``), so a bug wrong on some calls only replays.

A replay writes no case file; ``pytest --rope-repro CASE`` is the same replay inside pytest, where
a remaining mismatch is reported like any other.

"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rope.devices import available_devices
from rope.harness.case_files import display_path
from rope.harness.deadline import ImplementationHung
from rope.harness.rotation.case_file import CaseFile, input_digests, input_layout, load_case
from rope.harness.rotation.cases import DTYPES, build_rotation_inputs
from rope.harness.rotation.check import diagnose_run, evaluate_case, format_mismatch
from rope.harness.rotation.diagnosis import Diagnosis
from rope.harness.rotation.modes import (GraphCaptureFailed, bit_differences, compiled_implementation,
                                         mode_unsupported_reason, mode_words, stale_replay)
from rope.registry import get_implementation, get_recorded_implementation, implementation_record, unsupported_reason

EXIT_FIXED, EXIT_MISMATCH, EXIT_BAD_INPUT = 0, 1, 2
REGENERATION_MISMATCH = "regenerated inputs differ from the recorded ones"


@dataclass
class Replay:
    """Outcome of replaying one case file."""
    case_file: CaseFile
    implementation: str
    device: str
    comparison: object                      # rope.harness.rotation.bound.Comparison
    diagnosis: Diagnosis | None             # None when it matches
    notes: list[str] = field(default_factory=list)   # regeneration / layout warnings

    @property
    def ok(self) -> bool:
        return self.comparison.ok

    def report(self) -> str:
        cf = self.case_file
        recorded = cf.record["diagnosis"]
        called = "" if cf.mode == "eager" else f", called {mode_words(cf.mode)}"
        lines = [f"replaying {display_path(cf.path)}: case {cf.id}{called}, recorded {cf.implementation} on "
                 f"{cf.device} ({cf.record['created']}): {recorded['label']}",
                 *(f"warning: {n}" for n in self.notes)]
        if self.ok:
            lines.append(f"{self.implementation} on {self.device} matches the reference: fixed "
                         f"(worst error/bound {self.comparison.worst_ratio:.3g} over "
                         f"{self.comparison.num_elements} elements)")
        else:
            lines.append(format_mismatch(
                header=f"{self.implementation} on {self.device} still does not match the reference (case {cf.id})",
                diagnosis=self.diagnosis, comparison=self.comparison, case=cf.case))
        return "\n".join(lines)


def regeneration_notes(case_file: CaseFile, ref_in, inputs=None) -> list[str]:
    """Differences between the regenerated inputs and what the case file recorded: the sha256
    of the CPU inputs ``ref_in`` and, when ``inputs`` (on the device) are given, the q/k layout."""
    notes = []
    recorded, now = case_file.record["inputs_sha256"], input_digests(ref_in)
    changed = [name for name in now if recorded.get(name) != now[name]]
    if changed:
        notes.append(f"{REGENERATION_MISMATCH} ({', '.join(changed)}: sha256 mismatch); "
                     f"torch's generator or the case regeneration changed, so this replay does not test the "
                     f"recorded input")
    if inputs is not None:
        layout, recorded_layout = input_layout(inputs), case_file.record["strides"]
        if layout != recorded_layout:
            notes.append(f"q/k layout differs from the recorded one (now {layout}, recorded {recorded_layout})")
    return notes


def replay(path: Path | str, *, device: str | None = None, impl: str | None = None) -> Replay:
    """Replay a case file; ``device``/``impl`` override the recorded ones.  Bad input raises
    ValueError with the reason."""
    case_file = load_case(path)
    name = impl or case_file.implementation
    if impl:
        fn = get_implementation(impl)
    else:
        fn = get_recorded_implementation(name, source=f"case file {display_path(case_file.path)}")
    device = device or case_file.device
    found = available_devices()
    if device not in found:
        raise ValueError(f"device={device!r}: not available here (found {', '.join(found)}); pass --device")
    case = case_file.case
    reason = unsupported_reason(name, fn, case.spec, DTYPES[case.dtype], device)
    if reason:
        raise ValueError(reason)
    record = implementation_record(name, fn=fn)
    reason = mode_unsupported_reason(record, case_file.mode, device)
    if reason:
        raise ValueError(f"case {case_file.id} was recorded {mode_words(case_file.mode)}, and {reason}")
    if case_file.mode == "graph":
        return _replay_graph(case_file, name, record, device)
    if case_file.mode == "compile":
        fn = compiled_implementation(record, device)
    run = _replayed_run(name, fn, case_file, device)
    notes = regeneration_notes(case_file, run.ref_in, run.inputs)
    if not regenerated(notes):
        raise ValueError(f"case file {display_path(case_file.path)}: {notes[0]}")
    if run.comparison.ok:
        # As the properties call it: a second time on fresh copies of the same inputs, held to the
        # reference and, for a deterministic implementation, to the first call's bits.  An
        # intermittent bug (wrong on some calls only) then fails its replay too, not only its test.
        again = _replayed_run(name, fn, case_file, device)
        if not again.comparison.ok:
            notes.append("the first call matched; the second call of the same inputs did not")
            run = again
        elif record.deterministic:
            differ = bit_differences(run.q_out, again.q_out, "query") + bit_differences(run.k_out, again.k_out, "key")
            if differ:
                run.comparison.problems += [f"a second call of the same inputs gave other bits: {d}" for d in differ]
                return Replay(case_file, name, device, run.comparison, Diagnosis(
                    "nondeterministic", "the same inputs give other bits from call to call"), notes)
    diagnosis = None if run.comparison.ok else diagnose_run(fn, case, run)
    return Replay(case_file, name, device, run.comparison, diagnosis, notes)


def _replayed_run(name: str, fn, case_file: CaseFile, device: str):
    """One run of the case (rope.harness.rotation.check.evaluate_case), its hang or crash a ValueError."""
    try:
        run = evaluate_case(name, fn, case_file.case, device)
    except ImplementationHung:
        raise ValueError(f"{name} on {device} did not return on case {case_file.id} within the call deadline "
                         f"($ROPE_CALL_TIMEOUT, default 120 s)") from None
    except Exception as exc:    # noqa: BLE001 - a failure of the replay itself, whatever it is
        raise ValueError(f"replaying case {case_file.id} on {device} failed ({type(exc).__name__}: {exc})") from exc
    if run.raised:
        raise ValueError(f"{name} on {device} crashed on case {case_file.id}: {run.failure}")
    return run


def _replay_graph(case_file: CaseFile, name: str, record, device: str) -> Replay:
    """A graph-mode case file: the implementation captured on the case's inputs and replayed with the
    recorded sequence (rope.harness.rotation.modes.graph_replay_steps), each replay held to the reference
    of its own inputs; the replay that fails first is the one reported."""
    case = case_file.case
    notes = regeneration_notes(case_file, build_rotation_inputs(case, "cpu"))
    if not regenerated(notes):
        raise ValueError(f"case file {display_path(case_file.path)}: {notes[0]}")
    try:
        stale, last = stale_replay(record, case, case_file.replay_tokens, device)
    except GraphCaptureFailed as exc:
        raise ValueError(f"{name} on {device}: {exc}") from None
    except Exception as exc:    # noqa: BLE001 - a failure of the replay itself, whatever it is
        raise ValueError(f"replaying case {case_file.id} on {device} failed ({type(exc).__name__}: {exc})") from exc
    if stale is None:
        return Replay(case_file, name, device, last, None, notes)
    diagnosis = Diagnosis("graph_replay_stale", stale.sentence(case.num_tokens))
    return Replay(case_file, name, device, stale.comparison, diagnosis, notes)


def regenerated(notes: list[str]) -> bool:
    """False when the regeneration notes say the inputs are not the recorded ones."""
    return not any(note.startswith(REGENERATION_MISMATCH) for note in notes)


def run_repro(path, *, device: str | None, impl: str | None) -> int:
    """The ``repro`` subcommand for a rotation case file: prints the replay; exit 0 fixed, 1 still
    mismatching, 2 when it cannot be replayed."""
    try:
        result = replay(path, device=device, impl=impl)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(result.report(), flush=True)
    return EXIT_FIXED if result.ok else EXIT_MISMATCH


def replay_params(path: Path, config) -> list:
    """The pytest params replaying the rotation case file at ``path``: one per implementation (the
    recorded one, a registered name only, or each ``--rope-impl``: the user's word) and device (the
    recorded one, or each ``--rope-device``).  A ValueError names a device not available here."""
    case_file = load_case(path)
    found = available_devices()
    devices = config.getoption("--rope-device") or [case_file.device]
    for device in devices:
        if device not in found:
            raise ValueError(f"--rope-repro={path}: device {device!r} is not available here "
                             f"(found {found}); pass --rope-device")
    named = config.getoption("--rope-impl")
    return [pytest.param((case_file, impl, device, bool(named)), id=f"{case_file.id}-{impl}-{device}")
            for impl in named or [case_file.implementation] for device in devices]
