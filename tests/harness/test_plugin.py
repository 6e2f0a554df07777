"""The installed plugin (rope.harness.plugin, the pytest11 entry point): it serves the suite from
any directory, writes into the working directory's ./reports (or ROPE_REPORTS_DIR), and stays
inert in pytest runs that are not the harness's: an environment with rope-harness installed runs
other projects' tests exactly as before."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rope.harness.suite import is_suite_module, runs_suite, subprocess_env, suite_dir, suite_path
from properties.strategies import KINDS
from tests.fresh_runs import pytest_command, run_pytest

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

_FOREIGN_TEST = '''
import os, sys

def test_untouched(device, request):
    assert device == "theirs"                                    # their fixture, not our parametrization
    assert "TRITON_INTERPRET" not in os.environ                  # no interpreter switch
    assert not any(m.startswith("torch") for m in sys.modules)   # nothing heavy imported
    assert not request.node.get_closest_marker("rope_gpu")
'''
_FOREIGN_CONFTEST = '''
import pytest

@pytest.fixture
def device():
    return "theirs"
'''


def test_plugin_is_inert_in_another_projects_run(tmp_path):
    (tmp_path / "test_theirs.py").write_text(_FOREIGN_TEST)
    (tmp_path / "conftest.py").write_text(_FOREIGN_CONFTEST)
    run = run_pytest(["-q", "test_theirs.py"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert not (tmp_path / "reports").exists(), "a foreign run must not write a rope-harness report"
    assert "rope-harness report" not in run.stdout



_OWN_TEST = '''
def test_own(device):
    assert device == "cpu"
'''


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_a_projects_own_test_dir_runs_on_the_harness_only_where_declared(tmp_path, declared):
    # pyproject's rope_harness_test_dirs (this repository's tests/): tests there get the suite's
    # device parametrization when run alone; without the declaration the same file is another
    # project's test, and the plugin leaves it alone (its `device` fixture does not exist).
    (tmp_path / "mytests").mkdir()
    (tmp_path / "mytests" / "test_mine.py").write_text(_OWN_TEST)
    ini = "[pytest]\n" + ("rope_harness_test_dirs = mytests\n" if declared else "")
    (tmp_path / "pytest.ini").write_text(ini)
    run = run_pytest(["-q", "mytests/test_mine.py", "--collect-only"], tmp_path)
    out = run.stdout + run.stderr
    if declared:
        assert run.returncode == 0 and "test_own[cpu]" in out, out[-2000:]
    else:
        assert "test_own[" not in out, out[-2000:]


def test_suite_runs_from_any_directory_and_reports_there(tmp_path):
    run = run_pytest(["-q", "--pyargs", "properties.rotation.test_rotation", "-k", "known_bug_triggers_match_reference and native-cpu-gptj-paired-neox-glm41v"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "reports" / "summary.md").is_file(), run.stdout
    assert not (suite_dir().parent / "reports" / ".records" / "never").exists()
    # The end of the run says how long it took: the report, and the time since the last test.
    assert re.search(r"rope-harness report: .*summary\.md \(written in [0-9.]+ s, [0-9.]+ s after the last test\)",
                     run.stdout), run.stdout[-1000:]


def test_reports_dir_follows_the_environment(tmp_path):
    target = tmp_path / "elsewhere"
    run = run_pytest(["-q", "--pyargs", "properties.rotation.test_rotation", "-k", "known_bug_triggers_match_reference and native-cpu-gptj-paired-neox-glm41v"], tmp_path,
                  ROPE_REPORTS_DIR=str(target))
    assert run.returncode == 0, run.stdout + run.stderr
    assert (target / "summary.md").is_file() and not (tmp_path / "reports").exists()


def test_suite_is_found_without_importing_it():
    assert (suite_dir() / "rotation" / "test_rotation.py").is_file()
    assert suite_path("regressions").is_dir()
    assert is_suite_module("properties.rotation.test_rotation") and not is_suite_module("myproject.test_x")
    assert not is_suite_module(None)


@pytest.mark.parametrize("args, pyargs, expected", [
    (["properties"], True, True),
    (["properties.rotation.test_rotation::test_x"], True, True),
    (["tests/test_mine.py"], False, False),
    (["myproject"], True, False),
])
def test_runs_suite_recognises_the_suite(args, pyargs, expected):
    assert runs_suite(args, pyargs) is expected


def test_runs_suite_recognises_paths_into_the_suite(tmp_path):
    assert runs_suite([str(suite_path("rotation", "test_rotation.py")) + "::test_x"], False)
    assert runs_suite([str(suite_dir())], False)
    assert not runs_suite([str(tmp_path)], False)


def _python(code: str, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{suite_dir().parent}"
    return subprocess.run([sys.executable, "-c", code], cwd=pythonpath, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_foreign_package_named_like_ours_stops_the_harness(tmp_path):
    # The refactoring library `rope` (or any `properties`) earlier on the path shadows ours: the
    # harness stops at import with a message naming the package, instead of mixing the two.
    (tmp_path / "properties").mkdir()
    (tmp_path / "properties" / "__init__.py").write_text('"""Somebody else\'s properties."""\n')
    run = _python("import rope.harness", tmp_path)
    assert run.returncode != 0
    assert "rope-harness cannot run here: 'properties' at" in run.stderr and "not to rope-harness" in run.stderr
    assert "virtual environment of its own" in run.stderr
    cli = _python("from rope.harness.cli import main; main(['devices'])", tmp_path)
    assert cli.returncode != 0 and "rope-harness cannot run here" in cli.stderr


def test_an_overwritten_init_stops_the_harness(tmp_path):
    # A non-editable install of the other `rope` overwrites rope/__init__.py and leaves our
    # subpackages beside it: the harness must notice that its package is not its own.
    import shutil
    shutil.copytree(suite_dir().parent / "rope", tmp_path / "rope", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "rope" / "__init__.py").write_text('"""rope, a python refactoring library"""\nVERSION = "1.13"\n')
    run = _python("import rope.harness.plugin", tmp_path)
    assert run.returncode != 0 and f"'rope' at {tmp_path / 'rope' / '__init__.py'} belongs to" in run.stderr


def test_our_packages_carry_the_marker():
    from rope.harness.ownership import foreign_packages
    assert foreign_packages() == []


def test_a_sticky_gpu_fault_skips_the_processes_later_gpu_tests(monkeypatch):
    # One kernel's illegal address leaves the process's GPU context unusable; the later GPU tests of
    # that worker are skipped naming the faulting test, CPU tests run on, ordinary errors change nothing.
    from rope.harness import plugin
    from rope.harness.plugin import device_faults
    monkeypatch.setattr(device_faults, "_LOST_CONTEXT", [])
    fault = RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...")
    wrapped = AssertionError("liger on cuda does not match the reference")
    wrapped.__cause__ = fault
    assert plugin.sticky_device_error(wrapped) == "CUDA error: an illegal memory access was encountered"
    assert plugin.sticky_device_error(ExceptionGroup("draws", [ValueError("x"), fault])) is not None
    assert plugin.sticky_device_error(AssertionError("mismatch: an illegal memory access pattern")) is None

    plugin.note_device_fault("test_a[cpu]", "cpu", fault)              # not a GPU test: nothing lost
    plugin.note_device_fault("test_b[cuda:0]", "cuda:0", ValueError("wrong"))
    assert plugin.lost_context_reason("cuda:0") is None
    plugin.note_device_fault("test_c[cuda:0]", "cuda:0", wrapped)
    plugin.note_device_fault("test_d[cuda:0]", "cuda:0", fault)         # the first fault is the one named
    reason = plugin.lost_context_reason("cuda:1")
    assert reason and "test_c[cuda:0] (CUDA error: an illegal memory access was encountered)" in reason
    assert plugin.lost_context_reason("cpu") is None


# ------------------------------------------------------------------ fail-fast runs
def test_a_fail_fast_run_gives_every_search_a_first_pass(tmp_path):
    # -x: each Hypothesis test twice, round0 (FIRST_PASS_EXAMPLES examples) for all before any
    # round1 (the profile's); a full run keeps one copy per test.
    args = ["--collect-only", "-q", "--pyargs", "properties.rotation.test_rotation", "--rope-impl", "native",
            "--rope-device", "cpu", "-k", "test_rotation_matches_reference and fp32"]
    quick = run_pytest(["-x", *args], tmp_path).stdout.splitlines()
    ids = [line for line in quick if "::" in line]
    rounds = [int(line.split("[round")[1][0]) for line in ids]
    variants = 2 * len(KINDS)           # kinds x pairings
    assert len(ids) == 2 * variants and rounds == sorted(rounds) == [0] * variants + [1] * variants, ids
    full = [line for line in run_pytest(args, tmp_path).stdout.splitlines() if "::" in line]
    assert len(full) == variants and not any("round" in line for line in full)


def test_a_fail_fast_run_caps_shrinking():
    from hypothesis.internal.conjecture import engine

    from rope.harness.plugin import FAIL_FAST_SHRINK_S, cap_shrinking
    before = engine.MAX_SHRINKING_SECONDS
    try:
        cap_shrinking(FAIL_FAST_SHRINK_S)
        assert engine.MAX_SHRINKING_SECONDS == min(before, FAIL_FAST_SHRINK_S)
    finally:
        engine.MAX_SHRINKING_SECONDS = before


def test_a_stopped_run_skips_the_next_check(tmp_path, monkeypatch):
    from rope.harness import plugin, stop
    from rope.harness.rotation import check as rotation_check
    from rope.harness.rotation.cases import RotationCase
    from rope.native import rotate_native
    from rope.spec import RopeSpec
    case = RotationCase(RopeSpec(64, 64, True, None), 2, 1, 1, "float32")
    monkeypatch.setenv(stop.STOP_FILE_ENV, str(tmp_path / "stop"))
    assert rotation_check.evaluate_case("native", rotate_native, case, "cpu").comparison.ok     # not stopped
    # The controller stops the workers at --maxfail failures, not before.
    from rope.harness.plugin import run_end
    monkeypatch.setattr(run_end, "_STOP_AFTER", [2, 0])
    failed = type("Report", (), {"failed": True, "when": "call"})()
    plugin.note_failure_for_stop(failed)
    assert not stop.stop_requested()
    plugin.note_failure_for_stop(failed)
    assert stop.stop_requested()
    with pytest.raises(pytest.skip.Exception, match="stopped at another worker's failure"):
        rotation_check.evaluate_case("native", rotate_native, case, "cpu")


def test_a_fail_fast_run_ends_at_the_first_failure_not_the_other_workers_test(tmp_path):
    # Two workers: one checks the GLM-4.1V trigger with an implementation that fails it in seconds,
    # the other a 2,000-example interpreted search of the Triton kernel, minutes of work.  The stop
    # must end that search at its next example: it is reported skipped for the other worker's
    # failure.  No clock is read: without the stop the search runs to its end and passes, and the
    # verdict says so (lab/bench/first_failure.py measured that run ending 99.6 s later).
    # The CPU under the interpreter on every machine: on a GPU box the trigger would also run on the
    # GPU (a second failure) and the CPU search would not exist without the interpreter.
    # An enclosing run's stop file in the environment (this test inside a `pytest -x` worker) must
    # not stand in for the run's own: it is never created, so the run has to arm its own.
    run = run_pytest(["-x", "-n", "2", "-q", "-rfs", "--hypothesis-profile", "deep", "properties/rotation/test_rotation.py",
                   "--rope-device", "cpu",
                   "--rope-impl", "properties.mutants.broken_rotations:neox_for_gptj", "--rope-impl", "triton", "-k",
                   "(test_known_bug_triggers_match_reference and neox_for_gptj and gptj-paired-neox-glm41v)"
                   " or (test_rotation_matches_reference and round1 and triton-cpu-bf16-chunked3-neox)"],
                  Path(__file__).resolve().parents[2], CI="true", ROPE_CASES_DIR="off", ROPE_NO_REPORT="1",
                  TRITON_INTERPRET="1", ROPE_STOP_FILE=str(tmp_path / "enclosing-run-stop"))
    out = run.stdout + run.stderr
    # pytest's closing line (plugins may warn after it, e.g. pytest-benchmark under xdist).
    closing = [line for line in out.splitlines() if re.match(r"=*\s*\d+ (failed|passed|skipped|error)", line)][-1:]
    closing = closing[0] if closing else ""
    assert "FAILED properties/rotation/test_rotation.py::test_known_bug_triggers_match_reference" in out, out[-3000:]
    # The search (round1: the fail-fast run's search after its first pass) was ended by the stop, or
    # never started; run to its end it would pass.
    assert "1 failed" in closing and "passed" not in closing, out[-3000:]
    assert "skipped" not in closing or "the run stopped at another worker's failure" in out, out[-3000:]


_STUCK_AT_EXIT = '''
import threading

def test_leaves_a_thread_the_exit_waits_for():
    def stuck_at_exit():
        threading.Event().wait()
    threading.Thread(target=stuck_at_exit, daemon=False).start()
'''

_SLOW_END = '''
import time
import pytest

@pytest.fixture(scope="session")
def slow_to_finish():
    yield
    time.sleep(2.5)

def test_fine(slow_to_finish):
    pass
'''


def test_a_run_that_hangs_at_its_end_leaves_every_threads_stack(tmp_path):
    # A deep run on a GPU printed [100%] and never exited: each process arms faulthandler's watchdog
    # at its last teardown, and one still alive ROPE_END_STACKS_S later writes where it is.
    import time
    (tmp_path / "test_stuck.py").write_text(_STUCK_AT_EXIT)
    # A run whose end is slow (a finalizer outlasting the watchdog: its stacks are written) but
    # that exits, as an xdist worker done early and waiting for the controller does, leaves no file.
    (tmp_path / "test_fine.py").write_text(_SLOW_END)
    fine = run_pytest(["-q", "-p", "no:xdist", "--rope-device", "cpu", "test_fine.py"], tmp_path, ROPE_END_STACKS_S="1")
    assert fine.returncode == 0, fine.stdout + fine.stderr
    assert not list((tmp_path / "reports" / ".records").glob("*/end-stacks-*")), "a run that exits leaves no file"
    command, env = pytest_command(["-q", "-p", "no:xdist", "--rope-device", "cpu", "test_stuck.py"],
                                   ROPE_END_STACKS_S="2")
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        stacks = ""
        while time.monotonic() < deadline and "stuck_at_exit" not in stacks:
            time.sleep(0.5)
            stacks = "".join(p.read_text() for p in (tmp_path / "reports" / ".records").glob("*/end-stacks-main-*.txt"))
        assert proc.poll() is None, "the run was to hang at its exit"
    finally:
        proc.kill()
        out = proc.communicate()[0]
    assert "stuck_at_exit" in stacks and "Thread" in stacks, out + stacks



def test_the_end_watchdog_fires_once_and_keeps_the_first_deadline(tmp_path, monkeypatch):
    # Re-armed at the session's end for the time left since the last teardown, and not at all once
    # it wrote its stacks: a dump while the process still runs Python (the report, the exit
    # handlers) reads frames that are changing, which can crash the process.
    import faulthandler
    import time

    from rope.harness import plugin
    armed = []
    monkeypatch.setattr(faulthandler, "dump_traceback_later", lambda s, repeat=False, file=None: armed.append(s))
    monkeypatch.setenv("ROPE_END_STACKS_S", "100")
    out = open(tmp_path / "end-stacks.txt", "w")        # noqa: SIM115 - the plugin holds it open
    held = plugin.END_STACKS_FILE[:]         # this process's own, put back before this test's teardown arms it
    try:
        plugin.END_STACKS_FILE[:] = [out, time.monotonic() - 40]
        plugin.arm_end_stacks()
        assert len(armed) == 1 and 59 < armed[0] <= 60, armed          # the time left, not a fresh 100 s
        os.write(out.fileno(), b"Thread 0x1 (most recent call first):\n")
        plugin.arm_end_stacks()
        assert len(armed) == 1, "armed again after it had fired"
    finally:
        plugin.END_STACKS_FILE[:] = held
        out.close()

# ------------------------------------------------------------------ what rope-harness check runs
def _check_collects(tmp_path, *args) -> tuple[str, set[str]]:
    run = subprocess.run([sys.executable, "-m", "rope.harness.cli", "check", *args, "--device", "cpu",
                          "--workers", "0", "--", "--collect-only"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=subprocess_env())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run.stdout.splitlines()[0], {Path(f).name for f, _ in re.findall(r"(\S+\.py): (\d+)", run.stdout)}


ROTATION_FILES = ("test_rotation.py", "test_prefill.py", "test_regressions.py", "test_model_rotation.py",
                  "test_bad_inputs.py")
OTHER_CHECKED_FILES = ("test_runner_positions.py", "test_scheduler_positions.py", "test_dispatch.py")


def test_check_runs_every_test_that_takes_the_implementation_and_no_other(tmp_path):
    # Selected by the checked things' markers, not by file: the prefill sizes and the regression
    # corpus are in; the harness's own tests are out; and `check --impl mine` checks mine, not the
    # built-in position steps or the dispatch (its first line says what it checks).
    first, names = _check_collects(tmp_path, "--impl", "native")
    assert first.startswith("rope-harness check: rotation;"), first
    assert set(ROTATION_FILES) <= names and not names & {*OTHER_CHECKED_FILES, "test_plugin.py", "test_case_files.py"}, \
        sorted(names)
    first, names = _check_collects(tmp_path, "--impl", "native", "--position-step-impl", "native")
    assert first.startswith("rope-harness check: rotation, position step;") and "test_runner_positions.py" in names
    first, names = _check_collects(tmp_path)          # nothing named: every built-in, every checked thing
    assert first.startswith("rope-harness check: rotation, position step, position ids, table, fused, dispatch;"), first
    assert set(ROTATION_FILES + OTHER_CHECKED_FILES) <= names, sorted(names)


@pytest.mark.parametrize("flag", ["--rope-position-step-impl", "--rope-positions-impl"])
def test_the_position_step_flag_and_its_alias_select_the_same_tests(tmp_path, flag):
    # The glossary's name (docs/spec.md) and its alias: the same option, the same selection.
    run = run_pytest(["--collect-only", "-q", "--pyargs", "properties.position_step.test_runner_positions",
                   flag, "native", "--rope-device", "cpu"], tmp_path)
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert run.returncode == 0 and ids, run.stdout[-2000:] + run.stderr[-2000:]
    assert all("[triton-" not in i for i in ids) and any("[native-cpu" in i for i in ids), ids


def test_check_takes_the_position_step_flag_and_its_alias():
    from rope.harness import cli
    for flag in ("--position-step-impl", "--positions-impl"):
        args = cli.build_parser().parse_args(["check", flag, "native"])
        assert args.positions_impl == ["native"] and "--rope-position-step-impl" in cli._pytest_args(args)


def test_check_names_every_device_found(monkeypatch):
    # The main job checks every device found: on a GPU box the CPU too, which a plain pytest run there
    # leaves to CPU CI unless the CPU is named.
    from rope import devices
    from rope.harness import cli
    monkeypatch.setattr(devices, "available_devices", lambda: ["cpu", "cuda"])
    args = cli._pytest_args(cli.build_parser().parse_args(["check"]))
    assert [args[i + 1] for i, a in enumerate(args) if a == "--rope-device"] == ["cpu", "cuda"]
    args = cli._pytest_args(cli.build_parser().parse_args(["check", "--device", "cuda"]))
    assert [args[i + 1] for i, a in enumerate(args) if a == "--rope-device"] == ["cuda"]


def test_check_ends_with_one_closing_line_of_counts_and_time(tmp_path):
    # The user's verdict in one line: tests passed / failed / skipped, the report's comparisons and
    # failures, the seconds.
    command = [sys.executable, "-m", "rope.harness.cli", "check", "--impl", "native", "--device", "cpu",
               "--workers", "0", "--", "-k", "known_bug_triggers_match_reference and glm41v"]
    env = {k: v for k, v in subprocess_env().items() if k != "ROPE_NO_REPORT"}
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    last = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert re.fullmatch(r"rope-harness check: every implementation checked matches the reference \(\d+ passed, 0 failed, "
                        r"0 skipped; \d+ comparisons, 0 failed\) in \d+ s", last), last
    # With the report off, the count is the tests' own, never an older report's.
    quiet = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**env, "ROPE_NO_REPORT": "1"})
    last = quiet.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"rope-harness check: every implementation checked matches the reference \(\d+ passed, 0 failed, "
                        r"0 skipped; [1-9]\d* comparisons \(no report written\)\) in \d+ s", last), last


_INTERPRETER_NOISE = '''
import warnings

def test_noise(device):
    warnings.warn_explicit("invalid value encountered in add", RuntimeWarning, "interpreter.py", 599,
                           module="triton.runtime.interpreter")
'''


def test_the_interpreters_nan_warnings_stay_out_of_a_normal_run_and_show_with_v(tmp_path):
    # NumPy under Triton's interpreter warns on the NaN the guards feed the masked lanes on purpose:
    # a normal run does not show it (99 such lines in a CI run), -v does.
    (tmp_path / "mytests").mkdir()
    (tmp_path / "mytests" / "test_noise.py").write_text(_INTERPRETER_NOISE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nrope_harness_test_dirs = mytests\n")
    quiet = run_pytest(["-q", "mytests/test_noise.py", "--rope-device", "cpu"], tmp_path)
    loud = run_pytest(["-v", "mytests/test_noise.py", "--rope-device", "cpu"], tmp_path)
    assert quiet.returncode == 0 and "warning" not in quiet.stdout.split("passed")[-1], quiet.stdout[-1500:]
    assert loud.returncode == 0 and "1 warning" in loud.stdout, loud.stdout[-1500:]


def test_xdists_start_up_lines_stay_out_of_a_quiet_run_and_show_with_v(tmp_path):
    # Where the output is not a terminal, pytest-xdist writes "bringing up nodes..." at each start-up
    # step of a -q run (seven such lines in a CI log); its other lines (a worker down) are kept.
    (tmp_path / "mytests").mkdir()
    (tmp_path / "mytests" / "test_noise.py").write_text(_INTERPRETER_NOISE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nrope_harness_test_dirs = mytests\n")
    quiet = run_pytest(["-q", "-n", "2", "mytests/test_noise.py", "--rope-device", "cpu"], tmp_path)
    loud = run_pytest(["-v", "-n", "2", "mytests/test_noise.py", "--rope-device", "cpu"], tmp_path)
    assert quiet.returncode == 0 and "bringing up nodes" not in quiet.stdout, quiet.stdout[-1500:]
    assert loud.returncode == 0 and re.search(r"created: 2/2 workers|bringing up nodes", loud.stdout), loud.stdout[-1500:]


def _fake_distribution(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n")


def test_pypis_rope_installed_beside_ours_is_refused_even_where_our_init_won(tmp_path):
    # Installed after PyPI's rope, rope-harness's rope/__init__.py overwrites theirs (the marker is
    # ours, so the file check passes) and pip check is silent: the distribution itself is refused,
    # by the harness and by `import rope`, which the other library's users meet too.
    _fake_distribution(tmp_path, "rope", "1.15.2")
    for code in ("import rope.harness.plugin", "import rope.base"):    # the plugin; their users, through our __init__
        run = _python(code, tmp_path)
        assert run.returncode != 0 and "ImportError: the import package 'rope' is claimed twice" in run.stderr, run.stderr
        assert "rope 1.15.2 (the refactoring library)" in run.stderr and "pip uninstall rope rope-harness" in run.stderr


def test_the_harness_names_a_distribution_sharing_our_package(tmp_path, monkeypatch):
    from rope.harness.ownership import check_own_packages, sharing_distributions
    assert sharing_distributions() == []
    _fake_distribution(tmp_path, "rope", "1.15.2")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match=r"the distribution rope 1\.15\.2 is installed too and owns the import "
                                          r"package 'rope' as rope-harness does"):
        check_own_packages()


class _Item:
    def __init__(self, name, marked, device=None):
        self.name, self._marked = name, marked
        if device is not None:
            self.callspec = type("CallSpec", (), {"params": {"device": device, "impl_name": "native"}})()

    def get_closest_marker(self, name):
        return object() if name == "needs_no_gpu" and self._marked else None


class _Config:
    def __init__(self, cpu_work, named_devices=()):
        self.cpu_work, self.named_devices, self.deselected = cpu_work, list(named_devices), []
        self.hook = type("Hook", (), {"pytest_deselected": lambda _, items: self.deselected.extend(items)})()

    def getoption(self, name):
        assert name in ("--rope-cpu-work", "--rope-device"), name
        return self.cpu_work if name == "--rope-cpu-work" else self.named_devices


@pytest.mark.parametrize("devices, cpu_work, left_out", [
    (["cpu", "cuda"], False, True), (["cpu", "rocm"], False, True), (["xpu"], False, True),
    (["cpu", "cuda"], True, False), (["cpu"], False, False),
])
def test_a_gpu_run_leaves_the_cpu_work_out_unless_asked(monkeypatch, devices, cpu_work, left_out):
    # The CPU bench, the offline compile sweeps and the documents' commands (marked needs_no_gpu)
    # take minutes a GPU box runs no faster: a run that checks a GPU leaves them out unless
    # --rope-cpu-work asks; a CPU run (CI) always runs them.
    from rope.harness.plugin import selection
    monkeypatch.setattr(selection, "selected_devices", lambda config: devices)
    items = [_Item("bench", True), _Item("property", False), _Item("docs", True)]
    config = _Config(cpu_work)
    selection.keep_cpu_work_off_gpu_runs(config, items)
    assert selection.cpu_work_left_out(config) is left_out
    assert [i.name for i in items] == (["property"] if left_out else ["bench", "property", "docs"])
    assert [i.name for i in config.deselected] == (["bench", "docs"] if left_out else [])


@pytest.mark.parametrize("devices, named, cpu_work, kept", [
    (["cpu", "cuda"], [], False, ["on cuda", "no device"]),              # found, not named: the GPU's checks
    (["cpu", "cuda"], ["cpu", "cuda"], False, ["on cpu", "on cuda", "no device"]),   # the CPU named: kept
    (["cpu", "cuda"], ["cpu:0", "cuda:1"], False, ["on cpu", "on cuda", "no device"]),
    (["cpu", "cuda"], [], True, ["on cpu", "on cuda", "no device"]),     # --rope-cpu-work: everything
    (["cpu"], [], False, ["on cpu", "on cuda", "no device"]),            # a CPU run (CI): everything
])
def test_a_gpu_run_leaves_the_cpu_checks_to_cpu_ci(monkeypatch, devices, named, cpu_work, kept):
    # On a GPU box, the CPU parametrization of a device-parametrized test is CPU CI's work: a plain
    # `pytest -n auto` there checks the GPU; naming the CPU beside it (or --rope-cpu-work) runs both.
    from rope.harness.plugin import selection
    monkeypatch.setattr(selection, "selected_devices", lambda config: devices)
    items = [_Item("on cpu", False, "cpu"), _Item("on cuda", False, "cuda:0"), _Item("no device", False)]
    config = _Config(cpu_work, named)
    selection.keep_cpu_work_off_gpu_runs(config, items)
    assert [i.name for i in items] == kept
    assert [i.name for i in config.deselected] == [n for n in ("on cpu", "on cuda", "no device") if n not in kept]


def _needs_no_gpu_tests() -> dict:
    """Every test function of tests/ by (file, name): whether it carries ``needs_no_gpu`` (its own
    decorator or its module's ``pytestmark``), and whether its body pins a pytest or CLI run to the CPU."""
    import ast
    root = Path(__file__).parents[1]
    found = {}
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = any(isinstance(node, ast.Assign) and "needs_no_gpu" in ast.unparse(node.value)
                            and any(getattr(t, "id", None) == "pytestmark" for t in node.targets) for node in tree.body)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                body = ast.unparse(node)
                marked = module_marked or any("needs_no_gpu" in ast.unparse(d) for d in node.decorator_list)
                pinned = "'--rope-device', 'cpu'" in body or "'--device', 'cpu'" in body
                found[(path.relative_to(root).as_posix(), node.name)] = (marked, pinned)
    return found


def test_the_cpu_work_is_marked():
    # What the GPU suite leaves out is chosen by the marker: the CPU bench, the offline compile sweeps,
    # the documents' commands, and every test that runs a pytest session or the CLI pinned to the CPU
    # (the harness's own machinery: minutes of subprocess runs a GPU box runs no faster).
    tests = _needs_no_gpu_tests()
    for named in [("harness/test_docs.py", "test_the_documents_commands_run_as_written"),
                  ("harness/test_bench.py", "test_bench_on_the_cpu_as_a_user_types_it"),
                  ("kernels/test_kernel_compiles.py", "test_every_launch_the_launchers_make_compiles_for_sm90"),
                  ("kernels/test_kernel_compiles.py", "test_every_launch_the_launchers_make_compiles_for_amd_and_intel"),
                  ("harness/test_scale_out.py", "test_campaign_on_cpu_stops_on_time_and_merges_every_workers_records"),
                  ("harness/test_plugin.py", "test_check_runs_every_test_that_takes_the_implementation_and_no_other")]:
        assert tests[named][0], named
    unmarked = [key for key, (marked, pinned) in tests.items() if pinned and not marked]
    assert unmarked == [], unmarked
    # What the GPU must run stays in its suite: the GPU placement and the GPU's own checks.
    assert not tests[("harness/test_scale_out.py", "test_gpu_tests_run_on_the_gpu_in_their_id")][0]
    assert not tests[("kernels/test_interpreter_agreement.py", "test_gpu_and_interpreter_agree_bit_for_bit")][0]


class _SchedulingConfig:
    def __init__(self, dist, args=(), maxfail=0, devices=("cpu",)):
        from types import SimpleNamespace
        self.option = SimpleNamespace(dist=dist)
        self.invocation_params = SimpleNamespace(args=tuple(args))
        self.maxfail, self.devices = maxfail, list(devices)

    def getini(self, name):
        return []

    def getoption(self, name, default=None):
        return {"maxfail": self.maxfail}.get(name, default)


@pytest.mark.parametrize("dist, args, maxfail, campaign, expected", [
    ("load", ["-n", "16"], 0, False, "worksteal"),           # -n alone: an idle worker takes a busy one's tail
    ("load", ["-n", "16", "--dist", "load"], 0, False, "load"),  # the user's choice is kept
    ("load", ["-n", "2", "--dist=load"], 0, False, "load"),
    ("load", ["-n", "2", "-x"], 1, False, "load"),           # a fail-fast run orders its first passes
    ("load", ["-n", "2"], 0, True, "load"),                  # a campaign runs its rounds in order
    ("no", [], 0, False, "no"),                              # no xdist
])
def test_a_plain_xdist_run_steals_work(monkeypatch, dist, args, maxfail, campaign, expected):
    # The GPU suite's last minutes were one worker's queue of prefill sizes while 15 waited.
    from rope.harness.plugin import scheduling
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.setenv("ROPE_CAMPAIGN", "1") if campaign else monkeypatch.delenv("ROPE_CAMPAIGN", raising=False)
    config = _SchedulingConfig(dist, args, maxfail)
    scheduling.steal_work(config)
    assert config.option.dist == expected


@pytest.mark.parametrize("devices, maxfail, first", [(["cpu", "cuda"], 0, ["p1", "p2"]), (["cpu"], 0, ["a", "p1"]),
                                                     (["cuda"], 1, ["a", "p1"])])
def test_a_gpu_run_starts_the_prefill_sizes_first(monkeypatch, devices, maxfail, first):
    from rope.harness.plugin import scheduling
    monkeypatch.delenv("ROPE_CAMPAIGN", raising=False)
    monkeypatch.setattr(scheduling, "selected_devices", lambda config: devices)

    class Item:
        def __init__(self, name, prefill):
            self.name, self.prefill = name, prefill

        def get_closest_marker(self, name):
            return object() if name == "prefill" and self.prefill else None

    items = [Item("a", False), Item("p1", True), Item("b", False), Item("p2", True)]
    scheduling.longest_first(_SchedulingConfig("load", maxfail=maxfail), items)
    assert [i.name for i in items][:2] == first
    assert [i.name for i in items if not i.prefill] == ["a", "b"]           # the rest keeps its order


def test_one_cases_implementations_run_one_after_another():
    # pytest collects the model sweep implementation by implementation (every model of native, then
    # every model of triton): a worker had let a model's table go (up to 2^21 rows, seconds to build)
    # before the next implementation needed it.  One case's rows come together, in the places that
    # test's rows held; every other item stays where it was.
    from types import SimpleNamespace

    from rope.harness.plugin import scheduling

    def item(name, function="test_model", **params):
        return SimpleNamespace(name=name, path="properties/m.py", originalname=function,
                               callspec=SimpleNamespace(params=params))

    items = [item("x", function="other"),
             item("n-a", impl="native", case=("a", 1)), item("n-b", impl="native", case=("b", 2)),
             SimpleNamespace(name="no-params", path="t.py", originalname="plain"),
             item("t-a", impl="triton", case=("a", 1)), item("t-b", impl="triton", case=("b", 2)),
             item("u-a", impl="unhashable", case=["a", 1]), item("y", function="other", case=("b", 2))]
    scheduling.same_case_together(items)
    assert [i.name for i in items] == ["x", "n-a", "t-a", "no-params", "n-b", "t-b", "u-a", "y"]


def test_the_model_sweep_is_collected_one_model_after_another():
    # The hook runs in a real collection: a model's rows of both implementations are neighbours.
    out = run_pytest(["--collect-only", "-q", "-p", "no:cacheprovider", "properties/rotation/test_model_rotation.py",
                      "--rope-impl", "native", "--rope-impl", "triton", "--rope-device", "cpu"],
                     Path(__file__).resolve().parents[2])
    ids = [line.split("[", 1)[1].rstrip("]") for line in out.stdout.splitlines() if "[" in line]
    assert len(ids) > 20, out.stdout[-2000:] + out.stderr[-2000:]
    assert ids[0].startswith("native-cpu-") and ids[1] == "triton-cpu-" + ids[0][len("native-cpu-"):], ids[:4]
