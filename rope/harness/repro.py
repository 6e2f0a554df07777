"""``rope-harness repro CASE [--device D] [--impl NAME]``: replay a mismatch case file, whatever its
kind.  The kind's replay does the work: a rotation case file (rope.harness.rotation.replay), a
position-id one (rope.harness.position_ids.replay), a position step's
(rope.harness.position_step.replay), a table's (rope.harness.table.replay) or a fused
op's (rope.harness.fused.replay, whose implementation ``--fused-impl`` names as ``--impl`` does); this module reads a file's kind with the
envelope's one header reader (rope.harness.case_files.read_header) and hands the file on, for the
command line and for ``pytest --rope-repro`` (:func:`replay_params`).

Exit status: 0 once it matches (fixed); 1 while it still mismatches; 2 when the case cannot be
replayed (a bad or unreadable case file, an implementation the file names by import path: never
imported, pass ``--impl``; an unknown implementation or unavailable device; inputs that do not
regenerate to the recorded sha256; an implementation that crashes).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rope.devices import DEVICE_NAMES
from rope.harness.case_files import case_paths, read_header
from rope.harness.fused import case_file as fused_case_file
from rope.harness.fused import replay as fused_replay
from rope.harness.position_ids import case_file as position_ids_case_file
from rope.harness.position_ids import replay as position_ids_replay
from rope.harness.position_step import case_file as position_step_case_file
from rope.harness.position_step import replay as position_step_replay
from rope.harness.rotation import case_file as rotation_case_file
from rope.harness.rotation import replay as rotation_replay
from rope.harness.table import case_file as table_case_file
from rope.harness.table import replay as table_replay

EXIT_BAD_INPUT = 2
# Each kind of case file and its replay (every replay module has run_repro and replay_params).
REPLAYS = {rotation_case_file.KIND: rotation_replay, position_ids_case_file.KIND: position_ids_replay,
           table_case_file.KIND: table_replay, fused_case_file.KIND: fused_replay,
           position_step_case_file.KIND: position_step_replay}
# The kinds computed on the host, where --device means nothing.
HOST_KINDS = (position_ids_case_file.KIND,)


def run_repro(args) -> int:
    """The ``repro`` subcommand: the file's kind, then that kind's replay."""
    try:
        _, kind = read_header(args.case)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    fused_impl = getattr(args, "fused_impl", None)
    if fused_impl:
        if kind != fused_case_file.KIND:
            print(f"rope-harness repro: --fused-impl: the case file is of kind {kind!r}, not a fused op's; use --impl",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        if args.impl and args.impl != fused_impl:
            print("rope-harness repro: --impl and --fused-impl name different implementations; give one",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        args.impl = fused_impl
    if kind in HOST_KINDS:
        if args.device:
            print("rope-harness repro: --device: position ids are computed on the host; ignored", file=sys.stderr)
        return REPLAYS[kind].run_repro(args.case, args.impl)
    return REPLAYS[kind].run_repro(args.case, device=args.device, impl=args.impl)


def replay_params(config, kind: str) -> list:
    """The pytest params of every case file of ``kind`` that ``--rope-repro`` names (files, or the
    ``*.json`` of a directory); the files of other kinds are left to their own replay test.  A file
    that cannot be read, or a directory without case files, is a ValueError naming it."""
    params = []
    for path in case_paths(config.getoption("--rope-repro")):
        _, found = read_header(path)
        if found == kind:
            params += REPLAYS[kind].replay_params(Path(path), config)
    return params


def parametrize_replays(metafunc, fixture: str, kind: str, what: str) -> None:
    """A checked thing's replay test's ``pytest_generate_tests``: ``fixture`` parametrized with
    :func:`replay_params` of ``kind``, or one skipped param saying why there is nothing to replay
    (``what``: the thing's name in that reason).  A bad ``--rope-repro`` is a usage error."""
    import pytest
    if fixture not in metafunc.fixturenames:
        return
    params, reason = [], "replays case files: needs --rope-repro CASE"
    if metafunc.config.getoption("--rope-repro"):
        reason = f"no {what} case file given"
        try:
            params = replay_params(metafunc.config, kind)
        except ValueError as exc:
            raise pytest.UsageError(str(exc) if str(exc).startswith("--rope-repro") else f"--rope-repro: {exc}") from None
    metafunc.parametrize(fixture, params or [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-case")])


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
    p.add_argument("--fused-impl", metavar="NAME",
                   help="a fused op's case file: replay against this fused implementation (triton, unfused or "
                        "package.module:callable declaring fused_op), as --impl")
    p.set_defaults(func=run_repro)
