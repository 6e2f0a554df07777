"""What a user meets in the first hour with their own kernel: it imports from the directory they
stand in, a module that cannot be imported ends the run before any test in one line, a run that
compared nothing never says green, and a log shows progress while the check runs."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from rope.harness.cli import build_parser
from rope.harness.plugin import compared
from rope.harness.suite import plugin_args
from tests.fresh_runs import fresh_env

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

# A user's kernel module, beside which the command is run: ``rotate`` is the project's torch
# implementation; ``rotate_nothing`` supports no case at all.
_KERNEL = '''
from rope.native import rotate_native


def rotate(spec, positions, query, key, cos_sin_cache):
    return rotate_native(spec, positions, query, key, cos_sin_cache)


def rotate_nothing(spec, positions, query, key, cos_sin_cache):
    return rotate_native(spec, positions, query, key, cos_sin_cache)


rotate.working_precision = rotate_nothing.working_precision = rotate_native.working_precision
rotate_nothing.supports = lambda spec, dtype, device: False
'''
# A few fixed-example tests of the suite (properties/rotation/test_rotation.py), seconds on the CPU.
_FEW = "known_bug_triggers_match_reference and glm41v"


def _env() -> dict:
    return fresh_env(keep_pythonpath=False)      # the user's directory is not on the path


def _check(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rope.harness.cli", "check", "--device", "cpu", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600, env={**_env(), **env})


def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600, env=_env())


def _user_dir(tmp_path: Path) -> Path:
    (tmp_path / "userkernel.py").write_text(_KERNEL)
    return tmp_path


def test_check_imports_the_kernel_from_the_current_directory_without_pythonpath(tmp_path):
    run = _check(["--impl", "userkernel:rotate", "--workers", "0", "--", "-k", _FEW], _user_dir(tmp_path))
    last = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0 and "matches the reference" in last and " 0 comparisons" not in last, \
        run.stdout[-2000:] + run.stderr[-2000:]


def test_pytest_workers_import_the_kernel_from_the_current_directory(tmp_path):
    run = _pytest(["-n", "2", "-q", "--pyargs", "properties.rotation.test_rotation", "-k", _FEW,
                   "--rope-impl", "userkernel:rotate", "--rope-device", "cpu"], _user_dir(tmp_path))
    assert run.returncode == 0 and " passed" in run.stdout and "error" not in run.stdout.lower(), \
        run.stdout[-2000:] + run.stderr[-2000:]


def test_a_module_not_found_ends_check_before_any_test_in_one_line_exit_2(tmp_path):
    run = _check(["--impl", "userkernel:rotate"], tmp_path)          # no userkernel.py here
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout == "" and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert f"no 'userkernel' in the current directory ({tmp_path})" in run.stderr and "PYTHONPATH" in run.stderr


def test_a_module_not_found_ends_a_pytest_run_before_any_test_as_a_usage_error(tmp_path):
    run = _pytest(["-n", "2", "--pyargs", "properties", "--rope-impl", "userkernel:rotate"], tmp_path)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]     # pytest's usage-error status
    errors = [line for line in run.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "cannot import module 'userkernel'" in errors[0], run.stderr[-2000:]
    assert "passed" not in run.stdout and "error" not in run.stdout.lower(), run.stdout[-2000:]


def test_check_of_an_implementation_that_supports_nothing_fails_saying_why(tmp_path):
    run = _check(["--impl", "userkernel:rotate_nothing", "--workers", "0", "--", "-k", _FEW], _user_dir(tmp_path))
    last = run.stdout.strip().splitlines()[-1]
    assert run.returncode == compared.NOTHING_COMPARED_EXIT, run.stdout[-2000:] + run.stderr[-2000:]
    assert "matches" not in last and "FAILED: nothing compared" in last and "every test skipped" in last, last
    assert "userkernel:rotate_nothing does not run" in last, last


def test_a_suite_run_that_compared_nothing_exits_5_with_the_reason(tmp_path):
    run = _pytest(["-q", "--pyargs", "properties.rotation.test_rotation", "-k", _FEW,
                   "--rope-impl", "userkernel:rotate_nothing", "--rope-device", "cpu"], _user_dir(tmp_path))
    assert run.returncode == compared.NOTHING_COMPARED_EXIT, run.stdout[-2000:] + run.stderr[-2000:]
    assert "rope-harness: nothing compared, so nothing checked: rotation: every test skipped" in run.stdout


def test_check_collect_only_says_what_would_run_never_matches(tmp_path):
    run = _check(["--impl", "userkernel:rotate", "--workers", "0", "--", "--collect-only", "-k", _FEW],
                 _user_dir(tmp_path))
    last = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0 and "matches" not in last, run.stdout[-2000:]
    assert last.startswith("rope-harness check: collected only, nothing run: ") and "tests would run" in last, last


# ----------------------------------------------------------------------------- the rule, unit by unit
def _report(thing: str | None, outcome: str, comparisons: int = 0, when: str = "call", reason: str = "why"):
    keywords = {thing: 1} if thing else {}
    return SimpleNamespace(keywords=keywords, user_properties=[("n", comparisons)], when=when, outcome=outcome,
                           failed=outcome == "failed", skipped=outcome == "skipped",
                           longrepr=("f", 1, f"Skipped: {reason}") if outcome == "skipped" else None)


def test_nothing_compared_names_each_empty_thing_that_was_named_or_when_all_are_empty():
    tallies: dict = {}
    compared.note(tallies, _report("rotation", "skipped", reason="unsupported: mine does not run x"), "n")
    compared.note(tallies, _report("position_step", "passed", comparisons=3), "n")
    compared.note(tallies, _report(None, "passed"), "n")                   # a machinery test: not counted
    assert set(tallies) == {"rotation", "position_step"}
    # Something compared and rotation not named: the run checked what it was asked to.
    assert compared.why_nothing_compared(tallies, named=set()) is None
    # Rotation named and never compared: not green, whatever else compared.
    why = compared.why_nothing_compared(tallies, named={"rotation"})
    assert why == "rotation: every test skipped (1); most often: unsupported: mine does not run x (1x)"
    # Tests that ran without a comparison are told apart from skips.
    empty = {"rotation": compared.Tally(outcomes=Counter(passed=2, skipped=1))}
    assert "2 tests ran without a comparison" in compared.why_nothing_compared(empty, named=set())
    assert compared.why_nothing_compared({}, named={"rotation"}) is None   # no checked test: not this rule


def test_a_replay_is_not_a_checked_test():
    assert compared.checked_thing(SimpleNamespace(keywords={"rotation": 1, "replay": 1})) is None


def test_the_logs_progress_line_comes_from_a_ticker_that_does_not_wait_for_a_test(capsys):
    # In a log the bar would print once at the end: a ticker prints a line at every period instead,
    # whether or not a test ended (here its waits are a fake clock's: two periods, then the end).
    from rope.harness.cli import ProgressBar
    bar = ProgressBar(every_s=30.0)
    bar.live = False
    bar.task = bar.progress.add_task("check", total=10, failed=0, comparisons=0)
    bar._started = 0.0
    bar.progress.update(bar.task, completed=4)
    bar.comparisons = 17
    waits = iter([False, False, True])
    bar._stop = SimpleNamespace(wait=lambda seconds: next(waits))
    bar._tick()
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert len(lines) == 2
    assert all(line.startswith("checking: 4/10 tests, 17 comparisons, 0 failed, ") for line in lines), lines
    assert lines[0].endswith(" left"), lines


def test_a_campaign_that_compared_nothing_exits_non_zero_saying_why(monkeypatch, capsys, tmp_path):
    from rope.harness import campaign
    empty = campaign.Campaign(minutes=0.1, devices=["cpu"], workers="1", tests=[], out=str(tmp_path),
                              runs=[campaign.Run(seeds=[1], examples_per_test=[20], exit_code=0)], wall_s=6.0)
    monkeypatch.setattr(campaign, "run_campaign", lambda *a, **k: empty)
    parser = build_parser()
    code = campaign.cmd_campaign(parser.parse_args(["campaign", "--minutes", "0.1"]))
    out = capsys.readouterr().out
    assert code == compared.NOTHING_COMPARED_EXIT and "campaign: FAILED: nothing compared" in out, out
    empty.examples = 3
    assert campaign.cmd_campaign(parser.parse_args(["campaign", "--minutes", "0.1"])) == 0


def test_the_live_line_counts_failed_tests_beside_failed_comparisons(tmp_path):
    import json

    from rope.harness.campaign import RecordCounter
    counter = RecordCounter(tmp_path)
    lines = [{"kind": "comparison", "ok": True}, {"kind": "comparison", "ok": False}]
    (tmp_path / "gw0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    counter.poll()
    assert (counter.examples, counter.failures, counter.failed_tests, counter.failed_words()) == (2, 1, 0, "1")
    with open(tmp_path / "main.jsonl", "a") as f:
        f.write(json.dumps({"kind": "failure", "test": "t", "cause": "OutOfMemoryError"}) + "\n")
    counter.poll()
    assert counter.failed_words() == "1 comparison + 1 test"


def test_a_test_that_failed_in_a_stopped_session_fails_the_campaign(monkeypatch, capsys, tmp_path):
    # A campaign's last session is always stopped at its deadline (pytest exits 2, not 1): a test that
    # failed there outside the comparisons (out of memory beside another run on the GPU) is in the
    # records only, and must still fail the campaign, by name, not pass with "0 failed".
    import json

    from rope.harness import campaign
    run_dir, out = tmp_path / "records", tmp_path / "out"
    run_dir.mkdir()
    out.mkdir()
    passed = dict(kind="comparison", test="t::test_rotation[native-cuda:0]", impl="native", device="cuda:0",
                  dtype="float32", variant="1d-neox", ok=True, worst_ratio=0.5, mismatched=0, elements=64,
                  problems=[], case_file=None, heat=None, tokens=4, worker="gw0")
    raised = dict(kind="failure", test="t::test_rotation[native-cuda:0]", cause="OutOfMemoryError at cases.py:228",
                  headline="OutOfMemoryError: CUDA out of memory.", worker="main")
    stopped = campaign.Run(seeds=[1], examples_per_test=[20], exit_code=2, interrupted=True)
    c = campaign.Campaign(minutes=0.1, devices=["cuda"], workers="2", tests=[], out=str(out), runs=[stopped],
                          wall_s=6.0)
    for records, failed in (([passed], 0), ([passed, raised], 1)):
        (run_dir / "main.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        campaign._finish(c, run_dir, out)
        assert (c.examples, c.failures, c.failed_tests, c.test_failures) == (1, 0, failed, False)
        monkeypatch.setattr(campaign, "run_campaign", lambda *a, **k: c)
        code = campaign.cmd_campaign(build_parser().parse_args(["campaign", "--minutes", "0.1"]))
        printed = capsys.readouterr().out
        assert code == failed, printed
        assert ("1 test failed (causes: summary.md)" in printed) == bool(failed), printed
        assert ("1 test failed" in (out / "campaign.md").read_text()) == bool(failed)
