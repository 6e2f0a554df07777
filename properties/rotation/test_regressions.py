"""The regression corpus: every case in properties/regressions/*.json, replayed on every run
against every implementation under test (built-ins or --rope-impl) on every device.

Each file is a rotation case file (rope.harness.rotation.case_file) that once exposed a real bug; its
recorded implementation is the broken one, the inputs are what matter.  Promoting a new mismatch is copying its file
from reports/cases/ into properties/regressions/.
"""

from __future__ import annotations

import pytest

from properties.known_cases import REGRESSION_FILES
from rope.harness.rotation.case_file import load_case
from rope.harness.rotation.check import assert_matches_reference, skip_if_unsupported
from rope.registry import get_implementation


@pytest.mark.fixed_cases
@pytest.mark.parametrize("path", REGRESSION_FILES, ids=[p.stem for p in REGRESSION_FILES])
def test_regression_case_matches_reference(impl_name, device, path, monkeypatch, tmp_path):
    case = load_case(path).case
    impl = get_implementation(impl_name)
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    assert_matches_reference(impl_name, impl, case, device)
