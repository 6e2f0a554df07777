"""The mutation runner (``rope-harness mutants``): does the property suite catch every mutant in
properties/mutants, how fast, with which counterexample; and the serving-engine-style baseline.

One job per module:

=============  ================================================================================
catalogue      the :class:`Mutant` record, the kinds, the catalogue (``python -m
               properties.mutants`` run as a subprocess: rope/ never imports the suite), --only
stages         which pytest invocations a mutant gets, and their arguments
records        the pytest plugin (``-p rope.harness.mutation.records``) writing one JSON line per
               event and test report, and the reader of those lines
outcome        what one pytest run did, read from its records; a failure's assertion and
               Hypothesis' failing example; the table's excerpt
results        the result records and their JSON form (schema ``rope-harness/mutants/1``), exit status
runner         the subprocess / thread runner: budgets, the parent control, false alarms,
               timeouts, crashes
report         the table, OUT/mutants.md and OUT/mutants.json (written atomically)
cli            ``add_mutants_parser``, ``cmd_mutants``, ``main`` (``python -m rope.harness.mutation``)
kernel_mutant  the kernel mutants' machinery: a kernel's modules rebuilt with textual substitutions
               (the bugs themselves: properties/mutants/kernel.py)
searches       the dedicated searches' machinery: a property that must fail, what caught it recorded
=============  ================================================================================

The names below load on first use, so that the records plugin, imported by every pytest run the
runner starts, pulls in nothing else.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "Mutant": "catalogue", "KINDS": "catalogue", "ROTATION_KINDS": "catalogue", "discover_mutants": "catalogue",
    "select_mutants": "catalogue",
    "Stage": "stages", "harness_stages": "stages", "baseline_stages": "stages",
    "SCHEMA": "results", "MutationReport": "results", "MutantResult": "results", "SuiteResult": "results",
    "exit_code": "results",
    "MutationRunner": "runner", "RawRun": "runner", "run": "runner",
    "markdown": "report", "print_table": "report", "write_reports": "report",
    "add_mutants_parser": "cli", "cmd_mutants": "cli", "main": "cli",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
