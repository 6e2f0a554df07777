"""Whether a pytest run is the harness's, and which tests it parametrizes: the suite's, and a
project's own test directories where pyproject declares them (rope_harness_test_dirs); an installed
plugin stays inert everywhere else."""

from __future__ import annotations

from pathlib import Path

from rope.harness.suite import is_suite_module, runs_suite


_OPTIONS = ("--rope-impl", "--rope-device", "--rope-position-step-impl", "--rope-position-ids-impl", "--rope-fused-impl", "--rope-repro", "--rope-shard", "--rope-baseline",
            "--rope-mutant-search", "--rope-call-timeout", "--rope-test-timeout")


def _own_test_dirs(config) -> tuple[Path, ...]:
    """Directories of a project's own tests that run on the harness's machinery like the suite
    (the ini option ``rope_harness_test_dirs``, relative to the ini file: this repository's tests/).
    Empty unless a project sets it, so an installed plugin stays inert in everyone else's runs."""
    dirs = getattr(config, "_rope_own_test_dirs", None)
    if dirs is None:
        base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
        dirs = tuple((base / d).resolve() for d in config.getini("rope_harness_test_dirs"))
        config._rope_own_test_dirs = dirs
    return dirs


def _in_own_tests(config, path) -> bool:
    dirs = _own_test_dirs(config)
    if not dirs or path is None:
        return False
    path = Path(path).resolve()
    return any(path == d or d in path.parents for d in dirs)


def is_active(config) -> bool:
    """Whether this pytest run is the harness's (cached on the config)."""
    active = getattr(config, "_rope_active", None)
    if active is None:
        args = [str(a) for a in config.args]
        active = (any(config.getoption(name) for name in _OPTIONS)
                  or runs_suite(args, bool(getattr(config.option, "pyargs", False)))
                  or any(_in_own_tests(config, a.split("::", 1)[0]) for a in args))
        config._rope_active = active
    return active


def is_rope_test(item_or_metafunc) -> bool:
    """A test the harness parametrizes and marks: the suite's, or one of the project's own tests."""
    module = getattr(item_or_metafunc, "module", None)
    if is_suite_module(getattr(module, "__name__", None)):
        return True
    return _in_own_tests(item_or_metafunc.config, getattr(module, "__file__", None))


# ------------------------------------------------------------------ configuration and the run report
def is_controller(config) -> bool:
    return not hasattr(config, "workerinput")
