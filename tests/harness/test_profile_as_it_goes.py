"""A run's profile (rope.harness.profiling: time per phase, GPU memory) is recorded as the run goes, not
only at its end: a session ended by a signal (a campaign's deadline past its grace) kept its records
and lost its profile.  The report keeps each process's last profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from rope.harness import report
from tests.fresh_runs import run_pytest

pytestmark = pytest.mark.needs_no_gpu     # pytest sessions pinned to the CPU: the harness's own machinery


def _profile(process, tests_s, final=True):
    record = {"kind": "profile", "seconds": {"tests": tests_s, "call": 1.0}, "counts": {"call": 2, "tests": 1},
              "compiles": 0, "tests": {"t.py::t": [tests_s, 2]}, "final": final, "worker": "gw0"}
    return record if process is None else {**record, "process": process}


def _run_dir(tmp_path: Path) -> Path:
    """The one record directory the run made under its reports folder."""
    (run_dir,) = (tmp_path / "reports" / ".records").iterdir()
    return run_dir


def test_the_report_keeps_each_processes_last_profile():
    records = [_profile("gw0:11", 4.0, final=False), _profile("gw0:11", 10.0),       # as it went, then at its end
               _profile("gw1:12", 3.0, final=False),                                  # ended by a signal
               _profile("gw0:13", 2.0),                                               # the same worker, a later session
               _profile(None, 1.0), _profile(None, 1.5)]                              # records without a process name
    profile = report.summarize(records)["profile"]
    assert profile["processes"] == 5 and profile["seconds"]["tests"] == 10.0 + 3.0 + 2.0 + 1.0 + 1.5, profile


def _three_tests(tmp_path: Path, last: str):
    """A pytest session of three tests outside the suite, each adding its time to the profile as the
    harness does for its own, the profile recorded after every test; ``last``: the third's body.
    Its result and its records."""
    (tmp_path / "test_three.py").write_text(
        "import os, signal\n"
        "from rope.harness import profiling\n"
        "from rope.harness.plugin import run_end\n\n"
        "def test_a():\n    run_end.PROFILE_EVERY_S = 0.0\n    profiling.add_test('t', 0.5, 3)\n\n"
        "def test_b():\n    profiling.add_test('t', 0.5, 3)\n\n"
        f"def test_c():\n    {last}\n")
    run = run_pytest(["-p", "no:cacheprovider", "-q", str(tmp_path / "test_three.py"), "--rope-device", "cpu"],
                     tmp_path, ROPE_REPORTS_DIR=str(tmp_path / "reports"))
    return run, report.load_records(_run_dir(tmp_path))


def test_a_session_ended_by_a_signal_still_reports_its_profile(tmp_path):
    # The last test kills its own process (as SIGKILL does after a campaign's grace): no session end,
    # so only the profile recorded as the run went can say where its time went.
    run, records = _three_tests(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    assert run.returncode != 0, run.stdout[-2000:]            # killed, not ended
    profiles = [r for r in records if r.get("kind") == "profile"]
    assert profiles and not any(r["final"] for r in profiles), (run.stdout[-2000:], records)
    summary = report.summarize(records)
    assert summary["profile"]["processes"] == 1 and summary["profile"]["counts"]["tests"] == 2, summary["profile"]


def test_a_session_that_ends_records_its_final_profile_last(tmp_path):
    run, records = _three_tests(tmp_path, "profiling.add_test('t', 0.5, 3)")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    profiles = [r for r in records if r.get("kind") == "profile"]
    assert [r["final"] for r in profiles][-1] is True and len({r["process"] for r in profiles}) == 1, profiles
    assert report.summarize(records)["profile"]["counts"]["tests"] == 3
