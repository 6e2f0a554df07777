"""An implementation that never returns fails its one test, with a clear message and a case file:
the call deadline interrupts Python-level hangs (rope.harness.deadline), and the per-test timeout
(pytest-timeout, set by the plugin) ends a worker stuck where nothing can interrupt it."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time

import pytest
from hypothesis import given, settings, strategies as st

from rope.harness import case_files
from rope.harness.position_step import check as position_check
from rope.harness.rotation import check as rotation_check
from rope.harness.deadline import CALL_TIMEOUT_ENV, ImplementationHung, call_timeout, deadline
from rope.harness.rotation.cases import RotationCase
from rope.spec import RopeSpec

from tests.fresh_runs import run_pytest

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

SPEC = RopeSpec(64, 64, True, (8, 12, 12), max_position=64)
CASE = RotationCase(SPEC, 3, 2, 1, "float32", "uniform", False, 5)


def sleeps(spec, positions, query, key, cache):
    time.sleep(600)


def spins_and_swallows(spec, positions, query, key, cache):
    # A busy loop that swallows every Exception: the deadline must still end it.
    while True:
        try:
            sum(range(1000))
        except Exception:      # noqa: BLE001
            pass


HANG_S = 600    # how long each staged hang would run if nothing interrupted it


@pytest.mark.parametrize("body", [lambda: time.sleep(HANG_S), lambda: spins_and_swallows(*[None] * 5)],
                         ids=["sleep", "busy-loop"])
def test_deadline_interrupts_a_python_hang(body):
    expired = []
    with pytest.raises(ImplementationHung, match=r"did not return within 0\.5 s"):
        with deadline(0.5, lambda: expired.append(time.monotonic())):
            body()
    assert expired      # ended by the deadline's expiry, not by the body returning


def test_deadline_leaves_a_call_that_returns_alone():
    with deadline(5, lambda: pytest.fail("expired")):
        assert sum(range(10)) == 45
    time.sleep(0.05)     # no stray interrupt after the block


def test_deadlines_nest_and_share_one_watchdog():
    # An inner deadline expires inside an outer one that does not; the expiry's work is done
    # before the block is left; a thousand more deadlines start no thread of their own.
    import threading
    fired = []
    with deadline(5, lambda: fired.append("outer")):
        with pytest.raises(ImplementationHung):
            with deadline(0.3, lambda: (time.sleep(0.2), fired.append("inner"))):
                time.sleep(600)
        assert fired == ["inner"]
    before = threading.active_count()
    for _ in range(1000):
        with deadline(5, lambda: fired.append("late")):
            pass
    assert threading.active_count() == before
    assert [t.name for t in threading.enumerate()].count("rope-deadline") == 1
    time.sleep(0.05)
    assert fired == ["inner"]


@pytest.mark.parametrize("raw, seconds", [("", 120.0), ("2.5", 2.5), ("0", None), ("off", None)])
def test_call_timeout_setting(monkeypatch, raw, seconds):
    monkeypatch.setenv(CALL_TIMEOUT_ENV, raw)
    assert call_timeout() == seconds


@pytest.mark.parametrize("raw", ["soon", "-1", "inf", "nan"])
def test_bad_call_timeout_names_the_setting(monkeypatch, raw):
    monkeypatch.setenv(CALL_TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=rf"{CALL_TIMEOUT_ENV}={raw!r}"):
        call_timeout()


@pytest.fixture
def case_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(case_files.CASES_DIR_ENV, str(tmp_path / "cases"))
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "0.5")
    return tmp_path / "cases"


def test_a_hang_fails_with_a_case_file_and_is_not_shrunk(case_dir):
    calls = []

    def hangs(spec, positions, query, key, cache):
        calls.append(1)
        time.sleep(HANG_S)

    @settings(max_examples=20, database=None, deadline=None)
    @given(st.integers(0, 1000))
    def prop(seed):
        rotation_check.assert_matches_reference("hangs", hangs, RotationCase(**{**CASE.__dict__, "seed": seed}), "cpu")

    with pytest.raises(ImplementationHung) as raised:
        prop()
    # One hang ends the test: no shrinking (each step would wait out the deadline again).
    assert len(calls) == 1
    message = str(raised.value)
    assert "hangs on cpu does not match the reference (case " in message
    assert "did not return within 0.5 s" in message and "--rope-call-timeout" in message
    (path,) = case_dir.glob("*.json")
    assert str(path.name) in message
    record = json.loads(path.read_text())
    assert "did not return within 0.5 s" in record["result"]["problems"][0]
    assert record["implementation"] == "hangs" and record["diagnosis"]["label"] == "wrong_output"


def test_positions_call_has_a_deadline(monkeypatch):
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "0.5")
    with pytest.raises(ImplementationHung, match="position-step implementation 'hang' did not return"):
        def hang(*args):
            time.sleep(600)
        position_check.call_positions(hang, {name: None for name in position_check.POSITION_ARGUMENTS}, None)


# ------------------------------------------------------------------ end to end, through the plugin
_HANGING = '''
import signal, time

def python_hang(spec, positions, query, key, cache):
    time.sleep(600)

def stuck(spec, positions, query, key, cache):
    # Nothing reaches the interpreter: as if stuck in C code or in a GPU synchronize.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    time.sleep(600)
'''


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs POSIX signals")
@pytest.mark.parametrize("impl, timeout_args, says", [
    ("python_hang", [], "did not return within 5 s"),
    ("stuck", ["--rope-test-timeout", "15"], "crashed while running '::test_known_bug_triggers_match_reference[hanging_impl:stuck"),
], ids=["interrupted", "uninterruptible"])
def test_a_hanging_implementation_fails_one_test_and_the_run_goes_on(tmp_path, impl, timeout_args, says):
    (tmp_path / "hanging_impl.py").write_text(textwrap.dedent(_HANGING))
    run = run_pytest(["-q", "-n", "1", "--pyargs", "properties.rotation.test_rotation", "-k", "known_bug_triggers_match_reference and gptj-paired-neox-glm41v",
                   "--rope-impl", f"hanging_impl:{impl}", "--rope-impl", "native", "--rope-device", "cpu",
                   "--rope-call-timeout", "5", *timeout_args],
                  tmp_path, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 1 passed" in out and says in out, out
    cases = list((tmp_path / "reports" / "cases").glob("*.json"))
    assert len(cases) == 1, out
    assert json.loads(cases[0].read_text())["implementation"] == f"hanging_impl:{impl}"
    summary = (tmp_path / "reports" / "summary.md").read_text()
    assert "rotation: 2 comparisons, 1 failed" in summary.splitlines()[2] and cases[0].name in summary, summary
