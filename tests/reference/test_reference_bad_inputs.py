"""The reference refuses every bad input of the suite's table (properties/rotation/test_bad_inputs.py) with a
ValueError naming the field."""

from __future__ import annotations

import pytest

import reference
from properties.rotation.bad_inputs import ERROR_INPUTS, call


@pytest.mark.parametrize("error", list(ERROR_INPUTS), ids=list(ERROR_INPUTS))
def test_reference_rejects_bad_input(error):
    make, pattern = ERROR_INPUTS[error]
    with pytest.raises(ValueError, match=pattern):
        call(reference.rotate, make("cpu"))
