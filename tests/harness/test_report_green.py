"""Green means green: a run's report holds the implementations under test only, never the
harness's own stand-ins (the deliberately broken implementations the project's tests run), and a
user's implementation is not reported as skipping the tests meant only for the built-ins."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rope.harness.suite import plugin_args, subprocess_env, suite_path

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

ROOT = Path(__file__).resolve().parents[2]

_MINE = '''
from rope import get_implementation

_native = get_implementation("native")

def rope(spec, positions, query, key, cos_sin_cache):
    return _native(spec, positions, query, key, cos_sin_cache)

rope.working_precision = _native.working_precision
'''


def _pytest(args: list[str], cwd: Path, reports: Path, **env) -> subprocess.CompletedProcess:
    """A fresh pytest run with the plugin, its report in ``reports``: this run's own settings left out."""
    clean = {k: v for k, v in subprocess_env().items() if not k.startswith(("ROPE_", "PYTEST_")) and k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), *args]
    return subprocess.run(command, cwd=cwd, env={**clean, "ROPE_REPORTS_DIR": str(reports), **env},
                          capture_output=True, text=True, timeout=600)


def test_tests_for_the_builtins_only_are_deselected_for_a_users_implementation(tmp_path):
    # The harness's own validation messages are asserted of the built-ins only: for mine:rope those
    # tests are deselected (not 21 skips in its report), for native they run.
    (tmp_path / "mine.py").write_text(_MINE)
    files = [str(suite_path("rotation", "test_bad_inputs.py")), str(suite_path("rotation", "test_aliasing.py")),
             str(suite_path("position_step", "test_runner_positions.py"))]
    run = _pytest(["--collect-only", "-q", *files, "--rope-impl", "native", "--rope-impl", "mine:rope",
                   "--rope-position-step-impl", "native", "--rope-position-step-impl", "mine:rope",
                   "--rope-device", "cpu"], tmp_path, tmp_path / "reports", PYTHONPATH=f"{tmp_path}:{ROOT}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    meant_for_builtins = ("test_implementation_rejects_bad_input[", "test_mismatched_devices_rejected[",
                          "test_implementation_refuses_overlapping_inputs[", "test_implementation_rejects_bad_position_input[")
    for name in meant_for_builtins:
        assert any(name in i and "native-cpu" in i for i in ids), (name, ids)
        assert not any(name in i and "mine:rope" in i for i in ids), (name, ids)
    assert any("mine:rope" in i for i in ids), ids           # mine is still checked for what it computes
    assert "deselected" in run.stdout.splitlines()[-1], run.stdout[-500:]


def test_the_project_tests_broken_stand_ins_stay_out_of_the_run_report(tmp_path):
    # tests/ runs on the harness's machinery (pyproject's rope_harness_test_dirs), so a repository
    # run's report collects its comparisons: the stand-ins these tests break on purpose (a hanging
    # rotation, a wrong position step, position-id mutants) are not findings of the run.
    run = _pytest(["-q", "tests/harness/test_deadline.py::test_a_hang_fails_with_a_case_file_and_is_not_shrunk",
                   "tests/harness/test_failure_groups.py::test_a_wrong_position_step_is_one_cause_in_short_lines",
                   "tests/harness/test_position_ids_harness.py::test_mismatch_writes_a_case_file_that_loads_and_replays",
                   "tests/harness/test_position_ids_harness.py::test_omni_case_file_round_trips"],
                  ROOT, tmp_path / "reports")
    assert run.returncode == 0 and "4 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert summary["matrix"] == [] and summary["failures"] == 0, summary["matrix"]


_MARKED_CONFTEST = '''
from rope.harness.plugin import kept_out_of_the_report

_out = kept_out_of_the_report(marker="self_test")
'''
_RECORDING = '''
import pytest
from rope.harness import report
{mark}

def test_records():
    report.record_exact_check(test="t", impl="{impl}", device="cpu", what="positions-1rows", ok={ok}, elements=4)
'''


def test_modules_marked_self_test_stay_out_of_the_run_report(tmp_path):
    # A conftest keeps the modules carrying the marker out (the suite's replays and mutant searches):
    # by marker, not by a list of file names.
    (tmp_path / "mytests").mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\nrope_harness_test_dirs = mytests\n")
    (tmp_path / "mytests" / "conftest.py").write_text(_MARKED_CONFTEST)
    (tmp_path / "mytests" / "test_broken.py").write_text(
        _RECORDING.format(mark="pytestmark = pytest.mark.self_test", impl="broken", ok=False))
    (tmp_path / "mytests" / "test_real.py").write_text(_RECORDING.format(mark="", impl="real", ok=True))
    run = _pytest(["-q", "mytests", "--rope-device", "cpu"], tmp_path, tmp_path / "reports", PYTHONPATH=str(ROOT))
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert [cell["impl"] for cell in summary["matrix"]] == ["real"] and summary["failures"] == 0, summary["matrix"]
