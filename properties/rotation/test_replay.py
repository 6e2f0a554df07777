"""Replay case files (rotation and position-id ones) through the suite's own checks:

    pytest --rope-repro reports/cases/<id>.json [--rope-impl fixed_kernel] [--rope-device cuda]
    pytest --rope-repro properties/regressions/        # every *.json in the directory
    pytest --rope-repro=/elsewhere/<id>.json            # outside the project: '=' form (pytest reads
                                                        # a bare path as the rootdir before the
                                                        # project's conftest defines the option)

The case's tensors regenerate bit-identically from its seed, the recorded implementation (a
registered name: a module path stored in a case file is never imported) or each --rope-impl runs on the recorded device (or each --rope-device), and
``assert_matches_reference`` holds it to the reference exactly as the property suite does: a
remaining mismatch fails with the diagnosis and the worst elements, a fixed one passes.
A position-id case file replays against its recorded adapter (or each --rope-position-ids-impl)
through the position-id check.  Without --rope-repro the tests are skipped (and with them, every
other test is deselected).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rope.harness.comparison import assert_matches_reference, skip_if_unsupported
from properties.strategies import build_rotation_inputs
from rope.harness.case_files import load_case
from rope.devices import available_devices
from rope.registry import get_implementation, get_recorded_implementation
from rope.harness import case_files
from rope.harness.position_ids import cases as position_id_cases
from rope.harness.position_ids import get_position_ids_implementation, unsupported_reason
from rope.harness.position_ids.cases import is_position_ids_case
from rope.harness.repro import regeneration_notes

# The replays: run with --rope-repro (or when named), not in a plain run.
pytestmark = [pytest.mark.replay, pytest.mark.harness_stage, pytest.mark.self_test]


def case_paths(arguments: list[str]) -> list[Path]:
    """Files as given; directories expand to their *.json files, sorted."""
    out = []
    for arg in arguments:
        path = Path(arg)
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise pytest.UsageError(f"--rope-repro={arg}: directory holds no *.json case files")
            out += found
        else:
            out.append(path)
    return out


def pytest_generate_tests(metafunc):
    if "position_ids_repro" in metafunc.fixturenames:
        _generate_position_ids_replays(metafunc)
    if "repro" not in metafunc.fixturenames:
        return
    config = metafunc.config
    arguments = config.getoption("--rope-repro")
    if not arguments:
        metafunc.parametrize("repro", [pytest.param(None, marks=pytest.mark.skip(
            reason="replays case files: needs --rope-repro CASE"))], ids=["no-case"])
        return
    found = available_devices()
    params = []
    for path in case_paths(arguments):
        if is_position_ids_case(path):
            continue
        try:
            case_file = load_case(path)
        except ValueError as exc:
            raise pytest.UsageError(f"--rope-repro: {exc}") from None
        devices = config.getoption("--rope-device") or [case_file.device]
        for device in devices:
            if device not in found:
                raise pytest.UsageError(f"--rope-repro={path}: device {device!r} is not available here "
                                        f"(found {found}); pass --rope-device")
        named = config.getoption("--rope-impl")     # named by the user: only these may be import paths
        for impl in named or [case_file.implementation]:
            for device in devices:
                params.append(pytest.param((case_file, impl, device, bool(named)),
                                           id=f"{case_file.id}-{impl}-{device}"))
    if not params:
        params = [pytest.param(None, marks=pytest.mark.skip(reason="no rotation case file given"), id="no-case")]
    metafunc.parametrize("repro", params)


def _generate_position_ids_replays(metafunc):
    """Position-id case files (``"kind": "position_ids"``): one replay per file and implementation
    (the recorded one, a registered name only, or each --rope-position-ids-impl)."""
    config = metafunc.config
    params = []
    for path in case_paths(config.getoption("--rope-repro")):
        if not is_position_ids_case(path):
            continue
        try:
            case = case_files.load_position_ids_case(path)
        except ValueError as exc:
            raise pytest.UsageError(f"--rope-repro: {exc}") from None
        named = config.getoption("--rope-position-ids-impl")
        for impl in named or [case.implementation]:
            params.append(pytest.param((case, impl, bool(named)), id=f"{case.id}-{impl}"))
    if not params:
        params = [pytest.param(None, marks=pytest.mark.skip(reason="no position-id case file given"), id="no-case")]
    metafunc.parametrize("position_ids_repro", params)


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
    assert_matches_reference(impl_name, impl, case, device)


def test_replayed_position_ids_case_matches(position_ids_repro):
    case, impl_name, user_named = position_ids_repro
    try:
        fn = (get_position_ids_implementation(impl_name) if user_named
              else position_id_cases.resolve_recorded(impl_name, f"case file {case.path}"))
    except ValueError as exc:
        pytest.fail(str(exc))
    reason = unsupported_reason(impl_name, fn, case.family)
    if reason:
        pytest.skip(reason)
    position_id_cases.assert_matches(impl_name, fn, case.family, case.batch)
