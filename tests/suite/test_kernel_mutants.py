"""The known Triton-kernel bugs, as mutants of our own kernels (properties/mutants/kernel.py), are
caught on the CPU under the interpreter: each applies exactly once to the kernel's source, the
prefill boundaries and the token x head products find the mutants that only a prefill-size batch
shows, and the known-bug triggers and known steps catch theirs as fixed cases. The guarded searches
that rope-harness mutants runs are properties/mutants/searches.py (its dedicated stages:
properties/rotation/test_mutant_searches.py, properties/position_step/test_mutant_searches.py)."""

from __future__ import annotations

import time

import pytest

import rope.triton.rotary as rotary_module
from rope.devices import is_interpreter
from rope.harness.mutation.kernel_mutant import KernelMutant, SubstitutionError
from rope.harness.mutation.searches import expect_failure
from rope.harness.position_step.guards import check_plain_and_guarded as check_positions
from rope.harness.rotation.check import assert_matches_reference
from rope.harness.rotation.guards import check_plain_and_guarded as check_rotation
from properties.known_cases import KNOWN_BUG_CASES
from properties.mutants.broken_rotations import TOKEN_HEAD_SWITCHES
from properties.mutants.kernel import (GPU_DEEP_MUTANTS, KNOWN_PAIRS, POSITIONS_MUTANTS, PREFILL_ONLY, ROTARY_CELLS,
                                       ROTARY_MUTANTS)
from properties.mutants.searches import search_position_kernel_mutant, search_rotation_kernel_mutant
from properties.strategies import KINDS
from properties.position_step.known_steps import CHUNK_1, CHUNK_2, DECODE

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.stack,              # meets the installed torch and Triton: CI runs it on every stack (.ci/run)
    pytest.mark.skipif(not is_interpreter(), reason="needs Triton's interpreter (TRITON_INTERPRET=1): the "
                                                    "tracer and the mutants' stray accesses are CPU-only"),
]


# --------------------------------------------------------------------------- the mutants apply
@pytest.mark.parametrize("name", list(ROTARY_MUTANTS) + list(POSITIONS_MUTANTS) + list(GPU_DEEP_MUTANTS))
def test_kernel_mutant_applies_exactly_once(name):
    mutant = {**ROTARY_MUTANTS, **POSITIONS_MUTANTS, **GPU_DEEP_MUTANTS}[name]
    assert mutant.__doc__ and "(" in mutant.__doc__, f"{name}: docstring must name the bug and its reference"
    assert mutant.source() != mutant.path.read_text()
    assert mutant.module.__name__.endswith(f"__mutant_{name}")
    assert callable(mutant.implementation)


def test_substitution_that_no_longer_matches_raises():
    stale = KernelMutant("stale", rotary_module, "rotate_triton", [("IS_NEOX=spec.is_neox_style ,", "x")], "stale")
    with pytest.raises(SubstitutionError, match="matched 0 times"):
        stale.source()


@pytest.mark.prefill           # the prefill-size boundary cases: minutes of the interpreter
@pytest.mark.parametrize("name", sorted(PREFILL_ONLY))
def test_prefill_boundaries_catch_kernel_mutant(name, record_property, monkeypatch, tmp_path):
    # A bug only a prefill-size batch shows: the boundary cases test_prefill.py runs on the CPU, in
    # order, from the last one below the wrong path's start (the ones below it run the right path:
    # under the interpreter they were 60% of this test's time), until one fails.
    from properties.strategies import POWER_OF_TWO_BOUNDARIES
    from properties.rotation.prefill_cases import boundary_case, power_of_two_boundaries_run
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))       # deliberate failures: keep reports/cases clean
    mutant = ROTARY_MUTANTS[name]
    start, found = time.perf_counter(), []
    counts = power_of_two_boundaries_run("cpu")
    first = max(i for i, tokens in enumerate(counts) if tokens < PREFILL_ONLY[name])
    for tokens in counts[first:]:
        try:
            index = POWER_OF_TWO_BOUNDARIES.index(tokens)
            assert_matches_reference(name, mutant, boundary_case(index, tokens, "cpu"), "cpu")
        except AssertionError as exc:
            found = [tokens, str(exc)]
            break
    record_property("time_to_failure_s", round(time.perf_counter() - start, 2))
    assert found, f"{name}: no prefill boundary case fails"
    assert found[0] in (4096, 4097) and "diagnosis: pairing_swapped" in found[1], found


@pytest.mark.parametrize("name", sorted(TOKEN_HEAD_SWITCHES))
def test_token_head_products_catch_rotation_mutant(name, monkeypatch, tmp_path):
    # A bug on a path chosen by tokens x (query + key heads): test_prefill.py's product cases find
    # it on the CPU, on exactly the layouts and pairings it breaks (partial-rotary NeoX), and, where
    # the implementation declares the product, on the first token count at it, not the last under it.
    from properties.rotation.prefill_cases import declared_token_head_cases, token_head_case, token_head_variants
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))       # deliberate failures: keep reports/cases clean
    mutant, product = TOKEN_HEAD_SWITCHES[name]
    caught, partial_neox = [], []
    for kind in KINDS:
        for index, (neox, partial) in enumerate(token_head_variants(kind, "cpu")):
            if neox and partial:
                partial_neox.append((kind, neox, partial))
            case = token_head_case(kind, neox, partial, index, "cpu")
            assert case.num_tokens * (case.num_q_heads + case.num_kv_heads) >= product
            try:
                assert_matches_reference(name, mutant, case, "cpu")
            except AssertionError as exc:
                assert "diagnosis:" in str(exc), str(exc)[:2000]
                caught.append((kind, neox, partial))
    assert caught == partial_neox and len(caught) >= 2, caught
    # The declared-switch cases (test_declared_token_head_switches_match_reference's): each pairing
    # and rotary width under the product passes, partial NeoX at it fails.
    failed = []
    for below, case in declared_token_head_cases((product,), "cpu"):
        try:
            assert_matches_reference(name, mutant, case, "cpu")
        except AssertionError:
            failed.append((below, case.spec.is_neox_style, case.spec.rotary_dim < case.spec.head_size))
    assert failed == [(False, True, True)], failed


@pytest.mark.parametrize("name,known", KNOWN_PAIRS, ids=[f"{m}-{k}" for m, k in KNOWN_PAIRS])
def test_known_trigger_catches_kernel_mutant(name, known, record_property):
    mutant, case = ROTARY_MUTANTS[name], KNOWN_BUG_CASES[known]
    found = expect_failure(lambda: check_rotation(name, mutant, case), record_property)
    _, _, must, must_not = ROTARY_CELLS[name]
    assert set(must) & set(found) and not set(must_not) & set(found), found


@pytest.mark.parametrize("batch", [CHUNK_1, CHUNK_2, DECODE], ids=["chunk1", "chunk2", "decode"])
def test_known_steps_catch_positions_mutant(batch, record_property):
    mutant = POSITIONS_MUTANTS["positions_store_unmasked"]
    found = expect_failure(lambda: check_positions(mutant.name, mutant, batch), record_property)
    assert "guard-write" in found, found


# The guarded searches rope-harness mutants runs as a kernel mutant's dedicated stage live in the
# shipped suite (properties/mutants/searches.py), kept out of a plain run there; the project's own run
# holds every one of them to its catch here.
@pytest.mark.parametrize("name", list(ROTARY_CELLS))
def test_the_dedicated_search_catches_rotation_kernel_mutant(name, record_property):
    search_rotation_kernel_mutant(name, record_property)


@pytest.mark.parametrize("name", list(POSITIONS_MUTANTS))
def test_the_dedicated_search_catches_position_kernel_mutant(name, record_property):
    search_position_kernel_mutant(name, record_property)


def test_a_kernel_mutant_that_no_longer_applies_is_refused_by_the_catalogue(monkeypatch):
    # A kernel edited under a mutant leaves a patch that matches nothing: the mutant would raise
    # where its bug should be, and the suite's tests fail on a raise as on a catch.  The catalogue
    # (what rope-harness mutants reads) refuses it instead, naming it.
    from properties.mutants import catalogue, kernel
    assert catalogue.catalogue()                      # every mutant applies today
    stale = KernelMutant("stale", rotary_module, "rotate_triton", [("no such source line", "x")], "stale (x)")
    monkeypatch.setitem(kernel.ROTARY_MUTANTS, "stale", stale)
    with pytest.raises(SubstitutionError, match="(?s)no longer apply.*mutant stale: substitution must match"):
        catalogue.catalogue()
