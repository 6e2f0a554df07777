"""pytest options, device x implementation parametrization and Hypothesis profiles.

Options:
  --rope-impl NAME|module:callable     (repeatable) rotation implementations to check; default all built-ins
  --rope-device cpu|cuda|rocm|xpu      (repeatable) restrict to these devices; default every device found
  --rope-positions-impl NAME|module:callable   (repeatable) position-preparation implementations
  --rope-repro CASE                    (repeatable) replay case files (a file, or every *.json in a directory)
                                       through properties/test_repro.py; every other test is deselected
  --rope-shard I/N                     run only shard I of N (a deterministic partition by test id), for
                                       splitting the suite over CI runners or hosts; merge with rope-harness merge

Several GPUs (rope.placement): each GPU test is assigned one visible GPU, round robin, shown in its
id (``triton-cuda:1``); each xdist worker takes its own default GPU; ``-n auto`` is one worker per
GPU plus CPU workers as the cores allow.

Profiles (``--hypothesis-profile``): dev (default, quick), ci (derandomized, loaded when CI is set),
deep (many examples, for a GPU box).
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import HealthCheck, settings

import rope  # noqa: F401  (switches Triton to the interpreter when there is no GPU, before any kernel)
from rope import placement
from rope.campaign import campaign_profile
from rope import report as rope_report
from rope.devices import DEVICE_NAMES, available_devices
from rope.sharding import parse_shard, shard_of
from rope.registry import (
    get_implementation,
    get_positions_implementation,
    implementations,
    positions_implementations,
)

# filter_too_much: draws an implementation does not support are rejected (properties.checks).
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          max_examples=20, suppress_health_check=_SLOW_OK)
settings.register_profile("deep", max_examples=2000, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK)
# rope-harness campaign (rope.campaign): examples per round from the campaign, one example
# database shared by every worker and round, so a failure found anywhere is replayed everywhere.
settings.register_profile("campaign", **campaign_profile(os.environ), suppress_health_check=_SLOW_OK)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Under pytest-xdist every worker is a process: give each its share of the cores instead of
# letting N workers x N torch threads oversubscribe the machine.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    # ... and its own default GPU, round robin over the visible GPUs (rope.placement).
    placement.pin_worker(os.environ.get("PYTEST_XDIST_WORKER"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per visible GPU plus CPU workers as the cores allow."""
    return placement.auto_workers(placement.gpu_count(), placement.usable_cores())


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
    group.addoption("--rope-shard", default=None, metavar="I/N",
                    help="run only shard I of N (0 <= I < N): a deterministic partition of the tests by id, "
                         "so N runners or hosts together run every test exactly once")
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
    """The device kinds to run on (cpu, cuda, rocm, xpu); ``--rope-device cuda:1`` selects the kind
    and, through :func:`selected_gpus`, that GPU."""
    found = available_devices()
    wanted = []
    for label in config.getoption("--rope-device") or found:
        try:
            kind, index = placement.parse_device(label)
        except ValueError as exc:
            raise pytest.UsageError(f"--rope-device: {exc}") from None
        if kind not in found:
            raise pytest.UsageError(f"--rope-device={label!r}: not available here (found {found})")
        if index is not None and index >= placement.gpu_count(kind):
            raise pytest.UsageError(f"--rope-device={label!r}: only {placement.gpu_count(kind)} {kind} GPU(s) visible")
        wanted.append(kind)
    return list(dict.fromkeys(wanted))


def selected_gpus(config, kind: str) -> list[int]:
    """The GPUs of ``kind`` tests are spread over: those named (``--rope-device cuda:1``), else all visible."""
    named = [placement.parse_device(label) for label in config.getoption("--rope-device")]
    indices = [i for k, i in named if k == kind and i is not None]
    if indices and any(k == kind and i is None for k, i in named):
        indices = []     # plain "cuda" beside "cuda:1" means every GPU
    return list(dict.fromkeys(indices)) or list(range(max(1, placement.gpu_count(kind))))


def _device_params(config, combos: list[tuple], ids: list[str]) -> list:
    """pytest params for (..., device) combos: a GPU device becomes one param per selected GPU
    (``cuda:0``, ``cuda:1``, ...), marked ``rope_gpu``; collection keeps one of them per test
    (:func:`_keep_one_gpu_per_test`)."""
    params = []
    for combo, name in zip(combos, ids):
        kind = combo[-1]
        if kind == "cpu":
            params.append(pytest.param(*combo, id=name))
            continue
        for index in selected_gpus(config, kind):
            params.append(pytest.param(*combo, id=f"{name}:{index}", marks=pytest.mark.rope_gpu(kind, index)))
    return params


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
        metafunc.parametrize("positions_impl_name,device",
                             _device_params(metafunc.config, combos, [f"{n}-{d}" for n, d in combos]))
    elif "impl_name" in metafunc.fixturenames and "device" in metafunc.fixturenames:
        impls = selected_implementations(metafunc.config)
        devices = selected_devices(metafunc.config)
        combos = [(name, dev) for name in impls for dev in devices]
        metafunc.parametrize("impl_name,device", _device_params(metafunc.config, combos, [f"{n}-{d}" for n, d in combos]))
    elif "device" in metafunc.fixturenames:
        devices = selected_devices(metafunc.config)
        metafunc.parametrize("device", _device_params(metafunc.config, [(d,) for d in devices], devices))


def _gpu_copy_key(item) -> str:
    """A GPU test's id without its GPU index: the copies of one test on each GPU share it."""
    kind, index = item.get_closest_marker("rope_gpu").args
    return re.sub(rf"(?<![A-Za-z0-9_]){kind}:{index}(?![0-9])", kind, item.nodeid, count=1)


def _keep_one_gpu_per_test(items) -> None:
    """Each GPU test was generated once per GPU; keep the copy whose GPU the round robin over the
    collection order assigns (the same in every xdist worker), so tests spread over the GPUs and
    each runs once."""
    gpu_items = [item for item in items if item.get_closest_marker("rope_gpu")]
    if not gpu_items:
        return
    by_kind = {}
    for item in gpu_items:
        kind, _ = item.get_closest_marker("rope_gpu").args
        by_kind.setdefault(kind, []).append(item)
    keep = set()
    for kind, group in by_kind.items():
        gpus = sorted({item.get_closest_marker("rope_gpu").args[1] for item in group})
        keys = [_gpu_copy_key(item) for item in group]
        assigned = placement.assign_round_robin(keys, gpus)
        keep.update(id(item) for item, key in zip(group, keys)
                    if assigned[key] == item.get_closest_marker("rope_gpu").args[1])
    items[:] = [item for item in items if not item.get_closest_marker("rope_gpu") or id(item) in keep]


def _keep_shard(config, items) -> None:
    text = config.getoption("--rope-shard")
    if text is None:
        return
    try:
        index, count = parse_shard(text)
    except ValueError as exc:
        raise pytest.UsageError(f"--rope-shard: {exc}") from None
    keep = [item for item in items if shard_of(item.nodeid, count) == index]
    config.hook.pytest_deselected(items=[item for item in items if shard_of(item.nodeid, count) != index])
    items[:] = keep


# Modules whose tests run deliberately broken implementations (the suite checking itself): their
# mismatches are the point, so they stay out of the run report, which is about the code under test.
_SELF_TEST_MODULES = {"test_suite_can_fail.py", "test_case_files.py", "test_repro.py"}


@pytest.fixture(autouse=True, scope="module")
def _self_tests_stay_out_of_the_report(request):
    # Module scope: before the modules' own module-scoped fixtures, which run broken code too.
    if request.node.path.name not in _SELF_TEST_MODULES:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(rope_report.DISABLE_ENV, "1")
        yield


@pytest.fixture(autouse=True)
def _rope_on_assigned_gpu(request):
    """A test assigned to GPU k runs with GPU k as the current device."""
    marker = request.node.get_closest_marker("rope_gpu")
    if marker is None:
        yield
        return
    with placement.on_gpu(*marker.args):
        yield



@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A Hypothesis test whose every draw the implementation does not support is skipped with
    the reasons; one where only some were rejected records them in the run report."""
    from hypothesis.errors import Unsatisfiable

    from properties import checks
    checks.REJECTED_UNSUPPORTED.clear()
    try:
        result = yield
    except Unsatisfiable:
        if checks.REJECTED_UNSUPPORTED:
            pytest.skip("; ".join(sorted(checks.REJECTED_UNSUPPORTED)))
        raise
    for reason, count in sorted(checks.REJECTED_UNSUPPORTED.items()):
        rope_report.record(kind="skip", test=pyfuncitem.nodeid.split("[")[0],
                           reason=f"{reason} ({count} Hypothesis draws rejected)")
    return result


def _known_bugs_first(items) -> None:
    """The fixed triggers of every known bug run first (a stable sort, the same in every xdist
    worker): a kernel that reintroduces one fails in seconds, before the Hypothesis searches."""
    items.sort(key=lambda item: 0 if getattr(item, "originalname", item.name).startswith("test_known_bug_triggers")
               else 1)


def pytest_collection_modifyitems(config, items):
    _keep_one_gpu_per_test(items)
    _keep_only_replays(config, items)
    _keep_shard(config, items)
    _known_bugs_first(items)
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
    config.addinivalue_line("markers", "rope_gpu(kind, index): the GPU this test runs on (rope.placement)")
    if (_is_controller(config) and not os.environ.get(rope_report.DISABLE_ENV) and not config.getoption("--rope-repro")
            and not os.environ.get("ROPE_CAMPAIGN")):   # a campaign round records into the campaign's run
        config._rope_run_dir = rope_report.start_run()


def pytest_runtest_logreport(report):
    # Under xdist both the worker and the controller see every report: the controller records.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
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
