"""``rope-harness mutants``: run the property suite against every mutant in properties/mutants and
report, for each, whether it was caught, how long the suite took to its first failure and the
shrunk counterexample; next to it, the same for the serving-engine-style baseline suite.

    rope-harness mutants [--profile ci|dev] [--only NAME ...] [--no-baseline] [--jobs N] [--out DIR]
                         [--budget S] [--limit S] [--no-confirm] [--logs] [--list]

Writes OUT/mutants.json and OUT/mutants.md (OUT defaults to ./reports, or $ROPE_REPORTS_DIR),
atomically, and prints a table: mutant, kind, caught by the harness? seconds, caught by the
baseline? seconds, the shrunk counterexample.  ``--logs`` keeps each pytest run's output and its
records under OUT/mutants-logs/.

Exit status: 0 when the harness catches every mutant; 1 when any survives it (or its run ends in
a timeout, a crash or a pytest error); 2 on bad options (or a catalogue that cannot be read).  A
catch slower than ``--limit`` (60 s of suite time) is flagged in the table and the reports but
does not change the status.

How each kind of mutant is run (one pytest subprocess per suite run, ``-x``,
``--hypothesis-profile``, ``-p rope.harness.mutation.records``; ``ROPE_CASES_DIR=off`` and
``ROPE_NO_REPORT=1``, so deliberate failures write no case files and no run report).  Each stage is
the sub-package of the mutant's checked thing, selected within by marker (rope/harness/mutation/stages.py):

=================  ============================================================================
rotation           wrappers of rope.native: properties/rotation with
                   ``--rope-impl properties.mutants.broken_rotations:NAME``; caught = a test fails
rotation-kernel    source-patched Triton kernels: the same with
                   ``--rope-impl properties.mutants.kernel:NAME``.  The memory-safety bugs (only
                   the guards/tracer of rope/harness/guards.py see them) run the tests marked
                   ``guarded`` first, then the others, then, should that not catch them, the
                   mutant's dedicated guarded search (``-m mutant_search --rope-mutant-search
                   kernel:NAME``: caught = it passes)
positions          broken position loops: properties/position_step with
                   ``--rope-position-step-impl``; caught = a test fails
positions-kernel   the position kernel's mutants: their dedicated guarded search first, then
                   the plain suite (which runs an unmasked store unguarded: the process may
                   crash, which is recorded but is no catch)
dispatch           op classes, not registry implementations: their dedicated tests in
                   properties/dispatch (``-m mutant_search --rope-mutant-search dispatch:NAME``;
                   caught = it passes)
=================  ============================================================================

The baseline (properties/baseline, ``--rope-baseline``) runs against every rotation mutant.

A failure counts as a catch only if it is the mutant's doing: the failing test's id must name the
mutant, and (unless ``--no-confirm``) the same test must pass on the mutant's unmutated parent
(rope.native, the Triton kernel, or broken_positions.correct_loop).  A failure the parent shares is
a *false alarm*: it is recorded and the suite continues with the tests after it.  Each mutant's
suite gets ``--budget`` seconds of wall time; past it the mutant counts as not caught (timeout).

Seconds: ``wall_s`` is the wall time of the pytest subprocesses (until ``-x`` stops them),
``pytest_s`` pytest's own session duration; the limit applies to the suite time, pytest's
duration where it reported one, else the wall time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rope.harness.mutation.catalogue import CatalogueError, discover_mutants, kind_label, select_mutants
from rope.harness.mutation.report import print_table, write_reports
from rope.harness.mutation.results import exit_code
from rope.harness.mutation.runner import DEFAULT_BUDGET_S, DEFAULT_LIMIT_S, PROFILES, run
from rope.harness.mutation.stages import DISPATCH_SUITE, baseline_stages, drawn_stages, harness_stages


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="ci", choices=PROFILES, help="Hypothesis profile of the suites (default ci)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run this mutant only (kernel:neox_for_gptj, a bare name for every mutant of that name, or "
                        "an import path); repeatable")
    p.add_argument("--no-baseline", action="store_true", help="skip the serving-engine-style baseline suite")
    p.add_argument("--no-drawn", action="store_true",
                   help="skip the drawn-only run (the harness with its @example cases and fixed-case tests off)")
    p.add_argument("--jobs", type=_positive(int), default=2, help="mutant suites run in parallel (default 2)")
    p.add_argument("--out", default=None, help="directory for mutants.json / mutants.md (default ./reports)")
    p.add_argument("--budget", type=_positive(float), default=DEFAULT_BUDGET_S,
                   help=f"wall seconds one mutant's suite may use (default {DEFAULT_BUDGET_S:.0f})")
    p.add_argument("--limit", type=_positive(float), default=DEFAULT_LIMIT_S,
                   help=f"a catch slower than this many seconds of suite time is flagged "
                        f"(default {DEFAULT_LIMIT_S:.0f})")
    p.add_argument("--no-confirm", action="store_true",
                   help="count every failure naming the mutant as a catch, without rerunning it on the parent")
    p.add_argument("--logs", action="store_true",
                   help="keep every pytest output and its records under OUT/mutants-logs/")
    p.add_argument("--list", action="store_true", help="list the mutants and their suites, run nothing")


def cmd_mutants(args) -> int:
    """The ``mutants`` sub-command (``args`` from :func:`add_arguments`); returns the exit status."""
    from rich.console import Console
    console = Console(width=max(180, Console().width))
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        mutants = select_mutants(discover_mutants(), args.only)
    except (ValueError, CatalogueError) as exc:
        err.print(f"rope-harness mutants: {exc}", markup=False)
        return 2
    if args.list:
        for m in mutants:
            console.print(f"{m.name}  [{kind_label(m)}]  {m.doc}", highlight=False, markup=False)
            for stage in harness_stages(m) + drawn_stages(m) + baseline_stages(m):
                tests = " ".join(stage.tests[:2]) + (" ..." if len(stage.tests) > 2 else "")
                when = "a test fails" if stage.caught_when == "fail" else "the test passes"
                drawn = " [drawn cases only]" if stage.drawn else ""
                console.print(f"    {stage.label}{drawn}: {tests} {' '.join(stage.options)} (caught when {when})",
                              highlight=False, markup=False)
        return 0
    from rope.harness.report import reports_dir
    out = Path(args.out) if args.out else reports_dir()
    err.print(f"rope-harness mutants: {len(mutants)} mutants, profile {args.profile}, {args.jobs} jobs, baseline "
              f"{'off' if args.no_baseline else 'on'}, drawn cases alone {'off' if args.no_drawn else 'on'}; "
              f"dispatch mutants run through their dedicated tests in {DISPATCH_SUITE}")
    report = run([m.name for m in mutants], profile=args.profile, baseline=not args.no_baseline,
                 drawn=not args.no_drawn, jobs=args.jobs,
                 budget_s=args.budget, limit_s=args.limit, confirm=not args.no_confirm,
                 log_dir=out / "mutants-logs" if args.logs else None,
                 progress=lambda line: err.print(line, markup=False))
    print_table(report, console)
    for path in write_reports(report, out):
        console.print(f"wrote {path}", highlight=False, markup=False)
    return exit_code(report)


def add_mutants_parser(sub) -> None:
    """Register ``mutants`` on the CLI's sub-parsers (``args.func(args)`` returns the exit status)."""
    p = sub.add_parser("mutants", help="run the property suite (and the baseline) against every mutant",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_mutants)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rope-harness mutants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """``rope-harness mutants`` as a function: ``main(["--only", "key_unrotated", "--no-baseline"])``."""
    args = build_parser().parse_args(argv)
    return cmd_mutants(args)


if __name__ == "__main__":
    sys.exit(main())
