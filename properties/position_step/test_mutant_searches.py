"""The guarded searches that ``rope-harness mutants`` runs as the dedicated stage of a position-step
kernel mutant (rope/harness/mutation/stages.py, ``--rope-mutant-search NAME``): the position property
must reject each known bug of the position kernel (properties/mutants/searches.py).  Kept out of a plain
run (the ``harness_stage`` marker); the project's own tests hold every one to its catch
(tests/suite/test_kernel_mutants.py)."""

from __future__ import annotations

import pytest

from properties.mutants.kernel import POSITIONS_MUTANTS
from properties.mutants.searches import search_position_kernel_mutant
from rope.devices import is_interpreter

pytestmark = [
    pytest.mark.self_test,          # runs deliberately broken implementations: kept out of the run report
    pytest.mark.harness_stage,      # rope-harness mutants asks for these (--rope-mutant-search); not a plain run's
    pytest.mark.interpreter,
    pytest.mark.stack,              # CI runs them on every stack it supports
    pytest.mark.skipif(not is_interpreter(), reason="needs Triton's interpreter (TRITON_INTERPRET=1): the "
                                                    "tracer and the mutants' stray accesses are CPU-only"),
]


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.mutant_search(f"kernel:{name}"))
                                  for name in POSITIONS_MUTANTS])
def test_position_property_catches_kernel_mutant(name, record_property):
    search_position_kernel_mutant(name, record_property)
