"""``rope-harness repro CASE [--device D] [--impl NAME]``: replay a mismatch case file.

A position-id case file (``"kind": "position_ids"``) replays through
``rope.harness.position_ids.cases`` with the same exit statuses; the rest of this page is about
rotation case files.

The case's tensors are regenerated bit-identically from its seed (checked against the recorded
sha256 of the inputs), the implementation runs on the device, and the result goes through the
suite's own check (``rope.harness.comparison``).

Exit status: 0 once it matches (fixed); 1 while it still mismatches (the worst elements with their
error/bound and the diagnosis are printed); 2 when the case cannot be replayed: a bad or unreadable
case file, an implementation the file names by import path (never imported: pass ``--impl``), an
unknown implementation or unavailable device, inputs that do not regenerate to the recorded sha256
(a replay of other bits proves nothing), or an implementation that crashes.

``--impl`` replays against another implementation (a fixed kernel, or the recorded import path on
the user's word), ``--device`` on another device.

A replay writes no case file; ``pytest --rope-repro CASE`` (properties/test_repro.py) is the
same replay inside pytest, where a remaining mismatch is reported like any other.

"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from rope.harness.case_files import CaseFile, display_path, format_mismatch, load_case
from rope.devices import DEVICE_NAMES, available_devices
from rope.harness.diagnosis import Diagnosis
from rope.registry import get_implementation, get_recorded_implementation, unsupported_reason

EXIT_FIXED, EXIT_MISMATCH, EXIT_BAD_INPUT = 0, 1, 2
REGENERATION_MISMATCH = "regenerated inputs differ from the recorded ones"


@dataclass
class Replay:
    """Outcome of replaying one case file."""
    case_file: CaseFile
    implementation: str
    device: str
    comparison: object                      # rope.harness.tolerance.Comparison
    diagnosis: Diagnosis | None             # None when it matches
    notes: list[str] = field(default_factory=list)   # regeneration / layout warnings

    @property
    def ok(self) -> bool:
        return self.comparison.ok

    def report(self) -> str:
        cf = self.case_file
        recorded = cf.record["diagnosis"]
        lines = [f"replaying {display_path(cf.path)}: case {cf.id}, recorded {cf.implementation} on {cf.device} "
                 f"({cf.record['created']}): {recorded['label']}",
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
    from rope.harness.comparison import input_digests, input_layout
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
    from rope.harness.comparison import diagnose_run, evaluate_case

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
    reason = unsupported_reason(name, fn, case.spec, _dtype(case.dtype), device)
    if reason:
        raise ValueError(reason)
    from rope.harness.deadline import ImplementationHung
    try:
        run = evaluate_case(name, fn, case, device)
    except ImplementationHung:
        raise ValueError(f"{name} on {device} did not return on case {case_file.id} within the call deadline "
                         f"($ROPE_CALL_TIMEOUT, default 120 s)") from None
    except Exception as exc:    # noqa: BLE001 - a failure of the replay itself, whatever it is
        raise ValueError(f"replaying case {case_file.id} on {device} failed ({type(exc).__name__}: {exc})") from exc
    if run.raised:
        raise ValueError(f"{name} on {device} crashed on case {case_file.id}: {run.failure}")
    notes = regeneration_notes(case_file, run.ref_in, run.inputs)
    if not regenerated(notes):
        raise ValueError(f"case file {display_path(case_file.path)}: {notes[0]}")
    diagnosis = None if run.comparison.ok else diagnose_run(fn, case, run)
    return Replay(case_file, name, device, run.comparison, diagnosis, notes)


def regenerated(notes: list[str]) -> bool:
    """False when the regeneration notes say the inputs are not the recorded ones."""
    return not any(note.startswith(REGENERATION_MISMATCH) for note in notes)


def _dtype(name: str):
    from rope.harness.inputs import DTYPES
    return DTYPES[name]


def run_repro(args) -> int:
    """The ``repro`` subcommand (a position-id case file goes to rope.harness.position_ids.cases)."""
    from rope.harness.position_ids.cases import is_position_ids_case
    if is_position_ids_case(args.case):
        from rope.harness.position_ids.cases import run_repro as run_position_ids_repro
        if args.device:
            print("rope-harness repro: --device: position ids are computed on the host; ignored", file=sys.stderr)
        return run_position_ids_repro(args.case, args.impl)
    try:
        result = replay(args.case, device=args.device, impl=args.impl)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(result.report(), flush=True)
    return EXIT_FIXED if result.ok else EXIT_MISMATCH


def add_repro_parser(sub) -> None:
    """Register ``repro`` on the CLI's subparsers."""
    p = sub.add_parser("repro", help="replay a mismatch case file (reports/cases/<id>.json)",
                       description="Regenerate the case's inputs bit-identically, rerun the implementation and "
                                   "compare with the reference; print the worst elements and the diagnosis. "
                                   "Exit 0 once it matches (fixed), 1 while it still mismatches, 2 when the case "
                                   "cannot be replayed: a bad case file, an implementation the file names by "
                                   "import path (never imported from a file: pass --impl), an unavailable device, "
                                   "inputs that do not regenerate to the recorded sha256, a crash, or a call that does not "
                                   "return within $ROPE_CALL_TIMEOUT seconds (default 120).")
    p.add_argument("case", metavar="CASE", help="case file: reports/cases/<id>.json or properties/regressions/*.json")
    p.add_argument("--device", choices=DEVICE_NAMES, help="replay on this device instead of the recorded one")
    p.add_argument("--impl", metavar="NAME",
                   help="replay against this implementation (registered name or package.module:callable) "
                        "instead of the recorded one, e.g. a fixed kernel, or the import path the case file "
                        "records, which is never imported unless named here")
    p.set_defaults(func=run_repro)
