"""The reference refuses every bad input of the suite's table (properties/rotation/test_bad_inputs.py) with a
ValueError naming the field."""

from __future__ import annotations

import pytest

import reference
from properties.rotation.test_bad_inputs import _call, ERROR_INPUTS


@pytest.mark.parametrize("error", list(ERROR_INPUTS), ids=list(ERROR_INPUTS))
def test_reference_rejects_bad_input(error):
    make, pattern = ERROR_INPUTS[error]
    with pytest.raises(ValueError, match=pattern):
        _call(reference.rotate, make("cpu"))
