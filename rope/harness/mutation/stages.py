"""Which pytest invocations a mutant gets: its stages, in order, for the harness suite and for the
serving-engine-style baseline, and the arguments of each pytest run.

Test paths are relative to :func:`suite_root`, the directory holding the installed ``properties``
package (a checkout's root, or site-packages), where the runner starts pytest, so node ids read
``properties/...`` wherever the suite is installed.  Test files are read with ``ast``, never imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path

from rope.harness.mutation.catalogue import KINDS, POSITION_KINDS, ROTATION_KINDS, Mutant
from rope.harness.mutation.records import PLUGIN as RECORDS_PLUGIN
from rope.harness.plugin.profiles import DRAWN_SUFFIX
from rope.harness.suite import SUITE_PACKAGE, suite_dir

# The suite's sub-packages (one per checked thing); within rotation, its two files in the order the
# runner wants them (the known-bug triggers and searches before the prefill sizes).
ROTATION_SUITE = f"{SUITE_PACKAGE}/rotation/test_rotation.py"
PREFILL_SUITE = f"{SUITE_PACKAGE}/rotation/test_prefill.py"
MODES_SUITE = f"{SUITE_PACKAGE}/rotation/test_modes.py"
HUGE_TESTS = ("test_huge_batches_match_reference_in_chunks", "test_a_cache_past_2_31_elements_is_indexed_in_64_bits")
GUARDED_FIRST = "test_known_bug_triggers_under_guards"
POSITION_SUITES = (f"{SUITE_PACKAGE}/position_step",)
POSITION_IDS_SUITE = f"{SUITE_PACKAGE}/position_ids"
MUTANTS_TESTS = f"{SUITE_PACKAGE}/test_mutants.py"
DISPATCH_TESTS = f"{SUITE_PACKAGE}/dispatch/test_dispatch.py"
BASELINE_SUITE = f"{SUITE_PACKAGE}/baseline"


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


def functions_in(path: str) -> list[str]:
    """Top-level ``test_*`` functions of a test file, in source order (read with ast, not imported)."""
    tree = ast.parse((suite_root() / path).read_text())
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


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
            return [Stage("huge cases on the GPU (deep profile)", tuple(f"{PREFILL_SUITE}::{t}" for t in HUGE_TESTS),
                          (*opts, "--rope-device", "cuda"), "fail", "--rope-impl", profile="deep")]
        if not m.memory_safety:
            return [Stage("rotation suite", (ROTATION_SUITE, PREFILL_SUITE, MODES_SUITE), opts, "fail", "--rope-impl")]
        names = functions_in(ROTATION_SUITE)
        order = [GUARDED_FIRST] + [n for n in names if n != GUARDED_FIRST]
        return [Stage("rotation suite, guarded known-bug tests first",
                      tuple(f"{ROTATION_SUITE}::{n}" for n in order), opts, "fail", "--rope-impl"),
                Stage("guarded search (test_mutants.py, dedicated)",
                      (f"{MUTANTS_TESTS}::test_rotation_property_catches_kernel_mutant[{m.attribute}]",),
                      (), "pass")]
    if m.kind in POSITION_KINDS:
        stages = [Stage("position suites", POSITION_SUITES, ("--rope-position-step-impl", m.target), "fail",
                        "--rope-position-step-impl")]
        if m.kind == "positions-kernel":
            # Guarded first: unguarded, a kernel writing past its output corrupts the test process's
            # own memory, which may crash it at once or hang it until the budget is spent.
            stages.insert(0, Stage("guarded search (test_mutants.py, dedicated)",
                                   (f"{MUTANTS_TESTS}::test_position_property_catches_kernel_mutant[{m.attribute}]",),
                                   (), "pass"))
        return stages
    if m.kind == "position-ids":
        return [Stage("position-id suite", (POSITION_IDS_SUITE,), ("--rope-position-ids-impl", m.target), "fail",
                      "--rope-position-ids-impl")]
    if m.kind == "dispatch":
        return [Stage("dedicated test (test_dispatch.py)",
                      (f"{DISPATCH_TESTS}::test_dispatch_property_rejects_broken_op[{m.attribute}]",), (), "pass")]
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
    drawn = ("-m", "not fixed_cases") if stage.drawn else ()
    return [*tests, *(stage.options if options is None else options), *drawn, "-x", "-v", "--tb=short",
            "-p", "no:cacheprovider", f"--hypothesis-profile={profile}{DRAWN_SUFFIX if stage.drawn else ''}",
            "--rootdir", str(suite_root()), "-p", RECORDS_PLUGIN]


def command_line(args: list[str], num_tests: int) -> str:
    """The command line of a run, its test list shortened."""
    tests = args[:num_tests] if num_tests <= 3 else args[:2] + [f"... ({num_tests} tests)"]
    return " ".join(["pytest", *tests, *args[num_tests:]])
