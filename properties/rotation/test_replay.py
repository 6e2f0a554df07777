"""Replay rotation case files through the suite's own check:

    pytest --rope-repro reports/cases/<id>.json [--rope-impl fixed_kernel] [--rope-device cuda]
    pytest --rope-repro properties/regressions/        # every *.json in the directory
    pytest --rope-repro=/elsewhere/<id>.json            # outside the project: '=' form (pytest reads
                                                        # a bare path as the rootdir before the
                                                        # project's conftest defines the option)

The case's tensors regenerate bit-identically from its seed, the recorded implementation (a
registered name: a module path stored in a case file is never imported) or each --rope-impl runs on
the recorded device (or each --rope-device), and ``assert_matches_reference`` holds it to the
reference exactly as the property suite does: a remaining mismatch fails with the diagnosis and the
worst elements, a fixed one passes (rope.harness.rotation.replay; the files of other kinds replay in
their own checked thing's test_replay.py).  Without --rope-repro the test is skipped (and with it,
every other test is deselected).
"""

from __future__ import annotations

import pytest

from rope.harness.repro import parametrize_replays
from rope.harness.rotation.case_file import KIND
from rope.harness.rotation.cases import build_rotation_inputs
from rope.harness.rotation.check import checked_run, skip_if_unsupported
from rope.harness.rotation.modes import compiled_implementation, mode_unsupported_reason, mode_words, stale_replay
from rope.harness.rotation.replay import regeneration_notes
from rope.registry import get_implementation, get_recorded_implementation, implementation_record

# The replays: run with --rope-repro (or when named), not in a plain run.
pytestmark = [pytest.mark.replay, pytest.mark.harness_stage, pytest.mark.self_test]


def pytest_generate_tests(metafunc):
    parametrize_replays(metafunc, "repro", KIND, "rotation")


def test_replayed_case_matches_reference(repro):
    case_file, impl_name, device, user_named = repro
    try:
        if user_named:                                  # --rope-impl: the user's word
            impl = get_implementation(impl_name)
        else:                                           # named by the case file: registered names only
            impl = get_recorded_implementation(impl_name, source=f"case file {case_file.path}")
    except ValueError as exc:
        pytest.fail(str(exc))
    case = case_file.case
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    # A replay of different bits would prove nothing: the regeneration must be bit-identical.
    notes = regeneration_notes(case_file, build_rotation_inputs(case, "cpu"))
    assert not notes, f"{case_file.path}: {notes[0]}"
    # In the mode the failure was seen in: under torch.compile, or the recorded graph replays.
    record = implementation_record(impl_name, fn=impl)
    reason = mode_unsupported_reason(record, case_file.mode, device)
    if reason:
        pytest.skip(f"case {case_file.id} was recorded {mode_words(case_file.mode)}, and {reason}")
    if case_file.mode == "graph":
        stale, _ = stale_replay(record, case, case_file.replay_tokens, device)
        assert stale is None, stale.comparison.message(f"{impl_name} on {device}: {stale.sentence(case.num_tokens)}")
        return
    if case_file.mode == "compile":
        impl = compiled_implementation(record, device)
    checked_run(impl_name, impl, case, device, mode=case_file.mode)
