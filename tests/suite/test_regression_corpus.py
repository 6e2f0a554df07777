"""The regression corpus itself (properties/regressions/*.json): it loads, and every entry still
exposes the implementation it was recorded against, so a replay that passes means the bug is fixed,
not that the case went stale."""

from __future__ import annotations

import pytest

from rope.harness.rotation.case_file import load_case
from rope.harness.rotation.check import assert_matches_reference, skip_if_unsupported
from rope.registry import get_recorded_implementation
from properties.known_cases import REGRESSION_FILES as FILES


def test_corpus_is_not_empty_and_loads():
    assert len(FILES) >= 10
    for path in FILES:
        load_case(path)         # a corrupt or newer-schema file is a ValueError naming it


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_regression_case_still_catches_its_bug(device, path, monkeypatch, tmp_path):
    # The corpus entry still exposes the implementation it was recorded against.
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    monkeypatch.setenv("ROPE_NO_REPORT", "1")
    loaded = load_case(path)
    # The corpus names registered implementations or the suite's own mutants; any other module
    # path (a promoted case from elsewhere) is shown, never imported (pytest --rope-repro --rope-impl).
    broken = get_recorded_implementation(loaded.implementation, source=f"case file {path}",
                                         trusted=("properties.mutants",))
    skip_if_unsupported(loaded.implementation, broken, loaded.case.spec, loaded.case.dtype, device)
    with pytest.raises(AssertionError, match="does not match the reference"):
        assert_matches_reference(loaded.implementation, broken, loaded.case, device)
