"""Replay position-id case files through the suite's own check: ``pytest --rope-repro CASE`` (a file,
or every *.json of a directory) replays each position-id case file against its recorded adapter (a
registered name only: a module path stored in a case file is never imported) or each
--rope-position-ids-impl (rope.harness.position_ids.replay; the files of other kinds replay in their
own checked thing's test_replay.py).  Without --rope-repro the test is skipped (and with it, every
other test is deselected).
"""

from __future__ import annotations

import pytest

from rope.harness.position_ids.case_file import KIND
from rope.harness.position_ids.check import assert_matches
from rope.harness.position_ids.implementations import get_position_ids_implementation, unsupported_reason
from rope.harness.position_ids.replay import resolve_recorded
from rope.harness.repro import parametrize_replays

# The replays: run with --rope-repro (or when named), not in a plain run.
pytestmark = [pytest.mark.replay, pytest.mark.harness_stage, pytest.mark.self_test]


def pytest_generate_tests(metafunc):
    parametrize_replays(metafunc, "position_ids_repro", KIND, "position-id")


def test_replayed_position_ids_case_matches(position_ids_repro):
    case, impl_name, user_named = position_ids_repro
    try:
        fn = (get_position_ids_implementation(impl_name) if user_named
              else resolve_recorded(impl_name, f"case file {case.path}"))
    except ValueError as exc:
        pytest.fail(str(exc))
    reason = unsupported_reason(impl_name, fn, case.family)
    if reason:
        pytest.skip(reason)
    assert_matches(impl_name, fn, case.family, case.batch)
