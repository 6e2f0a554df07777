"""Replay table case files through the suite's own check: ``pytest --rope-repro CASE`` (a file, or every
*.json of a directory) replays each table case file against its recorded implementation (a registered
name only: a module path stored in a case file is never imported) or each --rope-table-impl
(rope.harness.table.replay; the files of other kinds replay in their own checked thing's
test_replay.py).  Without --rope-repro the test is skipped (and with it, every other test is deselected).
"""

from __future__ import annotations

import pytest

from rope.harness.repro import parametrize_replays
from rope.harness.table.case_file import KIND
from rope.harness.table.check import assert_table_matches
from rope.harness.table.replay import resolve_recorded, unsupported_reason
from rope.registry import get_table_implementation

# The replays: run with --rope-repro (or when named), not in a plain run.
pytestmark = [pytest.mark.replay, pytest.mark.harness_stage, pytest.mark.self_test]


def pytest_generate_tests(metafunc):
    parametrize_replays(metafunc, "table_repro", KIND, "table")


def test_replayed_table_case_matches(table_repro):
    loaded, impl_name, user_named = table_repro
    try:
        fn = get_table_implementation(impl_name) if user_named else resolve_recorded(impl_name, f"case file {loaded.path}")
    except ValueError as exc:
        pytest.fail(str(exc))
    reason = unsupported_reason(impl_name, fn, loaded, loaded.device)
    if reason:
        pytest.skip(reason)
    assert_table_matches(impl_name, fn, loaded.case, loaded.device)
