"""Where the property suite is: the installed ``properties`` package, found without importing it
(the harness runs the suite through pytest, never imports it), and whether a pytest invocation
runs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SUITE_PACKAGE = "properties"

# The checked things: the plugin marks a suite test that takes an implementation of one with its
# name, so a run selects them with -m (rope-harness check does) whatever file they live in;
# ``dispatch`` is set by its tests' module.
CHECKED_BY_FIXTURE = {"impl_name": "rotation", "positions_impl_name": "position_step",
                      "position_ids_impl_name": "position_ids", "table_impl_name": "table"}
CHECKED_THINGS = ("rotation", "position_step", "position_ids", "table", "dispatch")
# The fused ops (docs/spec.md §10): their tests take ``fused_impl_name``.
CHECKED_BY_FIXTURE["fused_impl_name"] = "fused"
CHECKED_THINGS = (*CHECKED_THINGS[:-1], "fused", CHECKED_THINGS[-1])
# The exit status of a run, check or campaign that compared nothing against the reference (every
# case unsupported, every test skipped): pytest's "no tests ran", never a green 0.
NOTHING_COMPARED_EXIT = 5
# The Hypothesis profiles of the drawn cases alone: the suite's profiles with this suffix, without
# their @example cases (rope.harness.plugin.profiles registers them, rope-harness mutants' drawn-only
# run loads them, with the tests marked fixed_cases deselected).
DRAWN_SUFFIX = "-drawn"
# What a run tells the command that started it (rope-harness check reads both, the plugin writes
# them): the junit property carrying a test's comparisons, and the name the plugin's per-run
# verdict registers under (rope.harness.plugin.compared).
COMPARISONS_PROPERTY = "rope_comparisons"
COMPARED_PLUGIN_NAME = "rope-harness-compared"


def suite_dir() -> Path:
    """The directory of the ``properties`` package (a checkout's or the installed wheel's)."""
    spec = importlib.util.find_spec(SUITE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"rope-harness: the test suite package {SUITE_PACKAGE!r} is not installed "
                         f"(pip install -e . in a checkout, or pip install a wheel built there)")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def suite_path(*parts: str) -> Path:
    """A file or directory of the suite, e.g. ``suite_path("rotation", "test_rotation.py")``."""
    return suite_dir().joinpath(*parts)


def is_suite_module(module_name: str | None) -> bool:
    """True for the suite's own test modules (``properties.rotation.test_rotation``, ...)."""
    return bool(module_name) and module_name.split(".", 1)[0] == SUITE_PACKAGE


def runs_suite(args: list[str], pyargs: bool) -> bool:
    """Whether pytest's arguments select the suite (a path into it, or ``--pyargs properties...``)."""
    try:
        root = suite_dir()
    except SystemExit:
        return False
    for arg in args:
        target = arg.split("::", 1)[0]
        if pyargs and is_suite_module(target):
            return True
        path = Path(target).resolve()
        if path == root or root in path.parents:
            return True
        # A checkout's suite beside an installed one: the same package, by its ownership marker.
        for candidate in (path, *path.parents):
            if candidate.name == SUITE_PACKAGE and _is_ours(candidate / "__init__.py"):
                return True
    return False


def plugin_registered() -> bool:
    """Whether pytest loads the harness's plugin by itself (the installed pytest11 entry point)."""
    from importlib import metadata
    return any(entry.value == "rope.harness.plugin" for entry in metadata.entry_points(group="pytest11"))


def subprocess_env(env: dict | None = None) -> dict:
    """An environment for a Python subprocess that must import the harness and its suite from any
    working directory: the directory holding them goes first on PYTHONPATH (a checkout used without
    ``pip install`` is importable only from its root otherwise; for an installed one it changes nothing)."""
    import os
    out = dict(os.environ if env is None else env)
    root = str(suite_dir().parent)
    out["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [out.get("PYTHONPATH")])])
    return out


def plugin_args() -> list[str]:
    """pytest arguments that load the harness's plugin where the entry point does not (a checkout
    used without ``pip install``)."""
    return [] if plugin_registered() else ["-p", "rope.harness.plugin"]


def _is_ours(init: Path) -> bool:
    """Whether a package's ``__init__.py`` carries rope-harness's ownership marker."""
    from rope.harness.ownership import MARKER
    try:
        return MARKER in init.read_text(encoding="utf-8")
    except OSError:
        return False
