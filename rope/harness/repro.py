"""``rope-harness repro CASE [--device D] [--impl NAME]``: replay a mismatch case file.

The case's tensors are regenerated bit-identically from its seed (checked against the recorded
sha256 of the inputs), the implementation runs on the device, and the result goes through the
suite's own check (``rope.harness.comparison``).  While it still mismatches, the worst elements with
their error/bound and the diagnosis are printed and the exit status is 1; once it matches, 0.
``--impl`` replays against another implementation (a fixed kernel), ``--device`` on another
device.  Bad input (unreadable case file, unknown implementation, unavailable device) exits 2.

A replay writes no case file; ``pytest --rope-repro CASE`` (properties/test_repro.py) is the
same replay inside pytest, where a remaining mismatch is reported like any other.

``properties`` is imported inside the functions: rope/ does not depend on it at import time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from rope.harness.case_files import CaseFile, display_path, format_mismatch, load_case
from rope.devices import DEVICE_NAMES, available_devices
from rope.harness.diagnosis import Diagnosis
from rope.registry import get_implementation, unsupported_reason

EXIT_FIXED, EXIT_MISMATCH, EXIT_BAD_INPUT = 0, 1, 2


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
        notes.append(f"regenerated inputs differ from the recorded ones ({', '.join(changed)}: sha256 mismatch); "
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
    try:
        fn = get_implementation(name)
    except ValueError as exc:
        hint = "" if impl else "; pass --impl NAME to replay against another implementation"
        raise ValueError(f"{exc}{hint}") from None
    device = device or case_file.device
    found = available_devices()
    if device not in found:
        raise ValueError(f"device={device!r}: not available here (found {', '.join(found)}); pass --device")
    case = case_file.case
    reason = unsupported_reason(name, fn, case.spec, _dtype(case.dtype), device)
    if reason:
        raise ValueError(reason)
    run = evaluate_case(name, fn, case, device)
    diagnosis = None if run.comparison.ok else diagnose_run(fn, case, run)
    return Replay(case_file, name, device, run.comparison, diagnosis, regeneration_notes(case_file, run.ref_in, run.inputs))


def _dtype(name: str):
    from rope.harness.inputs import DTYPES
    return DTYPES[name]


def run_repro(args) -> int:
    """The ``repro`` subcommand."""
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
                                   "Exit 0 once it matches, 1 while it still mismatches, 2 on bad input.")
    p.add_argument("case", metavar="CASE", help="case file: reports/cases/<id>.json or properties/regressions/*.json")
    p.add_argument("--device", choices=DEVICE_NAMES, help="replay on this device instead of the recorded one")
    p.add_argument("--impl", metavar="NAME",
                   help="replay against this implementation (registered name or package.module:callable) "
                        "instead of the recorded one, e.g. a fixed kernel")
    p.set_defaults(func=run_repro)
