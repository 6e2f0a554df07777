"""Replay fused case files through the suite's own check: ``pytest --rope-repro CASE`` (a file, or every
*.json of a directory) replays each fused case file against its recorded implementation (a registered
name only: a module path stored in a case file is never imported) or each --rope-fused-impl
(rope.harness.fused.replay; the files of other kinds replay in their own checked thing's
test_replay.py).  Without --rope-repro the test is skipped (and with it, every other test is deselected).
"""

from __future__ import annotations

import pytest

from rope.harness.fused.case_file import KIND
from rope.harness.fused.check import assert_mla_rope_kv_cache, assert_qk_norm_rope, assert_rope_kv_cache
from rope.harness.fused.replay import implementation_of
from rope.harness.repro import parametrize_replays

# The replays: run with --rope-repro (or when named), not in a plain run.
pytestmark = [pytest.mark.replay, pytest.mark.harness_stage, pytest.mark.self_test]

ASSERTS = {"qk_norm_rope": assert_qk_norm_rope, "rope_kv_cache": assert_rope_kv_cache,
           "mla_rope_kv_cache": assert_mla_rope_kv_cache}


def pytest_generate_tests(metafunc):
    parametrize_replays(metafunc, "fused_repro", KIND, "fused")


def test_replayed_fused_case_matches(fused_repro):
    loaded, impl_name, user_named = fused_repro
    try:
        fn = implementation_of(loaded, impl_name, user_named)
    except ValueError as exc:
        pytest.fail(str(exc))
    ASSERTS[loaded.op](impl_name, fn, loaded.case, loaded.device)
