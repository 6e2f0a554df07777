"""In place, on views: every implementation on each view an engine hands a rotation that works in
place (rope.harness.rotation.cases.VIEWS: contiguous tensors, column slices of a packed qkv tensor,
as_strided rows with gaps between them, the transposes of a heads-major qkv buffer, k and q
interleaved row by row in one strided buffer), held to the float64 reference.

The check (rope.harness.rotation.check) also holds every element of the buffer outside q's and k's
views (V's heads, the gaps) to its bits before the call, and, on the strided layouts, each view to
its input untouched or exactly the output returned for it: an engine that calls a rotation in place
reads the buffer afterwards.  The contract's q and k are any 2-D views (docs/implementations.md: no
implementation declares a narrower layout), so no view is skipped; an implementation that copies a
view it cannot read in place (the Triton entry copies a strided last dim) passes by leaving the
buffer untouched and returning the copy.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from properties.rotation.checks import supported_variants
from properties.rotation.views import VIEW_CASES, view_cases
from properties.strategies import DTYPES
from rope.harness.rotation.check import assert_matches_reference, skip_if_unsupported
from rope.registry import get_implementation


@given(data=st.data())
def test_views_match_reference(impl_name, device, data):
    # Rejects: heads of a heads-major view read at the contiguous head stride, a row's store past
    # its width into the gap or V, an in-place result written elsewhere than returned, and whatever
    # test_rotation_matches_reference rejects, on each layout.
    impl = get_implementation(impl_name)
    dtype, kind, neox, narrowed = data.draw(st.sampled_from(supported_variants(impl_name, impl, device, list(DTYPES))),
                                            label="variant")
    case = data.draw(view_cases(dtype=dtype, kind=kind, is_neox_style=neox, **narrowed), label="case")
    skip_if_unsupported(impl_name, impl, case.spec, dtype, device)
    assert_matches_reference(impl_name, impl, case, device)


@pytest.mark.fixed_cases
@pytest.mark.known_bug
@pytest.mark.parametrize("name", list(VIEW_CASES), ids=list(VIEW_CASES))
def test_view_cases_match_reference(impl_name, device, name):
    impl = get_implementation(impl_name)
    case = VIEW_CASES[name]
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    assert_matches_reference(impl_name, impl, case, device)
