"""Which pytest invocations a mutant gets: its stages, in order, for the harness suite and for the
serving-engine-style baseline, and the arguments of each pytest run.

A stage names the suite's sub-package of the mutant's checked thing and selects within it by marker
(``-m``) or by the dedicated searches' option (``--rope-mutant-search NAME``), never by a list of file
or test names.  Test paths are relative to :func:`suite_root`, the directory holding the installed
``properties`` package (a checkout's root, or site-packages), where the runner starts pytest, so node
ids read ``properties/...`` wherever the suite is installed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rope.harness.mutation.catalogue import KINDS, POSITION_KINDS, ROTATION_KINDS, Mutant
from rope.harness.mutation.records import PLUGIN as RECORDS_PLUGIN
from rope.harness.suite import DRAWN_SUFFIX
from rope.harness.suite import SUITE_PACKAGE, suite_dir

# The suite's sub-packages, one per checked thing (and the baseline's).
ROTATION_SUITE = f"{SUITE_PACKAGE}/rotation"
POSITION_SUITES = (f"{SUITE_PACKAGE}/position_step",)
POSITION_IDS_SUITE = f"{SUITE_PACKAGE}/position_ids"
TABLE_SUITE = f"{SUITE_PACKAGE}/table"
DISPATCH_SUITE = f"{SUITE_PACKAGE}/dispatch"
FUSED_SUITE = f"{SUITE_PACKAGE}/fused"
BASELINE_SUITE = f"{SUITE_PACKAGE}/baseline"
# Markers a stage selects by: the tests on guarded inputs, the huge cases (q or the cache past 2^31
# elements: slow), the dedicated searches (each asked for by its mutant's name), and the backward property.
GUARDED, HUGE, SEARCH, BACKWARD = "guarded", "slow", "mutant_search", "backward"
SEARCH_OPTION = "--rope-mutant-search"


def suite_root() -> Path:
    """The directory holding the ``properties`` suite (a checkout's root, or site-packages): the
    stages name tests relative to it, and pytest runs there so node ids read ``properties/...``."""
    return suite_dir().parent


@dataclass(frozen=True)
class Stage:
    """One pytest invocation.  ``caught_when="fail"``: the suite runs on the mutant and a failing
    test catches it; ``"pass"``: a dedicated test asserts the property rejects the mutant, so its
    passing catches it.  ``impl_option`` names the option carrying the mutant (for the control)."""
    label: str
    tests: tuple[str, ...]
    options: tuple[str, ...] = ()
    caught_when: str = "fail"
    impl_option: str | None = None
    profile: str | None = None      # a Hypothesis profile this stage needs, whatever the run's
    drawn: bool = False             # the drawn cases alone: no @example, no test marked fixed_cases


def _search(m: Mutant, suite: str) -> Stage:
    """The mutant's dedicated search in ``suite``: the test that passes when the property rejects it."""
    return Stage(f"dedicated search ({suite.rsplit('/', 1)[-1]})", (suite,), ("-m", SEARCH, SEARCH_OPTION, m.name),
                 "pass")


def drawn_stages(m: Mutant) -> list[Stage]:
    """The harness suite with its fixed cases off: the same stages, each run without Hypothesis'
    @example cases and without the tests marked ``fixed_cases`` (known-bug triggers, the regression
    corpus, real models' rows, boundaries at fixed sizes), so a catch is the drawn cases' own.  A
    mutant that only the fixed huge cases can show (``needs: gpu-deep``) has no drawn suite."""
    if m.needs == "gpu-deep":
        return []
    stages = [replace(stage, drawn=True) for stage in harness_stages(m)]
    # A memory-safety mutant's guarded search (a drawn search) first: the rotation suite's guarded
    # known-bug triggers, which put that suite first, are fixed cases.
    return sorted(stages, key=lambda stage: stage.caught_when != "pass") if m.memory_safety else stages


def harness_stages(m: Mutant) -> list[Stage]:
    """The harness suite for a mutant: the stages run in order until one catches it."""
    if m.kind in ROTATION_KINDS:
        opts = ("--rope-impl", m.target)
        if m.needs == "gpu-deep":
            return [Stage("huge cases on the GPU (deep profile)", (ROTATION_SUITE,),
                          (*opts, "-m", HUGE, "--rope-device", "cuda"), "fail", "--rope-impl", profile="deep")]
        if m.kind == "rotation-backward":
            # The backward property first: a fail-fast run otherwise takes the known bugs' triggers and the
            # prefill boundaries first, minutes of a right forward under the interpreter.
            return [Stage("rotation suite, the backward property", (ROTATION_SUITE,), (*opts, "-m", BACKWARD), "fail",
                          "--rope-impl"),
                    Stage("rotation suite, the other tests", (ROTATION_SUITE,), (*opts, "-m", f"not {BACKWARD}"),
                          "fail", "--rope-impl")]
        if not m.memory_safety:
            return [Stage("rotation suite", (ROTATION_SUITE,), opts, "fail", "--rope-impl")]
        return [Stage("rotation suite, the guarded tests", (ROTATION_SUITE,), (*opts, "-m", GUARDED), "fail",
                      "--rope-impl"),
                Stage("rotation suite, the other tests", (ROTATION_SUITE,), (*opts, "-m", f"not {GUARDED}"), "fail",
                      "--rope-impl"),
                _search(m, ROTATION_SUITE)]
    if m.kind in POSITION_KINDS:
        stages = [Stage("position suites", POSITION_SUITES, ("--rope-position-step-impl", m.target), "fail",
                        "--rope-position-step-impl")]
        if m.kind == "positions-kernel":
            # Guarded first: unguarded, a kernel writing past its output corrupts the test process's
            # own memory, which may crash it at once or hang it until the budget is spent.
            stages.insert(0, _search(m, POSITION_SUITES[0]))
        return stages
    if m.kind == "position-ids":
        return [Stage("position-id suite", (POSITION_IDS_SUITE,), ("--rope-position-ids-impl", m.target), "fail",
                      "--rope-position-ids-impl")]
    if m.kind == "table":
        return [Stage("table suite", (TABLE_SUITE,), ("--rope-table-impl", m.target), "fail", "--rope-table-impl")]
    if m.kind == "fused":
        return [Stage("fused-op suite", (FUSED_SUITE,), ("--rope-fused-impl", m.target), "fail", "--rope-fused-impl")]
    if m.kind == "dispatch":
        return [_search(m, DISPATCH_SUITE)]
    raise ValueError(f"kind={m.kind!r}: must be one of {KINDS}")


def baseline_stages(m: Mutant) -> list[Stage]:
    """The serving-engine-style baseline, for rotation mutants only ([] for the others)."""
    if m.kind not in ROTATION_KINDS:
        return []
    return [Stage("baseline suite", (BASELINE_SUITE,), ("--rope-baseline", "--rope-impl", m.target), "fail",
                  "--rope-impl")]


def build_pytest_args(stage: Stage, tests, profile: str, options=None) -> list[str]:
    """pytest's arguments for a run of ``tests`` (the stage's, or what is left of them): stop at the
    first failure, the records plugin on (the runner judges from its records, the terminal
    output is only kept for ``--logs``)."""
    profile = stage.profile or profile
    opts = list(stage.options if options is None else options)
    if stage.drawn:             # pytest keeps the last -m: one expression, the stage's and the drawn cases'
        if "-m" in opts:
            at = opts.index("-m") + 1
            opts[at] = f"({opts[at]}) and not fixed_cases"
        else:
            opts += ["-m", "not fixed_cases"]
    return [*tests, *opts, "-x", "-v", "--tb=short",
            "-p", "no:cacheprovider", f"--hypothesis-profile={profile}{DRAWN_SUFFIX if stage.drawn else ''}",
            "--rootdir", str(suite_root()), "-p", RECORDS_PLUGIN]


def command_line(args: list[str], num_tests: int) -> str:
    """The command line of a run, its test list shortened."""
    tests = args[:num_tests] if num_tests <= 3 else args[:2] + [f"... ({num_tests} tests)"]
    return " ".join(["pytest", *tests, *args[num_tests:]])
