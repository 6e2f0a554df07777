"""The guarded searches of the kernel mutants: each known Triton-kernel bug, as a mutant of our own
kernels (properties/mutants/kernel.py), is searched for in the variant cell of
properties/rotation/test_rotation.py's parametrization where its bug lives (ROTARY_CELLS), or on the
position step's batches, derandomized and without shrinking, with the property's check plus the guard
checker (rope.harness.rotation.guards, rope.harness.position_step.guards).  The time to the first failing
example is recorded as ``time_to_failure_s``, the detectors that fired as ``detected_by``
(rope.harness.mutation.searches).

``rope-harness mutants`` runs them as a kernel mutant's dedicated stage
(properties/rotation/test_mutant_searches.py, properties/position_step/test_mutant_searches.py); the
project's own tests hold every one of them to its catch (tests/suite/test_kernel_mutants.py).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings

from properties.mutants.kernel import HEAD_SIZES, MAX_POSITIONS, MAX_TOKENS, POSITIONS_MUTANTS, ROTARY_CELLS, ROTARY_MUTANTS
from properties.strategies import ragged_batches, rotation_cases
from rope.harness.mutation.searches import expect_failure
from rope.harness.position_step.guards import check_plain_and_guarded as check_positions_plain_and_guarded
from rope.harness.rotation.guards import check_plain_and_guarded as check_rotation_plain_and_guarded
from rope.devices import is_interpreter

# The marks of a module of dedicated searches (properties/<thing>/test_mutant_searches.py).
SEARCH_MARKS = [
    pytest.mark.self_test,          # runs deliberately broken implementations: kept out of the run report
    pytest.mark.harness_stage,      # rope-harness mutants asks for these (--rope-mutant-search); not a plain run's
    pytest.mark.interpreter,
    pytest.mark.stack,              # CI runs them on every stack it supports
    pytest.mark.skipif(not is_interpreter(), reason="needs Triton's interpreter (TRITON_INTERPRET=1): the "
                                                    "tracer and the mutants' stray accesses are CPU-only"),
]

SEARCH = settings(max_examples=60, derandomize=True, database=None, deadline=None, print_blob=False,
                  phases=(Phase.explicit, Phase.generate))


def search_rotation_kernel_mutant(name: str, record_property) -> None:
    """The rotation property, under guards, in the mutant's cell: it must fail, on the detectors
    ROTARY_CELLS names for it (one of those that must fire, none of those that must not)."""
    mutant = ROTARY_MUTANTS[name]
    (dtype, kind, neox), _, must, must_not = ROTARY_CELLS[name]

    @SEARCH
    @given(case=rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, max_tokens=MAX_TOKENS,
                               head_sizes=HEAD_SIZES, max_positions=MAX_POSITIONS))
    def rotation_matches_reference_under_guards(case):
        calls[0] += 1
        check_rotation_plain_and_guarded(name, mutant, case)

    calls = [0]
    found = expect_failure(rotation_matches_reference_under_guards, record_property, calls)
    assert set(must) & set(found), f"{name}: expected one of {must}, got {found}"
    assert not set(must_not) & set(found), f"{name}: {sorted(set(must_not) & set(found))} must not fire ({found})"


def search_position_kernel_mutant(name: str, record_property) -> None:
    """The position property, on a plain and on a guarded ``out``: it must fail, a guard or a traced
    write catching the mutant's writes past the step."""
    mutant = POSITIONS_MUTANTS[name]

    @SEARCH
    @given(batch=ragged_batches())
    def prepared_positions_match_reference_under_guards(batch):
        calls[0] += 1
        check_positions_plain_and_guarded(name, mutant, batch)

    calls = [0]
    found = expect_failure(prepared_positions_match_reference_under_guards, record_property, calls)
    assert "guard-write" in found or "traced-write" in found, found
