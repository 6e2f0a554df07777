"""The harness's pytest plugin, registered under the ``pytest11`` entry point, so ``pip install
rope-harness`` is the whole setup: ``pytest --pyargs properties --rope-impl mypkg.rope:fn`` runs the
property suite against any implementation, from any directory.

Options:
  --rope-impl NAME|module:callable     (repeatable) rotation implementations to check; default all built-ins
  --rope-device cpu|cuda|rocm|xpu      (repeatable) restrict to these devices; default every device found
  --rope-positions-impl NAME|module:callable   (repeatable) position-preparation implementations
  --rope-position-ids-impl NAME|module:callable  (repeatable) position-id implementations (a model's
                                       get_rope_index: transformers, vllm, sglang); default transformers
  --rope-repro CASE                    (repeatable) replay case files (a file, or every *.json in a directory)
                                       through the suite's test_repro.py; every other test is deselected
  --rope-shard I/N                     run only shard I of N (a deterministic partition by test id), for
                                       splitting the suite over CI runners or hosts; merge with rope-harness merge
  --rope-baseline                      also run the serving-engine-style baseline suite
  --rope-call-timeout SECONDS          the deadline of one implementation call (default 120; 0: none): a call
                                       past it fails its test with a case file (rope.harness.deadline)
  --rope-test-timeout SECONDS          the per-test timeout, through pytest-timeout's thread method (default
                                       900, 3600 in the deep and campaign profiles; 0: none); pytest-timeout's
                                       own --timeout, ini or PYTEST_TIMEOUT take precedence

Installed plugins load into every pytest run of the environment, so this one stays inert unless the
run is the harness's: a ``--rope-*`` option is given, or the arguments select the ``properties``
suite (rope.harness.suite.runs_suite).  Only the suite's test modules are parametrized; torch, Triton
and the kernels are imported only then.

Several GPUs (rope.harness.placement): each GPU test is assigned one visible GPU, round robin, shown
in its id (``triton-cuda:1``); each xdist worker takes its own default GPU; ``-n auto`` is one worker
per GPU plus CPU workers as the cores allow.

Reports and case files go to ``./reports`` of the working directory (``ROPE_REPORTS_DIR`` moves them).

Profiles (``--hypothesis-profile``): dev (default, quick), ci (derandomized, the default when CI is
set), deep (many examples, for a GPU box), explicit (the @example cases only), campaign
(rope-harness campaign).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from rope.harness.suite import CHECKED_BY_FIXTURE, is_suite_module, runs_suite

# filter_too_much: draws an implementation does not support are rejected (rope.harness.comparison).
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          max_examples=20, suppress_health_check=_SLOW_OK)
settings.register_profile("deep", max_examples=2000, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK)
# The @example cases only, no search: fixed launches, e.g. for lab/bench/sanitize_kernels.py under memcheck.
settings.register_profile("explicit", phases=[Phase.explicit], deadline=None, database=None,
                          suppress_health_check=_SLOW_OK)
if os.environ.get("ROPE_CAMPAIGN"):
    # A rope-harness campaign round: its examples per test and the example database every worker
    # and round shares (rope.harness.campaign), so a failure found anywhere is replayed everywhere.
    from rope.harness.campaign import campaign_profile

    settings.register_profile("campaign", **campaign_profile(os.environ), suppress_health_check=_SLOW_OK)


def default_profile() -> str:
    """The profile the suite loads when ``--hypothesis-profile`` is not given."""
    return "ci" if os.environ.get("CI") else "dev"


def load_default_profile(config) -> None:
    """Load :func:`default_profile` unless the run names one: a test directory's conftest calls it
    from ``pytest_configure``, before the test modules are imported, so that their @settings inherit
    the profile's values."""
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(default_profile())


def kept_out_of_the_report(module_names: set[str]):
    """An autouse, module-scoped fixture for a conftest: the tests of the modules named (file names)
    run deliberately broken implementations, so their mismatches stay out of the run report, which
    is about the code under test.  Module scope: before the modules' own module-scoped fixtures,
    which run broken code too."""
    @pytest.fixture(autouse=True, scope="module")
    def _kept_out_of_the_report(request):
        if request.node.path.name not in module_names:
            yield
            return
        from rope.harness import report
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(report.DISABLE_ENV, "1")
            yield
    return _kept_out_of_the_report


_OPTIONS = ("--rope-impl", "--rope-device", "--rope-positions-impl", "--rope-position-ids-impl", "--rope-repro", "--rope-shard", "--rope-baseline",
            "--rope-call-timeout", "--rope-test-timeout")
# Seconds a test may run before pytest-timeout ends it (its worker, under xdist): a hang that the
# call deadline cannot interrupt (C code, a GPU kernel) still ends, as one failed test.
TEST_TIMEOUT_S = {"deep": 3600.0, "campaign": 3600.0}
DEFAULT_TEST_TIMEOUT_S = 900.0
_MARKERS = (
    "interpreter: runs Triton kernels under TRITON_INTERPRET=1",
    "gpu: needs a GPU",
    "slow: long-running",
    "oracle: compares against an installed external implementation (transformers); skipped where it is not installed",
    "baseline: the serving-engine-style fixed-example suite (--rope-baseline)",
    "rope_gpu(kind, index): the GPU this test runs on (rope.harness.placement)",
    "rotation: takes the rotation implementation under test (--rope-impl); set by the plugin",
    "position_step: takes the runner's position step under test (--rope-positions-impl); set by the plugin",
    "position_ids: takes the position-id implementation under test (--rope-position-ids-impl); set by the plugin",
    "dispatch: checks the platform dispatch of the built-in operations",
)


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


def _rope_test(item_or_metafunc) -> bool:
    """A test the harness parametrizes and marks: the suite's, or one of the project's own tests."""
    module = getattr(item_or_metafunc, "module", None)
    if is_suite_module(getattr(module, "__name__", None)):
        return True
    return _in_own_tests(item_or_metafunc.config, getattr(module, "__file__", None))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per visible GPU plus CPU workers as the cores allow (harness runs only)."""
    if not is_active(config):
        return None
    from rope.harness import placement
    return placement.auto_workers(placement.gpu_count(), placement.usable_cores())


def pytest_addoption(parser):
    parser.addini("rope_harness_test_dirs", type="linelist", default=[],
                  help="a project's own test directories that run on the harness's machinery like its suite")
    group = parser.getgroup("rope", "rope-harness")
    group.addoption("--rope-impl", action="append", default=[], metavar="NAME",
                    help="rotation implementation (registered name or package.module:callable); repeatable")
    group.addoption("--rope-device", action="append", default=[], metavar="DEVICE",
                    help="restrict to these devices (cpu, cuda, rocm, xpu; cuda:1 picks a GPU); repeatable")
    group.addoption("--rope-baseline", action="store_true", default=False,
                    help="also run the serving-engine-style baseline suite (properties/baseline)")
    group.addoption("--rope-positions-impl", action="append", default=[], metavar="NAME",
                    help="position-preparation implementation (name or package.module:callable); repeatable")
    group.addoption("--rope-position-ids-impl", action="append", default=[], metavar="NAME",
                    help="position-id implementation, fn(family, prompt) -> (positions, delta): transformers, vllm, "
                         "sglang or package.module:callable; repeatable (default: transformers where installed)")
    group.addoption("--rope-shard", default=None, metavar="I/N",
                    help="run only shard I of N (0 <= I < N): a deterministic partition of the tests by id, "
                         "so N runners or hosts together run every test exactly once")
    group.addoption("--rope-repro", action="append", default=[], metavar="CASE",
                    help="replay a case file (reports/cases/<id>.json) or every *.json in a directory; repeatable; "
                         "--rope-impl / --rope-device override the recorded implementation / device; "
                         "for a file outside the project write --rope-repro=PATH")
    group.addoption("--rope-call-timeout", default=None, metavar="SECONDS",
                    help="deadline of one implementation call (default $ROPE_CALL_TIMEOUT or 120; 0: none): a call "
                         "past it fails its test, with a case file")
    group.addoption("--rope-test-timeout", default=None, type=float, metavar="SECONDS",
                    help="per-test timeout through pytest-timeout (default 900; 3600 in the deep and campaign "
                         "profiles; 0: none); --timeout / PYTEST_TIMEOUT take precedence")
    group.addoption("--rope-known-defects", default=None, choices=("check", "avoid"),
                    help="the measured upstream defects the adapters declare (wrong values or a raise on some calls): "
                         "check them like every call (default), or avoid them, so a long run of an external "
                         "kernel searches for what is not known yet")


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
    from rope.devices import available_devices
    from rope.harness import placement
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
    from rope.harness import placement
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
    from rope.registry import get_implementation, implementations
    return _selected(config, "--rope-impl", implementations, get_implementation)


def selected_positions_implementations(config) -> dict:
    from rope.registry import get_positions_implementation, positions_implementations
    return _selected(config, "--rope-positions-impl", positions_implementations, get_positions_implementation)


def selected_position_ids_implementations(config) -> dict:
    from rope.harness.position_ids import get_position_ids_implementation, position_ids_implementations
    return _selected(config, "--rope-position-ids-impl", position_ids_implementations, get_position_ids_implementation)


def pytest_generate_tests(metafunc):
    """The suite's tests taking ``impl_name`` (or ``positions_impl_name``) and ``device`` run for
    every implementation on every device; those taking ``position_ids_impl_name`` (no device: the
    ids are integers computed on the host) for every position-id implementation."""
    if not _rope_test(metafunc):
        return
    _parametrize_rounds(metafunc)
    if "position_ids_impl_name" in metafunc.fixturenames:
        names = list(selected_position_ids_implementations(metafunc.config))
        if not names:       # nothing installed to check: one skipped test says so
            names = [pytest.param("none", marks=pytest.mark.skip(
                reason="no position-id implementation here: install transformers (pip install '.[oracle]') "
                       "or pass --rope-position-ids-impl"))]
        metafunc.parametrize("position_ids_impl_name", names)
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


# ------------------------------------------------------------------ rounds: copies of each Hypothesis test
# A campaign (rope.harness.campaign) and a fail-fast run give every Hypothesis test one copy per
# round ([round0-...], [round1-...]), ordered by round, each copy with its round's examples and seed.
ROUND = "rope_round"


def without_round(nodeid: str) -> str:
    """A test id without its round: ``t[round2-native-cpu]`` -> ``t[native-cpu]``."""
    nodeid = re.sub(r"(?<=[\[-])round\d+(?:-|(?=\]))", "", nodeid)
    return nodeid.replace("[]", "").replace("-]", "]")


@pytest.fixture(autouse=True)
def rope_round(request):
    """The round of this copy of a Hypothesis test (None in a run without rounds)."""
    return getattr(request, "param", None)


# A run that stops at its first failure (-x, --maxfail: a kernel engineer's quick check, the mutation
# runner) first gives every Hypothesis test FIRST_PASS_EXAMPLES examples, then the profile's: a bug
# that shows in one variant is found when the scheduler reaches that variant's first pass, not after
# the full searches of every test before it; and Hypothesis shrinks for at most FAIL_FAST_SHRINK_S.
FIRST_PASS_EXAMPLES = 3
FAIL_FAST_SHRINK_S = 20


def fail_fast(config) -> bool:
    return bool(config.getoption("maxfail", 0))


def hypothesis_rounds(config) -> list[tuple[int | None, int | None]]:
    """(examples, seed) per copy of each Hypothesis test: a campaign's rounds, the fail-fast first
    pass and then the profile's own examples (None: the profile's examples, its own seed), or none."""
    from rope.harness.campaign import campaign_rounds
    rounds = campaign_rounds(os.environ)
    if rounds:
        return rounds
    if fail_fast(config) and not config.getoption("--rope-repro"):
        return [(FIRST_PASS_EXAMPLES, None), (None, None)]
    return []


def _parametrize_rounds(metafunc) -> None:
    """In a campaign session, every Hypothesis test once per round: the processes, their compiled
    kernels and memoized tables live through all rounds instead of starting again per round.  In
    a fail-fast run, a first pass of a few examples, then the search."""
    rounds = hypothesis_rounds(metafunc.config)
    if len(rounds) > 1 and getattr(metafunc.function, "is_hypothesis_test", False):
        metafunc.parametrize(ROUND, range(len(rounds)), ids=[f"round{i}" for i in range(len(rounds))],
                             indirect=True)


def _round_of(item) -> int:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(ROUND, 0) if callspec is not None else 0


def _order_rounds(items) -> None:
    """Rounds in order: every test's round 0, then every test's round 1, ...  (a stable
    sort, after the suite's own ordering in properties/conftest.py: within a round it holds)."""
    if any(_round_of(item) for item in items):
        items.sort(key=_round_of)


def _apply_round(item):
    """Set the round's examples and seed on this copy of a Hypothesis test, and the database key of
    the test without the round (a failure saved by one round is replayed first by the next);
    returns the function that puts the test's own settings and seed back."""
    examples, seed = hypothesis_rounds(item.config)[_round_of(item)]
    fn = getattr(item.obj, "__func__", item.obj)
    saved = (fn._hypothesis_internal_use_settings, fn._hypothesis_internal_use_seed)
    if examples is not None:
        fn._hypothesis_internal_use_settings = settings(parent=saved[0], max_examples=examples)
    if seed is not None:
        fn._hypothesis_internal_use_seed = seed
    item.obj.hypothesis.inner_test._hypothesis_internal_add_digest = without_round(item.nodeid).encode()

    def restore():
        fn._hypothesis_internal_use_settings, fn._hypothesis_internal_use_seed = saved
    return restore


def _gpu_copy_key(item) -> str:
    """A GPU test's id without its GPU index: the copies of one test on each GPU share it."""
    kind, index = item.get_closest_marker("rope_gpu").args
    return re.sub(rf"(?<![A-Za-z0-9_]){kind}:{index}(?![0-9])", kind, item.nodeid, count=1)


def _keep_one_gpu_per_test(items) -> None:
    """Each GPU test was generated once per GPU; keep the copy whose GPU the round robin over the
    collection order assigns (the same in every xdist worker), so tests spread over the GPUs and
    each runs once."""
    from rope.harness import placement
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
    from rope.harness.sharding import parse_shard, shard_of
    try:
        index, count = parse_shard(text)
    except ValueError as exc:
        raise pytest.UsageError(f"--rope-shard: {exc}") from None
    keep = [item for item in items if shard_of(item.nodeid, count) == index]
    config.hook.pytest_deselected(items=[item for item in items if shard_of(item.nodeid, count) != index])
    items[:] = keep


@pytest.fixture(autouse=True)
def _rope_on_assigned_gpu(request):
    """A test assigned to GPU k runs with GPU k as the current device."""
    marker = request.node.get_closest_marker("rope_gpu")
    if marker is None:
        yield
        return
    from rope.harness import placement
    with placement.on_gpu(*marker.args):
        yield


# A kernel fault (an illegal or misaligned address) leaves the process's GPU context unusable:
# every later GPU call in it fails with the same sticky error.  Measured on the H200 with four
# external kernels in one run: one fault failed 60 later tests of that worker.  The faulting test
# fails with its error; the worker's later GPU tests are skipped, naming it, instead of failing.
STICKY_DEVICE_ERRORS = ("illegal memory access", "misaligned address", "unspecified launch failure",
                        "illegal instruction", "device-side assert triggered", "hipErrorIllegalAddress")
_LOST_CONTEXT: list[str] = []          # the test whose fault took this process's GPU context


def sticky_device_error(exc: BaseException) -> str | None:
    """The first line of a sticky GPU error in ``exc``, its causes or its group, else None."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        text = str(e)
        if any(pattern in text for pattern in STICKY_DEVICE_ERRORS) and ("CUDA" in text or "HIP" in text
                                                                        or "hip" in text):
            return text.strip().splitlines()[0][:200]
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return None


def note_device_fault(nodeid: str, device: str, exc: BaseException) -> None:
    if not _LOST_CONTEXT and device.startswith(("cuda", "rocm")):
        error = sticky_device_error(exc)
        if error:
            _LOST_CONTEXT.append(f"{nodeid} ({error})")


def lost_context_reason(device: str) -> str | None:
    if _LOST_CONTEXT and device.startswith(("cuda", "rocm")):
        return (f"this process's GPU context was lost to a kernel fault in {_LOST_CONTEXT[0]}: every later "
                f"GPU call in it fails; run this test in a fresh process")
    return None


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A Hypothesis test whose every draw the implementation does not support is skipped with
    the reasons; one where only some were rejected records them in the run report.  After a
    sticky GPU fault in this process, later GPU tests are skipped naming the test that faulted."""
    if not _rope_test(pyfuncitem):
        return (yield)
    from hypothesis.errors import Unsatisfiable

    from rope.harness import comparison, profiling, report
    callspec = getattr(pyfuncitem, "callspec", None)
    device = str(callspec.params.get("device", "")) if callspec is not None else ""
    lost = lost_context_reason(device)
    if lost:
        pytest.skip(lost)
    from rope.harness.stop import skip_if_stopped
    skip_if_stopped()
    comparison.REJECTED_DRAWS.clear()
    restore = _apply_round(pyfuncitem) if callspec is not None and ROUND in callspec.params else None
    started, calls_before = time.perf_counter(), profiling.calls()
    try:
        result = yield
    except Unsatisfiable:
        if comparison.REJECTED_DRAWS:
            pytest.skip("; ".join(sorted(comparison.REJECTED_DRAWS)))
        raise
    except BaseException as exc:
        note_device_fault(pyfuncitem.nodeid, device, exc)
        raise
    finally:
        profiling.add_test(pyfuncitem.nodeid.split("[")[0], time.perf_counter() - started,
                           profiling.calls() - calls_before)
        if restore is not None:
            restore()
    for reason, count in sorted(comparison.REJECTED_DRAWS.items()):
        report.record(kind="rejected", test=pyfuncitem.nodeid.split("[")[0], reason=reason, draws=count)
    return result


def pytest_itemcollected(item):
    """Mark each suite test with the checked thing whose implementation it takes (before -m selects)."""
    if not _rope_test(item):
        return
    for fixture, marker in CHECKED_BY_FIXTURE.items():
        if fixture in getattr(item, "fixturenames", ()):
            item.add_marker(marker)


def pytest_collection_modifyitems(config, items):
    if not is_active(config):
        return
    _keep_one_gpu_per_test(items)
    _keep_only_replays(config, items)
    _keep_shard(config, items)
    _set_test_timeouts(config, items)
    _skip_oracle_tests_without_transformers(items)
    _order_rounds(items)


def _skip_oracle_tests_without_transformers(items) -> None:
    """Tests marked ``oracle`` compare against transformers: where it is not installed (the
    ``oracle`` extra is optional) they skip and say what to install, whatever they import first."""
    import importlib.util
    if importlib.util.find_spec("transformers") is not None:
        return
    skip = pytest.mark.skip(reason="transformers not installed: pip install 'rope-harness[oracle]'")
    for item in items:
        if _rope_test(item) and item.get_closest_marker("oracle") is not None:
            item.add_marker(skip)


def _profile(config) -> str:
    return getattr(config.option, "hypothesis_profile", None) or default_profile()


def test_timeout(config) -> float | None:
    """The per-test timeout this run gives the suite's tests (None: none), or None when the user
    configured pytest-timeout directly (then theirs applies)."""
    if (getattr(config.option, "timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT")
            or _ini(config, "timeout")):
        return None
    seconds = config.getoption("--rope-test-timeout")
    if seconds is None:
        seconds = TEST_TIMEOUT_S.get(_profile(config), DEFAULT_TEST_TIMEOUT_S)
    if not seconds >= 0:
        raise pytest.UsageError(f"--rope-test-timeout={seconds}: must be >= 0 (0: no per-test timeout)")
    return seconds or None


def _ini(config, name):
    try:
        return config.getini(name)
    except ValueError:          # pytest-timeout not installed: no such ini key
        return None


def _set_test_timeouts(config, items) -> None:
    seconds = test_timeout(config)
    if seconds is None or not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        if _rope_test(item) and item.get_closest_marker("timeout") is None:
            # thread: stacks are dumped and the process ends (under xdist the worker is replaced and
            # only this test fails); the signal method could not interrupt C code.
            item.add_marker(pytest.mark.timeout(seconds, method="thread"))


def pytest_report_header(config):
    if not is_active(config):
        return None
    from rope.harness.deadline import call_timeout
    seconds = test_timeout(config)
    if seconds is not None and not config.pluginmanager.hasplugin("timeout"):
        per_test = "none (pytest-timeout is not installed: pip install pytest-timeout)"
    else:
        per_test = f"{seconds:g} s" if seconds else "pytest-timeout's settings"
    call = call_timeout()
    return f"rope-harness: call deadline {f'{call:g} s' if call else 'none'}, per-test timeout {per_test}"


# ------------------------------------------------------------------ configuration and the run report
def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    for line in _MARKERS:
        config.addinivalue_line("markers", line)
    if not is_active(config):
        return
    _configure_call_timeout(config)
    _configure_known_defects(config)
    if fail_fast(config):
        _cap_shrinking(FAIL_FAST_SHRINK_S)
        _arm_stop_file(config)
    from rope.devices import configure_triton
    configure_triton()          # before any kernel of the suite is defined (no GPU: the interpreter)
    if os.environ.get("TRITON_INTERPRET") == "1":
        from rope.harness.interpreter import skip_repeated_patching
        skip_repeated_patching()    # most of an interpreted kernel's time (rope/harness/interpreter.py)
    else:
        from rope.harness import compile_lock
        compile_lock.install()      # the run's processes compile each new specialization once
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:triton.*")
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
        # Each xdist worker is a process: give it its share of the cores instead of letting
        # N workers x N torch threads oversubscribe the machine, and its own default GPU.
        import torch

        from rope.harness import placement
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
        placement.pin_worker(os.environ.get("PYTEST_XDIST_WORKER"))
    from rope.harness import report
    if (_is_controller(config) and not os.environ.get(report.DISABLE_ENV) and not config.getoption("--rope-repro")
            and not os.environ.get("ROPE_CAMPAIGN")):   # a campaign round records into the campaign's run
        config._rope_run_dir = report.start_run()


def _cap_shrinking(seconds: float) -> None:
    """Hypothesis shrinks a failure for up to 5 minutes (its MAX_SHRINKING_SECONDS; under the Triton
    interpreter every step is a kernel run): a fail-fast run reports after ``seconds`` with the
    smallest example found so far.  A Hypothesis without that constant keeps its own limit."""
    from hypothesis.internal.conjecture import engine
    if isinstance(getattr(engine, "MAX_SHRINKING_SECONDS", None), (int, float)):
        engine.MAX_SHRINKING_SECONDS = min(engine.MAX_SHRINKING_SECONDS, seconds)


def _configure_call_timeout(config) -> None:
    """--rope-call-timeout reaches every process (xdist workers, subprocesses) through the environment."""
    from rope.harness.deadline import CALL_TIMEOUT_ENV, call_timeout
    value = config.getoption("--rope-call-timeout")
    if value is None:
        return
    previous = os.environ.get(CALL_TIMEOUT_ENV)
    os.environ[CALL_TIMEOUT_ENV] = str(value)
    try:
        call_timeout()
    except ValueError as exc:
        if previous is None:
            os.environ.pop(CALL_TIMEOUT_ENV)
        else:
            os.environ[CALL_TIMEOUT_ENV] = previous
        raise pytest.UsageError(str(exc).replace(CALL_TIMEOUT_ENV, "--rope-call-timeout")) from None


def _configure_known_defects(config) -> None:
    """--rope-known-defects reaches every process (xdist workers, subprocesses) through the environment."""
    from rope.harness.comparison import KNOWN_DEFECTS_ENV, known_defects_mode
    value = config.getoption("--rope-known-defects")
    if value is not None:
        os.environ[KNOWN_DEFECTS_ENV] = value
    try:
        known_defects_mode()            # a bad $ROPE_KNOWN_DEFECTS ends the run before any test
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _arm_stop_file(config) -> None:
    """The controller of a fail-fast run names the stop file (rope.harness.stop) for its workers."""
    from rope.harness.stop import STOP_FILE_ENV
    if _is_controller(config) and not os.environ.get(STOP_FILE_ENV):
        import tempfile
        config._rope_stop_file = os.path.join(tempfile.gettempdir(), f"rope-stop-{os.getpid()}-{time.time_ns()}")
        os.environ[STOP_FILE_ENV] = config._rope_stop_file      # the workers, started later, inherit it
        _STOP_AFTER[:] = [config.getoption("maxfail"), 0]


_STOP_AFTER = [0, 0]      # [--maxfail, failures seen] in the controller of a fail-fast run


def _note_failure_for_stop(report) -> None:
    """The controller counts failures; at --maxfail it tells the workers to stop (rope.harness.stop).
    (Only a fail-fast run's controller arms the count: workers and other runs return at once.)"""
    if not _STOP_AFTER[0]:
        return
    if report.failed and report.when == "call":
        _STOP_AFTER[1] += 1
        if _STOP_AFTER[1] >= _STOP_AFTER[0]:
            from rope.harness.stop import request_stop
            request_stop()


_LAST_REPORT_AT = [None]      # when this process last heard of a test (the end of a run's tests)


def pytest_runtest_logreport(report):
    _note_failure_for_stop(report)
    _LAST_REPORT_AT[0] = time.perf_counter()
    # Under xdist both the worker and the controller see every report: the controller records.
    if os.environ.get("PYTEST_XDIST_WORKER") or not os.environ.get("ROPE_REPORT_RUN"):
        return
    if report.skipped and isinstance(report.longrepr, tuple) and not hasattr(report, "wasxfail"):
        from rope.harness import report as run_report
        run_report.record(kind="skip", test=report.nodeid.split("[")[0], reason=str(report.longrepr[2]))


def pytest_sessionstart(session):
    session.config._rope_session_start = time.perf_counter()


def _record_profile(config) -> None:
    """This process's time per phase (rope.harness.profiling) as one record of the run report."""
    from rope.harness import profiling, report
    started = getattr(config, "_rope_session_start", None)
    totals = profiling.snapshot()
    if started is None or not totals["counts"].get("tests"):
        return
    totals["seconds"]["session"] = round(time.perf_counter() - started, 6)
    report.record(kind="profile", **totals)


END_STACKS_ENV = "ROPE_END_STACKS_S"
END_STACKS_AFTER_S = 120.0
_END_STACKS_FILE: list = []


def _arm_end_stacks() -> None:
    """A run that hangs at its end says where.  Each process, when the teardown of its last test
    begins (session fixtures included) or else when its session ends (the xdist controller), arms
    faulthandler's watchdog (a C thread: it fires even while Python is blocked in C code): if the
    process is still alive ``$ROPE_END_STACKS_S`` seconds later (default 120; 0 or off: never),
    every thread's Python stack goes to ``end-stacks-<worker>-<pid>.txt`` in the run's record
    directory.  A process that gets as far as its exit handlers did not hang (Python joins the
    threads that would hold it before it runs them): it removes its file there, written or not (an
    xdist worker done early waits idle for the controller, and its stacks say only that), and
    points the watchdog at stderr for the rest of its shutdown."""
    from rope.harness.report import RUN_ENV
    run = os.environ.get(RUN_ENV)
    raw = os.environ.get(END_STACKS_ENV, "").strip().lower()
    try:
        seconds = END_STACKS_AFTER_S if not raw else 0.0 if raw == "off" else float(raw)
    except ValueError:
        return
    if not run or not seconds > 0 or not os.path.isdir(run):
        return
    import atexit
    import faulthandler
    if _END_STACKS_FILE:
        # Armed at the last teardown: again at the session's end (pytest's faulthandler_timeout,
        # where set, cancels the watchdog after each test), for the time left, and not at all once
        # it has fired.  The watchdog reads the other threads' frames without the GIL: safe on a
        # process that is stuck, not on one still running Python (a second dump while the report
        # is written, or while the exit handlers run, can crash the process).
        out, armed_at = _END_STACKS_FILE
        if os.fstat(out.fileno()).st_size > 0:
            return
        left = seconds - (time.monotonic() - armed_at)
        faulthandler.dump_traceback_later(left if left > 0 else seconds, repeat=False, file=out)
        return
    path = os.path.join(run, f"end-stacks-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.txt")
    try:
        out = open(path, "w")           # noqa: SIM115 - held open for the watchdog until the exit handlers
    except OSError:
        return
    armed_at = time.monotonic()
    _END_STACKS_FILE[:] = [out, armed_at]
    faulthandler.dump_traceback_later(seconds, repeat=False, file=out)

    def at_exit():
        faulthandler.cancel_dump_traceback_later()
        out.close()
        with contextlib.suppress(OSError):
            os.remove(path)
        left = seconds - (time.monotonic() - armed_at)
        if left > 0 and sys.__stderr__ is not None:
            faulthandler.dump_traceback_later(left, repeat=False, file=sys.__stderr__)
    atexit.register(at_exit)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None and is_active(item.config):
        _arm_end_stacks()


def pytest_sessionfinish(session, exitstatus):
    if is_active(session.config):
        _record_profile(session.config)
        _arm_end_stacks()
    stop_file = getattr(session.config, "_rope_stop_file", None)
    if stop_file:
        from rope.harness.stop import STOP_FILE_ENV
        os.environ.pop(STOP_FILE_ENV, None)
        _STOP_AFTER[:] = [0, 0]
        if os.path.exists(stop_file):
            os.remove(stop_file)
    run_dir = getattr(session.config, "_rope_run_dir", None)
    if run_dir is None or not _is_controller(session.config):
        return
    from rope.harness import report
    # How long the end of the run takes, said with the report: the workers' shutdown after the last
    # test, then the report itself (a deep run's end must take seconds whatever its size).
    began = time.perf_counter()
    shutdown = began - _LAST_REPORT_AT[0] if _LAST_REPORT_AT[0] is not None else None
    try:
        session.config._rope_report_paths = report.write_summary(run_dir)
    except Exception as exc:   # noqa: BLE001 - a broken report must not change the test outcome
        session.config._rope_report_paths = [f"(report failed: {type(exc).__name__}: {exc})"]
    session.config._rope_report_timing = (shutdown, time.perf_counter() - began)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    paths = getattr(config, "_rope_report_paths", None)
    if paths:
        shutdown, written = getattr(config, "_rope_report_timing", (None, None))
        timing = "" if written is None else (
            f" (written in {written:.1f} s" + ("" if shutdown is None else f", {shutdown:.1f} s after the last test") + ")")
        terminalreporter.write_line(f"rope-harness report: {paths[0]}{timing}")
