"""The rotation property rejects every broken implementation in properties/mutants, with a
shrunk counterexample: a harness that cannot fail catches nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from properties.checks import assert_matches_reference
from properties.mutants.broken_rotations import BROKEN_ROTATIONS
from properties.strategies import DTYPES, KINDS, rotation_cases


@pytest.mark.parametrize("broken", list(BROKEN_ROTATIONS))
def test_rotation_property_rejects_broken_implementation(broken):
    fn = BROKEN_ROTATIONS[broken]

    # The same property test_rotation_matches_reference runs, over all variants at once.
    @settings(max_examples=300, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(case=st.tuples(st.sampled_from(list(DTYPES)), st.sampled_from(KINDS)).flatmap(
        lambda dk: rotation_cases(dtype=dk[0], kind=dk[1])))
    def rotation_matches_reference(case):
        assert_matches_reference(broken, fn, case, "cpu")

    with pytest.raises(AssertionError, match="does not match the reference"):
        rotation_matches_reference()
