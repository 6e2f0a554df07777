"""How long a test may run: the call deadline of an implementation (--rope-call-timeout), the test
timeout (pytest-timeout, per profile), and Hypothesis' shrinking capped in fail-fast runs."""

from __future__ import annotations

import os

import pytest

from rope.harness.plugin.activation import is_rope_test
from rope.harness.plugin.profiles import default_profile


# Seconds a test may run before pytest-timeout ends it (its worker, under xdist): a hang that the
# call deadline cannot interrupt (C code, a GPU kernel) still ends, as one failed test.
TEST_TIMEOUT_S = {"deep": 3600.0, "campaign": 3600.0}


DEFAULT_TEST_TIMEOUT_S = 900.0


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


def set_test_timeouts(config, items) -> None:
    seconds = test_timeout(config)
    if seconds is None or not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        if is_rope_test(item) and item.get_closest_marker("timeout") is None:
            # thread: stacks are dumped and the process ends (under xdist the worker is replaced and
            # only this test fails); the signal method could not interrupt C code.
            item.add_marker(pytest.mark.timeout(seconds, method="thread"))


def cap_shrinking(seconds: float) -> None:
    """Hypothesis shrinks a failure for up to 5 minutes (its MAX_SHRINKING_SECONDS; under the Triton
    interpreter every step is a kernel run): a fail-fast run reports after ``seconds`` with the
    smallest example found so far.  A Hypothesis without that constant keeps its own limit."""
    from hypothesis.internal.conjecture import engine
    if isinstance(getattr(engine, "MAX_SHRINKING_SECONDS", None), (int, float)):
        engine.MAX_SHRINKING_SECONDS = min(engine.MAX_SHRINKING_SECONDS, seconds)


def configure_call_timeout(config) -> None:
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
