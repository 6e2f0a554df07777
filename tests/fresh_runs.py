"""A fresh harness run in a subprocess, for the project's tests: the environment of this run less
the variables this run's own pytest, xdist workers and report set (a nested run must start its own
report, case files and workers), optionally less PYTHONPATH (a user's directory is not on it: the
harness must find their module from where they stand); and a pytest run started in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rope.harness.suite import plugin_args, subprocess_env

__all__ = ["RUN_VARIABLES", "fresh_env", "pytest_command", "run_pytest"]

RUN_VARIABLES = ("TRITON_INTERPRET", "ROPE_REPORT_RUN", "ROPE_NO_REPORT", "ROPE_REPORTS_DIR", "ROPE_CASES_DIR",
                 "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS")


def fresh_env(*, keep_pythonpath: bool = True, **extra) -> dict:
    """This process's environment without RUN_VARIABLES (and PYTHONPATH unless kept), the harness
    importable from a bare checkout, then ``extra``."""
    drop = RUN_VARIABLES + (() if keep_pythonpath else ("PYTHONPATH",))
    return subprocess_env({**{k: v for k, v in os.environ.items() if k not in drop}, **extra})


def pytest_command(args: list[str], **env) -> tuple[list[str], dict]:
    """A fresh pytest run's command line and environment: this run's own settings left out, the
    plugin loaded as an installed environment loads it (in a bare checkout: named with -p)."""
    return ([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), *args], fresh_env(**env))


def run_pytest(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    """Run :func:`pytest_command` in ``cwd``; its output captured."""
    command, environment = pytest_command(args, **env)
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600)
