"""The regression corpus: every case in properties/regressions/*.json, replayed on every run
against every implementation under test (built-ins or --rope-impl) on every device.

Each file is a case file (rope.harness.case_files) that once exposed a real bug; its recorded implementation
is the broken one, the inputs are what matter.  Promoting a new mismatch is copying its file
from reports/cases/ into properties/regressions/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rope.harness.case_files import load_case
from rope.harness.comparison import assert_matches_reference, skip_if_unsupported
from rope.registry import get_implementation

CORPUS = Path(__file__).parents[1] / "regressions"
FILES = sorted(CORPUS.glob("*.json"))


@pytest.mark.fixed_cases
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_regression_case_matches_reference(impl_name, device, path, monkeypatch, tmp_path):
    case = load_case(path).case
    impl = get_implementation(impl_name)
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    assert_matches_reference(impl_name, impl, case, device)
