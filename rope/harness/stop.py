"""A fail-fast run's stop across pytest-xdist workers.

``pytest -x -n N`` stops at its first failure, but each other worker first finishes the test it is
in: a Hypothesis search or a large case under the Triton interpreter, a minute and more, all of
it added to the time a kernel engineer waits for the failure.  The controller (the plugin) names
a file in ``$ROPE_STOP_FILE`` before the workers start and creates it when a failure report
arrives; the workers look for it before every check and skip the rest of their test.
"""

from __future__ import annotations

import os

import pytest

STOP_FILE_ENV = "ROPE_STOP_FILE"


def stop_requested() -> bool:
    """Whether another worker's failure ended this fail-fast run."""
    path = os.environ.get(STOP_FILE_ENV)
    return bool(path) and os.path.exists(path)


def skip_if_stopped() -> None:
    if stop_requested():
        pytest.skip("the run stopped at another worker's failure (-x / --maxfail)")


def request_stop() -> None:
    path = os.environ.get(STOP_FILE_ENV)
    if path:
        try:
            open(path, "a").close()
        except OSError:         # the stop is an optimization: the run still ends, only later
            pass
