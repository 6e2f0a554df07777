"""Replay position-step case files through the suite's own check: ``pytest --rope-repro CASE`` (a file,
or every *.json of a directory) replays each position-step case file against its recorded
implementation (a registered name only: a module path stored in a case file is never imported) or
each --rope-position-step-impl (rope.harness.position_step.replay; the files of other kinds replay in
their own checked thing's test_replay.py).  A file of a step sequence runs every step again on one set
of buffers in its recorded mode (eagerly, or in a CUDA graph: skipped, with the reason, without a GPU).
Without --rope-repro the test is skipped (and with it, every other test is deselected).
"""

from __future__ import annotations

import pytest

from rope.harness.position_step.case_file import KIND
from rope.harness.position_step.check import assert_positions_match
from rope.harness.position_step.modes import assert_steps_match
from rope.harness.position_step.replay import resolve_recorded, sequence_unrunnable_reason
from rope.harness.repro import parametrize_replays
from rope.registry import get_positions_implementation

# The replays: run with --rope-repro (or when named), not in a plain run.
pytestmark = [pytest.mark.replay, pytest.mark.harness_stage, pytest.mark.self_test]


def pytest_generate_tests(metafunc):
    parametrize_replays(metafunc, "position_step_repro", KIND, "position step")


def test_replayed_position_step_case_matches(position_step_repro):
    loaded, impl_name, user_named = position_step_repro
    try:
        fn = get_positions_implementation(impl_name) if user_named else resolve_recorded(
            impl_name, f"case file {loaded.path}")
    except ValueError as exc:
        pytest.fail(str(exc))
    if not loaded.steps:
        assert_positions_match(impl_name, fn, loaded.batch, loaded.device)
        return
    # A step sequence, as the runner called it: the recorded mode, the steps on one set of buffers.
    reason = sequence_unrunnable_reason(loaded, impl_name, fn, loaded.device)
    if reason:
        pytest.skip(reason)
    assert_steps_match(impl_name, fn, loaded.steps, loaded.device, mode=loaded.mode)
