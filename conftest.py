"""pytest options, device x implementation parametrization and Hypothesis profiles.

Options:
  --rope-impl NAME|module:callable     (repeatable) rotation implementations to check; default all built-ins
  --rope-device cpu|cuda|rocm|xpu      (repeatable) restrict to these devices; default every device found
  --rope-positions-impl NAME|module:callable   (repeatable) position-preparation implementations
  --rope-repro CASE                    (repeatable) replay case files (a file, or every *.json in a directory)
                                       through properties/test_repro.py; every other test is deselected

Profiles (``--hypothesis-profile``): dev (default, quick), ci (derandomized, loaded when CI is set),
deep (many examples, for a GPU box).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

import rope  # noqa: F401  (switches Triton to the interpreter when there is no GPU, before any kernel)
from rope import report as rope_report
from rope.devices import DEVICE_NAMES, available_devices
from rope.registry import (
    get_implementation,
    get_positions_implementation,
    implementations,
    positions_implementations,
)

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          max_examples=20, suppress_health_check=_SLOW_OK)
settings.register_profile("deep", max_examples=2000, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Under pytest-xdist every worker is a process: give each its share of the cores instead of
# letting N workers x N torch threads oversubscribe the machine.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_addoption(parser):
    group = parser.getgroup("rope", "rope-harness")
    group.addoption("--rope-impl", action="append", default=[], metavar="NAME",
                    help="rotation implementation (registered name or package.module:callable); repeatable")
    group.addoption("--rope-device", action="append", default=[], metavar="DEVICE",
                    help=f"restrict to these devices ({', '.join(DEVICE_NAMES)}); repeatable")
    group.addoption("--rope-baseline", action="store_true", default=False,
                    help="also run the serving-engine-style baseline suite (properties/baseline)")
    group.addoption("--rope-positions-impl", action="append", default=[], metavar="NAME",
                    help="position-preparation implementation (name or package.module:callable); repeatable")
    group.addoption("--rope-repro", action="append", default=[], metavar="CASE",
                    help="replay a case file (reports/cases/<id>.json) or every *.json in a directory; repeatable; "
                         "--rope-impl / --rope-device override the recorded implementation / device; "
                         "for a file outside the project write --rope-repro=PATH")


def _keep_only_replays(config, items):
    """With --rope-repro, run the replay only (properties/test_repro.py)."""
    if not config.getoption("--rope-repro"):
        return
    keep = [item for item in items if item.path.name == "test_repro.py"]
    config.hook.pytest_deselected(items=[item for item in items if item.path.name != "test_repro.py"])
    items[:] = keep


def selected_devices(config) -> list[str]:
    found = available_devices()
    wanted = config.getoption("--rope-device") or found
    for name in wanted:
        if name not in DEVICE_NAMES:
            raise pytest.UsageError(f"--rope-device={name!r}: must be one of {DEVICE_NAMES}")
        if name not in found:
            raise pytest.UsageError(f"--rope-device={name!r}: not available here (found {found})")
    return list(dict.fromkeys(wanted))


def _selected(config, option: str, builtins, resolve) -> dict:
    """The implementations named by a repeatable option (names or module:callable), else all built-ins."""
    names = config.getoption(option)
    if not names:
        return builtins()
    try:
        return {name: resolve(name) for name in names}
    except ValueError as exc:
        raise pytest.UsageError(f"{option}: {exc}") from None


def selected_implementations(config) -> dict:
    return _selected(config, "--rope-impl", implementations, get_implementation)


def selected_positions_implementations(config) -> dict:
    return _selected(config, "--rope-positions-impl", positions_implementations, get_positions_implementation)


def pytest_generate_tests(metafunc):
    """Tests taking ``impl_name`` (or ``positions_impl_name``) and ``device`` run for every
    implementation on every device."""
    if "positions_impl_name" in metafunc.fixturenames and "device" in metafunc.fixturenames:
        impls = selected_positions_implementations(metafunc.config)
        devices = selected_devices(metafunc.config)
        combos = [(name, dev) for name in impls for dev in devices]
        metafunc.parametrize("positions_impl_name,device", combos, ids=[f"{n}-{d}" for n, d in combos])
    elif "impl_name" in metafunc.fixturenames and "device" in metafunc.fixturenames:
        impls = selected_implementations(metafunc.config)
        devices = selected_devices(metafunc.config)
        combos = [(name, dev) for name in impls for dev in devices]
        metafunc.parametrize("impl_name,device", combos, ids=[f"{n}-{d}" for n, d in combos])
    elif "device" in metafunc.fixturenames:
        devices = selected_devices(metafunc.config)
        metafunc.parametrize("device", devices, ids=devices)



def pytest_collection_modifyitems(config, items):
    _keep_only_replays(config, items)
    if config.getoption("--rope-baseline"):
        return
    skip = pytest.mark.skip(reason="baseline suite: run with --rope-baseline (rope-harness mutants does)")
    for item in items:
        if "baseline" in item.keywords:
            item.add_marker(skip)


# ------------------------------------------------------------------ the run report (rope.report)
def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    if _is_controller(config) and not os.environ.get(rope_report.DISABLE_ENV) and not config.getoption("--rope-repro"):
        config._rope_run_dir = rope_report.start_run()


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple) and not hasattr(report, "wasxfail"):
        rope_report.record(kind="skip", test=report.nodeid.split("[")[0], reason=str(report.longrepr[2]))


def pytest_sessionfinish(session, exitstatus):
    run_dir = getattr(session.config, "_rope_run_dir", None)
    if run_dir is None or not _is_controller(session.config):
        return
    try:
        session.config._rope_report_paths = rope_report.write_summary(run_dir)
    except Exception as exc:   # noqa: BLE001 - a broken report must not change the test outcome
        session.config._rope_report_paths = [f"(report failed: {type(exc).__name__}: {exc})"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    paths = getattr(config, "_rope_report_paths", None)
    if paths:
        terminalreporter.write_line(f"rope-harness report: {paths[0]}")
