"""The guarded searches that ``rope-harness mutants`` runs as the dedicated stage of a position-step
kernel mutant (rope/harness/mutation/stages.py, ``--rope-mutant-search NAME``): the position property
must reject each known bug of the position kernel (properties/mutants/searches.py).  Kept out of a plain
run (the ``harness_stage`` marker); the project's own tests hold every one to its catch
(tests/suite/test_kernel_mutants.py)."""

from __future__ import annotations

import pytest

from properties.mutants.kernel import POSITIONS_MUTANTS
from properties.mutants.searches import SEARCH_MARKS, search_position_kernel_mutant

pytestmark = SEARCH_MARKS


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.mutant_search(f"kernel:{name}"))
                                  for name in POSITIONS_MUTANTS])
def test_position_property_catches_kernel_mutant(name, record_property):
    search_position_kernel_mutant(name, record_property)
