"""Replay case files through the suite's own check:

    pytest --rope-repro reports/cases/<id>.json [--rope-impl fixed_kernel] [--rope-device cuda]
    pytest --rope-repro properties/regressions/        # every *.json in the directory
    pytest --rope-repro=/elsewhere/<id>.json            # outside the project: '=' form (pytest reads
                                                        # a bare path as the rootdir before the
                                                        # project's conftest defines the option)

The case's tensors regenerate bit-identically from its seed, the recorded implementation (a
registered name: a module path stored in a case file is never imported) or each --rope-impl runs on the recorded device (or each --rope-device), and
``assert_matches_reference`` holds it to the reference exactly as the property suite does: a
remaining mismatch fails with the diagnosis and the worst elements, a fixed one passes.
Without --rope-repro the test is skipped (and with it, every other test is deselected).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rope.harness.comparison import assert_matches_reference, skip_if_unsupported
from properties.strategies import build_rotation_inputs
from rope.harness.case_files import load_case
from rope.devices import available_devices
from rope.registry import get_implementation, get_recorded_implementation
from rope.harness.repro import regeneration_notes


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
    metafunc.parametrize("repro", params)


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
