"""The harness's pytest plugin, registered under the ``pytest11`` entry point, so ``pip install
rope-harness`` is the whole setup: ``pytest --pyargs properties --rope-impl mypkg.rope:fn`` runs the
property suite against any implementation, from any directory.

Options:
  --rope-impl NAME|module:callable     (repeatable) rotation implementations to check; default all built-ins
  --rope-device cpu|cuda|rocm|xpu      (repeatable) restrict to these devices; default every device found
  --rope-position-step-impl NAME|module:callable  (repeatable) the runner's position step under test
                                       (alias: --rope-positions-impl)
  --rope-position-ids-impl NAME|module:callable  (repeatable) position-id implementations (a model's
                                       get_rope_index: transformers, vllm, sglang); default transformers
  --rope-fused-impl NAME|module:callable  (repeatable) fused-op implementations (triton, unfused)
  --rope-repro CASE                    (repeatable) replay case files (a file, or every *.json in a directory)
                                       through the suite's replay tests (marked replay); every other test is deselected
  --rope-shard I/N                     run only shard I of N (a deterministic partition by test id), for
                                       splitting the suite over CI runners or hosts; merge with rope-harness merge
  --rope-baseline                      also run the serving-engine-style baseline suite
  --rope-mutant-search NAME            (repeatable; all: every one) run the dedicated searches of these mutants
                                       (marked mutant_search); those of other mutants are deselected
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

The hooks are here (pytest finds a plugin's hooks and fixtures among its module's attributes); each
job is a module of this package: activation (whose run and tests these are), profiles, selection
(devices and implementations), rounds, gpus (one GPU per test, shards), device_faults, timeouts,
run_end (the stop at --maxfail, the end-of-run watchdog).
"""

from __future__ import annotations

import os
import time

import pytest

from rope.harness.suite import CHECKED_BY_FIXTURE
from rope.harness.plugin.activation import is_controller, is_rope_test, is_active
from rope.harness.plugin.device_faults import lost_context_reason, note_device_fault, sticky_device_error
from rope.harness.plugin.gpus import gpu_copy_key, keep_one_gpu_per_test, keep_shard, rope_on_assigned_gpu
from rope.harness.plugin.profiles import default_profile, kept_out_of_the_report, load_default_profile
from rope.harness.plugin.rounds import (FAIL_FAST_SHRINK_S, ROUND, apply_round, order_rounds, parametrize_rounds, fail_fast,
                                        rope_round, without_round)
from rope.harness.plugin import compared, failures, run_end, scheduling
from rope.harness.plugin.run_end import (END_STACKS_FILE, LAST_REPORT_AT, arm_end_stacks, arm_stop_file,
                                         note_failure_for_stop, record_profile, record_profile_as_it_goes)
from rope.harness.plugin.selection import (cpu_work_left_out, device_params, keep_builtins_only_for_builtins,
                                           keep_cpu_work_off_gpu_runs, keep_harness_stages_out,
                                           keep_only_asked_mutant_searches, keep_only_replays,
                                           skip_oracle_tests_without_transformers, selected_devices,
                                           selected_implementations, selected_position_ids_implementations,
                                           selected_positions_implementations, selected_table_implementations)
from rope.harness.plugin.timeouts import cap_shrinking, configure_call_timeout, set_test_timeouts, test_timeout

# What other modules, the run's fixtures and the tests reach through the plugin module: pytest finds
# fixtures and hooks among a plugin module's attributes, so the fixtures of the parts are named here.
__all__ = ["FAIL_FAST_SHRINK_S", "END_STACKS_FILE", "MARKERS", "arm_end_stacks", "cap_shrinking", "gpu_copy_key",
           "keep_one_gpu_per_test", "note_failure_for_stop", "rope_on_assigned_gpu", "default_profile",
           "is_active", "kept_out_of_the_report", "load_default_profile", "lost_context_reason", "note_device_fault",
           "rope_round", "sticky_device_error", "without_round"]

MARKERS = (
    "interpreter: runs Triton kernels under TRITON_INTERPRET=1",
    "gpu: needs a GPU",
    "slow: long-running",
    "oracle: compares against an installed external implementation (transformers); skipped where it is not installed",
    "baseline: the serving-engine-style fixed-example suite (--rope-baseline)",
    "rope_gpu(kind, index): the GPU this test runs on (rope.harness.placement)",
    "rotation: takes the rotation implementation under test (--rope-impl); set by the plugin",
    "position_step: takes the runner's position step under test (--rope-position-step-impl); set by the plugin",
    "position_ids: takes the position-id implementation under test (--rope-position-ids-impl); set by the plugin",
    "table: takes the cos/sin table implementation under test (--rope-table-impl); set by the plugin",
    "dispatch: checks the platform dispatch of the built-in operations",
    "fused: takes the fused-op implementation under test (--rope-fused-impl); set by the plugin",
    "prefill: a prefill-size batch (1,024 to 16,384 tokens and past); a campaign leaves these out",
    "harness_stage: run by a rope-harness command (a replay, the baseline, a mutant's guarded search), not a plain run",
    "mutant_search(name): a dedicated test that a property rejects the named mutant (rope-harness mutants runs it "
    "with --rope-mutant-search NAME)",
    "known_bug: a known bug's trigger case, run before the searches",
    "guarded: checks on guarded inputs (guard regions, the interpreter's memory tracer: rope.harness.guards)",
    "backward: checks the backward of an implementation that declares autograd (against the reference VJP)",
    "boundary: a prefill-size boundary case, run right after the known bugs in a run that stops at its first failure",
    "sweep: a fixed sweep over a catalogue (every model at every TP size), run after the searches in a run that "
    "stops at its first failure",
    "traced: calls the implementation inside torch.compile (a Dynamo trace per drawn spec, seconds each on the "
    "CPU): run last in a run that stops at its first failure",
    "stack: meets the installed torch and Triton directly; CI runs it on every stack it supports",
    "replay: replays case files (--rope-repro)",
    "self_test: runs deliberately broken implementations (the suite checking itself): kept out of the run report",
    "needs_no_gpu: work a GPU does not speed up (the CPU bench, the offline compile sweeps, the documents' "
    "commands, the harness's own runs pinned to the CPU): on a run that checks a GPU it runs only with --rope-cpu-work",
    "fixed_cases: runs hand-written cases only (known-bug triggers, the regression corpus, real models' rows, "
    "boundaries at fixed sizes, bad inputs): left out when the drawn cases alone are measured "
    "(rope-harness mutants' drawn-only column)",
    "builtins_only: holds the built-in implementations to what only they promise (the harness's own validation "
    "messages); deselected for any other implementation",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per visible GPU plus CPU workers as the cores allow (harness runs only),
    unless the user set pytest-xdist's own PYTEST_XDIST_AUTO_NUM_WORKERS: then theirs applies."""
    if not is_active(config) or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
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
    group.addoption("--rope-mutant-search", action="append", default=[], metavar="NAME",
                    help="run the dedicated searches of these mutants (catalogue names, kernel:NAME; all: every "
                         "one): the tests marked mutant_search(NAME); those of other mutants are deselected; "
                         "repeatable")
    group.addoption("--rope-position-step-impl", "--rope-positions-impl", action="append", default=[], metavar="NAME",
                    dest="rope_positions_impl",
                    help="the runner's position step under test (name or package.module:callable); repeatable "
                         "(alias: --rope-positions-impl)")
    group.addoption("--rope-position-ids-impl", action="append", default=[], metavar="NAME",
                    help="position-id implementation, fn(family, prompt) -> (positions, delta): transformers, vllm, "
                         "sglang or package.module:callable; repeatable (default: transformers where installed)")
    group.addoption("--rope-table-impl", action="append", default=[], metavar="NAME",
                    help="cos/sin table implementation, fn(spec, max_position, dtype, device) -> cache: ours, "
                         "transformers, vllm, sglang or package.module:callable; repeatable (default: ours)")
    group.addoption("--rope-fused-impl", action="append", default=[], metavar="NAME",
                    help="fused-op implementation (docs/spec.md §10): triton, unfused or package.module:callable "
                         "declaring fused_op; repeatable (default: triton)")
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
    group.addoption("--rope-cpu-work", action="store_true", default=False,
                    help="on a run that checks a GPU, also run the tests marked needs_no_gpu (the CPU bench, the "
                         "offline compile sweeps, the documents' commands, the harness's own runs pinned to the CPU); a run "
                         "without a GPU always runs them")
    group.addoption("--rope-known-defects", default=None, choices=("check", "avoid"),
                    help="the measured upstream defects the adapters declare (wrong values or a raise on some calls): "
                         "check them like every call (default), or avoid them, so a long run of an external "
                         "kernel searches for what is not known yet")


def pytest_generate_tests(metafunc):
    """The suite's tests taking ``impl_name`` (or ``positions_impl_name``) and ``device`` run for
    every implementation on every device; those taking ``position_ids_impl_name`` (no device: the
    ids are integers computed on the host) for every position-id implementation."""
    if not is_rope_test(metafunc):
        return
    parametrize_rounds(metafunc)
    if "fused_impl_name" in metafunc.fixturenames and "device" in metafunc.fixturenames:
        from rope.harness.plugin.selection import selected_fused_implementations
        combos = [(name, dev) for name in selected_fused_implementations(metafunc.config)
                  for dev in selected_devices(metafunc.config)]
        metafunc.parametrize("fused_impl_name,device",
                             device_params(metafunc.config, combos, [f"{n}-{d}" for n, d in combos]))
        return
    if "position_ids_impl_name" in metafunc.fixturenames:
        names = list(selected_position_ids_implementations(metafunc.config))
        if not names:       # nothing installed to check: one skipped test says so
            names = [pytest.param("none", marks=pytest.mark.skip(
                reason="no position-id implementation here: install transformers (pip install '.[oracle]') "
                       "or pass --rope-position-ids-impl"))]
        metafunc.parametrize("position_ids_impl_name", names)
    if "table_impl_name" in metafunc.fixturenames and "device" in metafunc.fixturenames:
        impls = selected_table_implementations(metafunc.config)
        devices = selected_devices(metafunc.config)
        combos = [(name, dev) for name in impls for dev in devices]
        metafunc.parametrize("table_impl_name,device",
                             device_params(metafunc.config, combos, [f"{n}-{d}" for n, d in combos]))
    elif "positions_impl_name" in metafunc.fixturenames and "device" in metafunc.fixturenames:
        impls = selected_positions_implementations(metafunc.config)
        devices = selected_devices(metafunc.config)
        combos = [(name, dev) for name in impls for dev in devices]
        metafunc.parametrize("positions_impl_name,device",
                             device_params(metafunc.config, combos, [f"{n}-{d}" for n, d in combos]))
    elif "impl_name" in metafunc.fixturenames and "device" in metafunc.fixturenames:
        impls = selected_implementations(metafunc.config)
        devices = selected_devices(metafunc.config)
        combos = [(name, dev) for name in impls for dev in devices]
        metafunc.parametrize("impl_name,device", device_params(metafunc.config, combos, [f"{n}-{d}" for n, d in combos]))
    elif "device" in metafunc.fixturenames:
        devices = selected_devices(metafunc.config)
        metafunc.parametrize("device", device_params(metafunc.config, [(d,) for d in devices], devices))


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A Hypothesis test whose every draw the implementation does not support is skipped with
    the reasons; one where only some were rejected records them in the run report.  After a
    sticky GPU fault in this process, later GPU tests are skipped naming the test that faulted."""
    if not is_rope_test(pyfuncitem):
        return (yield)
    from hypothesis.errors import Unsatisfiable

    from rope.harness import draws, profiling, report
    callspec = getattr(pyfuncitem, "callspec", None)
    device = str(callspec.params.get("device", "")) if callspec is not None else ""
    lost = lost_context_reason(device)
    if lost:
        pytest.skip(lost)
    from rope.harness.stop import skip_if_stopped
    skip_if_stopped()
    draws.REJECTED_DRAWS.clear()
    from rope.harness import causes
    causes.forget_case()
    pyfuncitem._rope_comparisons_before = report.COMPARISONS[0]
    restore = apply_round(pyfuncitem) if callspec is not None and ROUND in callspec.params else None
    started, calls_before = time.perf_counter(), profiling.calls()
    # A test expected to fail (a pinned upstream mismatch) writes no case file: its mismatch is known.
    # Marked xfail: none is written; pytest.xfail called in the body (after the mismatch was checked
    # under pytest.raises): the ones the call created are removed.
    from rope.harness import case_files
    expected = pyfuncitem.get_closest_marker("xfail") is not None
    held = os.environ.get(case_files.CASES_DIR_ENV)
    created = case_files.created_count()
    if expected:
        os.environ[case_files.CASES_DIR_ENV] = "off"
    try:
        result = yield
    except Unsatisfiable:
        if draws.REJECTED_DRAWS:
            pytest.skip("; ".join(sorted(draws.REJECTED_DRAWS)))
        raise
    except pytest.xfail.Exception:
        case_files.remove_created_since(created)
        raise
    except BaseException as exc:
        note_device_fault(pyfuncitem.nodeid, device, exc)
        raise
    finally:
        if expected:
            if held is None:
                os.environ.pop(case_files.CASES_DIR_ENV, None)
            else:
                os.environ[case_files.CASES_DIR_ENV] = held
        profiling.add_test(pyfuncitem.nodeid.split("[")[0], time.perf_counter() - started,
                           profiling.calls() - calls_before)
        if restore is not None:
            restore()
    for reason, count in sorted(draws.REJECTED_DRAWS.items()):
        report.record(kind="rejected", test=pyfuncitem.nodeid.split("[")[0], reason=reason, draws=count)
    return result


def pytest_itemcollected(item):
    """Mark each suite test with the checked thing whose implementation it takes (before -m selects)."""
    if not is_rope_test(item):
        return
    for fixture, marker in CHECKED_BY_FIXTURE.items():
        if fixture in getattr(item, "fixturenames", ()):
            item.add_marker(marker)


def pytest_collection_modifyitems(config, items):
    if not is_active(config):
        return
    keep_one_gpu_per_test(items)
    keep_harness_stages_out(config, items)
    keep_only_asked_mutant_searches(config, items)
    keep_only_replays(config, items)
    keep_builtins_only_for_builtins(config, items)
    keep_cpu_work_off_gpu_runs(config, items)
    keep_shard(config, items)
    set_test_timeouts(config, items)
    skip_oracle_tests_without_transformers(items)
    scheduling.longest_first(config, items)
    scheduling.same_case_together(items)
    order_rounds(items)


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
    lines = []
    if cpu_work_left_out(config):
        lines.append("rope-harness: a GPU run: the tests marked needs_no_gpu (the CPU bench, the offline compile "
                     "sweeps, the documents' commands, the harness's own CPU runs) and the CPU's parametrizations "
                     "are left out; --rope-cpu-work runs them (--rope-device cpu beside the GPU, the CPU's checks)")
    return lines + [f"rope-harness: call deadline {f'{call:g} s' if call else 'none'}, per-test timeout {per_test}"]


def pytest_configure(config):
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if not is_active(config):
        return
    config.pluginmanager.register(failures.RestoreFailed(), "rope-harness-restore-failed")
    if is_controller(config):
        config.pluginmanager.register(compared.Verdict(config, failures.COMPARISONS_PROPERTY), compared.PLUGIN_NAME)
        scheduling.steal_work(config)
    _import_named_implementations(config)
    configure_call_timeout(config)
    _configure_known_defects(config)
    if fail_fast(config):
        cap_shrinking(FAIL_FAST_SHRINK_S)
        arm_stop_file(config)
    from rope.devices import configure_triton
    configure_triton()          # before any kernel of the suite is defined (no GPU: the interpreter)
    if os.environ.get("TRITON_INTERPRET") == "1":
        from rope.harness.interpreter import skip_discarded_overflow_checks, skip_repeated_patching
        skip_repeated_patching()    # most of an interpreted kernel's time (rope/harness/interpreter.py)
        skip_discarded_overflow_checks()    # and a third of the rest
    else:
        from rope.harness import compile_lock
        compile_lock.install()      # the run's processes compile each new specialization once
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:triton.*")
    if config.get_verbosity() < 1:
        # NumPy under Triton's interpreter, on the NaN the guards and the non-finite cases feed the
        # masked lanes on purpose: noise in a normal run, still shown with -v.
        config.addinivalue_line("filterwarnings",
                                "ignore:invalid value encountered:RuntimeWarning:triton.runtime.interpreter")
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
        # Each xdist worker is a process: give it its share of the cores instead of letting
        # N workers x N torch threads oversubscribe the machine, and its own default GPU.
        import torch

        from rope.harness import placement
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
        placement.pin_worker(os.environ.get("PYTEST_XDIST_WORKER"))
    from rope.harness import report
    if (is_controller(config) and not os.environ.get(report.DISABLE_ENV) and not config.getoption("--rope-repro")
            and not os.environ.get("ROPE_CAMPAIGN")):   # a campaign round records into the campaign's run
        config._rope_run_dir = report.start_run()


def _import_named_implementations(config) -> None:
    """Every implementation named on the command line is imported before any test: one that cannot
    be (a module not found from the current directory, one that raises) ends the run as a usage
    error with one line naming it, instead of an error in every module that collects it."""
    if config.getoption("--rope-fused-impl"):
        from rope.harness.plugin.selection import selected_fused_implementations
        selected_fused_implementations(config)
    for option, selected in (("--rope-impl", selected_implementations),
                             ("--rope-position-step-impl", selected_positions_implementations),
                             ("--rope-position-ids-impl", selected_position_ids_implementations),
                             ("--rope-table-impl", selected_table_implementations)):
        if config.getoption(option):
            selected(config)


def _configure_known_defects(config) -> None:
    """--rope-known-defects reaches every process (xdist workers, subprocesses) through the environment."""
    from rope.harness.rotation.check import KNOWN_DEFECTS_ENV, known_defects_mode
    value = config.getoption("--rope-known-defects")
    if value is not None:
        os.environ[KNOWN_DEFECTS_ENV] = value
    try:
        known_defects_mode()            # a bad $ROPE_KNOWN_DEFECTS ends the run before any test
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_runtest_logreport(report):
    note_failure_for_stop(report)
    LAST_REPORT_AT[0] = time.perf_counter()
    # Under xdist both the worker and the controller see every report: the controller records.
    if os.environ.get("PYTEST_XDIST_WORKER") or not os.environ.get("ROPE_REPORT_RUN"):
        return
    if report.failed and report.when == "call":
        failures.record_failure(report)
    elif hasattr(report, "wasxfail") and report.when == "call":
        from rope.harness import report as run_report
        run_report.record(kind="expected_failure", test=report.nodeid, reason=str(report.wasxfail))
    elif report.skipped and isinstance(report.longrepr, tuple) and not hasattr(report, "wasxfail"):
        from rope.harness import report as run_report
        run_report.record(kind="skip", test=report.nodeid.split("[")[0], reason=str(report.longrepr[2]))


def pytest_sessionstart(session):
    session.config._rope_session_start = time.perf_counter()
    if is_active(session.config):
        _quiet_xdist_startup(session.config)


def _quiet_xdist_startup(config) -> None:
    """pytest-xdist's "bringing up nodes..." lines (one per start-up step where the output is not a
    terminal) stay out of a normal run; -v shows them.  Its other lines (workers, items, a worker
    down) are kept."""
    trdist = config.pluginmanager.getplugin("terminaldistreporter")
    show = getattr(trdist, "ensure_show_status", None)
    if show is None or config.get_verbosity() > 0:
        return

    def ensure_show_status():
        if trdist.getstatus() != "bringing up nodes...":
            show()
    trdist.ensure_show_status = ensure_show_status


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed suite test: the harness's frames leave its traceback, its cause and the
    comparisons it made go on its report (plugin/failures.py)."""
    if not is_rope_test(item):
        return (yield)
    failures.before_report(item, call)
    before = getattr(item, "_rope_comparisons_before", 0)
    report = yield
    failures.after_report(item, call, report, before)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One block per cause: each cause's smallest case printed in full, the others as a line naming
    it, then the causes and their counts last (plugin/failures.py)."""
    groups = failures.shorten_failures(terminalreporter) if is_active(config) else []
    result = yield
    failures.write_causes(terminalreporter, groups)
    _write_report_line(terminalreporter, config)
    return result


def _write_report_line(terminalreporter, config) -> None:
    paths = getattr(config, "_rope_report_paths", None)
    if paths:
        shutdown, written = getattr(config, "_rope_report_timing", (None, None))
        timing = "" if written is None else (
            f" (written in {written:.1f} s" + ("" if shutdown is None else f", {shutdown:.1f} s after the last test") + ")")
        terminalreporter.write_line(f"rope-harness report: {paths[0]}{timing}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    if not is_active(item.config):
        return
    if nextitem is None:
        arm_end_stacks()
    else:
        record_profile_as_it_goes(item.config)


def pytest_sessionfinish(session, exitstatus):
    if is_active(session.config):
        record_profile(session.config)
        arm_end_stacks()
    stop_file = getattr(session.config, "_rope_stop_file", None)
    if stop_file:
        from rope.harness.stop import STOP_FILE_ENV
        os.environ.pop(STOP_FILE_ENV, None)
        run_end._STOP_AFTER[:] = [0, 0]
        if os.path.exists(stop_file):
            os.remove(stop_file)
    run_dir = getattr(session.config, "_rope_run_dir", None)
    if run_dir is None or not is_controller(session.config):
        return
    from rope.harness import report
    # How long the end of the run takes, said with the report: the workers' shutdown after the last
    # test, then the report itself (a deep run's end must take seconds whatever its size).
    began = time.perf_counter()
    shutdown = began - LAST_REPORT_AT[0] if LAST_REPORT_AT[0] is not None else None
    try:
        session.config._rope_report_paths = report.write_summary(run_dir)
    except Exception as exc:   # noqa: BLE001 - a broken report must not change the test outcome
        session.config._rope_report_paths = [f"(report failed: {type(exc).__name__}: {exc})"]
    session.config._rope_report_timing = (shutdown, time.perf_counter() - began)
