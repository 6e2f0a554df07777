"""The known Triton-kernel bugs, as mutants of our own kernels (properties/mutants/kernel.py), are
caught on the CPU under the interpreter by the rotation property (test_rotation.py's check) plus
the guard checker (properties/guards.py); the correct kernels raise no false alarm under guards.

Each mutant is searched for in the variant cell of test_rotation.py's parametrization where its
bug lives, derandomized and without shrinking (the time to the first failing example is recorded
as ``time_to_failure_s``, the detectors that fired as ``detected_by``), and its known-bug trigger
cases from known_cases.py are run as fixed cases.
"""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import Phase, example, given, settings, strategies as st

from properties.guards import (
    assert_matches_reference_guarded,
    assert_matches_reference_traced,
    assert_positions_match_guarded,
    trace_memory,
)
from properties.known_cases import KNOWN_BUG_CASES
from properties.mutants.broken_rotations import TOKEN_HEAD_SWITCHES
from rope.harness.comparison import assert_matches_reference
from properties.mutants.kernel import (GPU_DEEP_MUTANTS, POSITIONS_MUTANTS, PREFILL_ONLY, ROTARY_MUTANTS, KernelMutant,
                                       SubstitutionError)
from properties.strategies import KINDS, RotationCase, ragged_batches, rotation_cases
from properties.test_runner_positions import CHUNK_1, CHUNK_2, DECODE, assert_positions_match
from rope.devices import is_interpreter
from rope.registry import get_implementation, get_positions_implementation
from rope.spec import RopeSpec
import rope.triton.rotary as rotary_module

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.skipif(not is_interpreter(), reason="needs Triton's interpreter (TRITON_INTERPRET=1): the "
                                                    "tracer and the mutants' stray accesses are CPU-only"),
]

# Small shapes: the interpreter costs ~0.4 ms per program instance.
HEAD_SIZES = (64, 80, 96, 128, 32, 16)
MAX_POSITIONS = (64, 1, 7, 300)
MAX_TOKENS = 6

SEARCH = settings(max_examples=60, derandomize=True, database=None, deadline=None, print_blob=False,
                  phases=(Phase.explicit, Phase.generate))

# Mutant -> (dtype, kind, is_neox_style): the test_rotation.py cell that holds its bug; the
# known-bug trigger cases that apply; detectors of which one must fire; detectors that must not.
#   plain:        test_rotation.py's comparison on plain tensors (wild-read/-write: the tracer saw
#                 an access past an argument's storage, suppressed it and reported it)
#   guarded:      the comparison on guarded inputs;   nan: NaN in the output under guards
#   traced-read:  the tracer saw a read of a guard element (the value need not reach the output)
# A value bug may first show on a case where the plain run is blind (one token, position 0, a
# one-row cache): those accept either comparison.
VALUE_BUG = ("plain", "guarded")
ROTARY_CELLS = {
    "neox_for_gptj": (("bfloat16", "chunked3", False), ["gptj-paired-neox-glm41v"], VALUE_BUG, ()),
    # No known case applies: every known spec has a power-of-two rotary_dim/2, so our kernel has no
    # padding lanes there.  The values never reach the output: only the tracer sees the reads.
    "cos_sin_unmasked": (("bfloat16", "interleaved", True), [], ("traced-read",), ("plain", "guarded", "nan")),
    "cos_sin_unmasked_head_padded": (("bfloat16", "interleaved", True), ["interleaved-padding-lanes-qwen35"],
                                     ("traced-read",), ("plain", "guarded", "nan")),
    "partial_rotary_head_half": (("float32", "chunked3", True), ["partial-rotary-strides-glm41v"], VALUE_BUG, ()),
    "interleaved_h_bound_off_by_one": (("float32", "interleaved", True), ["interleaved-map-qwen3vl"], VALUE_BUG,
                                       ()),
    "interleaved_thw_order_swapped": (("float32", "interleaved", True), ["interleaved-map-short-sections"],
                                      VALUE_BUG, ()),
    # Identical to the right kernel on contiguous positions: only the row-strided guarded positions see it
    # (the sentinel it reads as a position is clamped to a cache row: a wrong value, and a traced read).
    "positions_rows_packed": (("float16", "chunked3", True), ["row-strides-many-tokens"], ("guarded", "traced-read"),
                              ("plain",)),
    # With one token, positions[0, 0 + d] IS positions[d, 0] in a packed [3, 1] tensor.
    "positions_rows_at_token_offsets": (("float16", "chunked3", True), ["row-strides-many-tokens"], VALUE_BUG, ()),
}
KNOWN_PAIRS = [(m, k) for m, (_, known, _, _) in ROTARY_CELLS.items() for k in known]

_PLAIN, _GUARDED = "[plain inputs]", "[guarded inputs]"


def check_rotation(name: str, fn, case: RotationCase) -> None:
    """test_rotation.py's check (assert_matches_reference, inside the tracer so that a broken kernel
    stays memory-safe and wild accesses are reported), then the guard checker; both always run."""
    failures = []
    for tag, check in ((_PLAIN, assert_matches_reference_traced), (_GUARDED, assert_matches_reference_guarded)):
        try:
            check(name, fn, case, "cpu")
        except AssertionError as exc:
            failures.append(f"{tag} {exc}")
    if failures:
        raise AssertionError("\n\n".join(failures))


def detectors(message: str) -> list[str]:
    """Which detectors a failure message shows (see ROTARY_CELLS)."""
    found = []
    for section in message.split("\n\n"):
        if "Mismatched elements" in section or "wrong positions" in section:
            found.append("guarded" if section.startswith(_GUARDED) else "plain")
    for needle, label in (("NaN in output", "nan"), ("guard modified", "guard-write"),
                          ("read(s) of guard elements", "traced-read"), ("write(s) of guard elements", "traced-write"),
                          ("wild read", "wild-read"), ("wild write", "wild-write")):
        if needle in message:
            found.append(label)
    return sorted(set(found), key=found.index)


def expect_failure(prop, record_property, calls=None) -> list[str]:
    """Run a property that must fail; record the time to the failure, the examples it took
    (including Hypothesis's final replay of the failing one) and the detectors that fired."""
    start = time.perf_counter()
    with pytest.raises(AssertionError) as info:
        prop()
    elapsed = time.perf_counter() - start
    found = detectors(str(info.value))
    record_property("time_to_failure_s", round(elapsed, 3))
    record_property("detected_by", ",".join(found))
    if calls is not None:
        record_property("examples_run", calls[0])
    print(f"caught in {elapsed:.2f} s{f' ({calls[0]} examples)' if calls else ''} by {found}")
    return found


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


# --------------------------------------------------------------------------- rotation mutants
@pytest.mark.parametrize("name", list(ROTARY_CELLS))
def test_rotation_property_catches_kernel_mutant(name, record_property):
    mutant = ROTARY_MUTANTS[name]
    (dtype, kind, neox), _, must, must_not = ROTARY_CELLS[name]

    @SEARCH
    @given(case=rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, max_tokens=MAX_TOKENS,
                               head_sizes=HEAD_SIZES, max_positions=MAX_POSITIONS))
    def rotation_matches_reference_under_guards(case):
        calls[0] += 1
        check_rotation(name, mutant, case)

    calls = [0]
    found = expect_failure(rotation_matches_reference_under_guards, record_property, calls)
    assert set(must) & set(found), f"{name}: expected one of {must}, got {found}"
    assert not set(must_not) & set(found), f"{name}: {sorted(set(must_not) & set(found))} must not fire ({found})"


@pytest.mark.parametrize("name", sorted(PREFILL_ONLY))
def test_prefill_boundaries_catch_kernel_mutant(name, record_property, monkeypatch, tmp_path):
    # A bug only a prefill-size batch shows: the boundary cases test_prefill.py runs on the CPU, in
    # order, from the last one below the wrong path's start (the ones below it run the right path:
    # under the interpreter they were 60% of this test's time), until one fails.
    from properties.strategies import POWER_OF_TWO_BOUNDARIES
    from properties.test_prefill import boundary_case, power_of_two_boundaries_run
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
    from properties.test_prefill import declared_token_head_cases, token_head_case, token_head_variants
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


# --------------------------------------------------------------------------- positions mutant
def _positions_checks(name, fn, batch):
    failures = []
    with trace_memory() as tracer:        # plain out: a spill past `out` is a wild write (suppressed)
        try:
            assert_positions_match(name, fn, batch, "cpu")
        except AssertionError as exc:
            failures.append(f"{_PLAIN} {exc}")
    failures += [f"{_PLAIN} memory violation: {m}" for m in tracer.messages()]
    try:
        assert_positions_match_guarded(name, fn, batch, "cpu")
    except AssertionError as exc:
        failures.append(f"{_GUARDED} {exc}")
    if failures:
        raise AssertionError("\n\n".join(failures))


@pytest.mark.parametrize("name", list(POSITIONS_MUTANTS))
def test_position_property_catches_kernel_mutant(name, record_property):
    mutant = POSITIONS_MUTANTS[name]

    @SEARCH
    @given(batch=ragged_batches())
    def prepared_positions_match_reference_under_guards(batch):
        calls[0] += 1
        _positions_checks(name, mutant, batch)

    calls = [0]
    found = expect_failure(prepared_positions_match_reference_under_guards, record_property, calls)
    assert "guard-write" in found or "traced-write" in found, found


@pytest.mark.parametrize("batch", [CHUNK_1, CHUNK_2, DECODE], ids=["chunk1", "chunk2", "decode"])
def test_known_steps_catch_positions_mutant(batch, record_property):
    mutant = POSITIONS_MUTANTS["positions_store_unmasked"]
    found = expect_failure(lambda: _positions_checks(mutant.name, mutant, batch), record_property)
    assert "guard-write" in found, found


# --------------------------------------------------------------------------- no false alarms
TRITON = get_implementation("triton")
NATIVE = get_implementation("native")

# Positions at the last cache row on the last token, strided packed qkv, partial rotary, padding
# lanes (rotary_dim/2 not a power of two), one-row caches, key absent.
EDGE_CASES = {
    "chunked3-gptj-partial-last-row": RotationCase(RopeSpec(128, 64, False, (8, 12, 12), "chunked", 1e4, 300),
                                                   5, 3, 1, "bfloat16", "last_row", True, 11),
    "interleaved-neox-padding-lanes-last-row": RotationCase(RopeSpec(80, 80, True, (10, 15, 15), "interleaved",
                                                                     1e4, 64), 6, 2, 2, "float32", "last_row", False, 12),
    "chunked4-neox-padding-lanes-packed": RotationCase(RopeSpec(96, 48, True, (6, 6, 6, 6), "chunked", 1e4, 7),
                                                       4, 4, 2, "float16", "last_row", True, 13),
    "1d-gptj-one-row-cache": RotationCase(RopeSpec(64, 64, False, None, "chunked", 1e4, 1), 3, 2, 0, "float32",
                                          "last_row", True, 14),
    "1d-neox-partial-last-row": RotationCase(RopeSpec(112, 56, True, None, "chunked", 1e6, 300), 4, 3, 3,
                                             "bfloat16", "last_row", False, 15),
}
CORRECT_KNOWN = sorted({k for _, k in KNOWN_PAIRS})


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_correct_kernels_pass_under_guards(name):
    case = EDGE_CASES[name]
    check_rotation("triton", TRITON, case)
    check_rotation("native", NATIVE, case)


@pytest.mark.parametrize("known", CORRECT_KNOWN)
def test_correct_kernel_passes_known_triggers_under_guards(known):
    # The plain check of these cases is test_rotation.py's test_known_bug_triggers_match_reference;
    # here: no guard violation on the very cases that catch the mutants.
    assert_matches_reference_guarded("triton", TRITON, KNOWN_BUG_CASES[known], "cpu")


@settings(max_examples=20, derandomize=True, database=None, deadline=None, print_blob=False)
@given(case=st.tuples(st.sampled_from(["float32", "bfloat16"]), st.sampled_from(KINDS)).flatmap(
    lambda dk: rotation_cases(dtype=dk[0], kind=dk[1], max_tokens=MAX_TOKENS, head_sizes=HEAD_SIZES,
                              max_positions=MAX_POSITIONS)))
@example(case=EDGE_CASES["interleaved-neox-padding-lanes-last-row"])
def test_correct_kernel_passes_under_guards_on_generated_cases(case):
    check_rotation("triton", TRITON, case)


@settings(max_examples=30, derandomize=True, database=None, deadline=None, print_blob=False)
@given(batch=ragged_batches())
@example(batch=CHUNK_1)
@example(batch=CHUNK_2)
@example(batch=DECODE)
def test_correct_positions_kernel_passes_under_guards(batch):
    _positions_checks("triton", get_positions_implementation("triton"), batch)


def test_guarded_cache_is_strided_and_accepted():
    # rotate_triton passes cache.stride(0) to the kernel and check_rotation_inputs accepts any row
    # stride: the guarded cache reaches the kernel as a view, not a contiguous copy.
    from properties.guards import guard_rotation_inputs
    case = EDGE_CASES["chunked3-gptj-partial-last-row"]
    x = guard_rotation_inputs(case)
    assert x.cache.stride(0) > case.spec.rotary_dim and x.positions.stride(0) > case.num_tokens
    assert x.query.stride(0) > x.query.shape[1]
    with trace_memory(x.guards) as tracer:
        TRITON(case.spec, x.positions, x.query, x.key, x.cache)
    assert tracer.launches == 1 and not tracer.messages()
    # The kernel read the guarded allocations themselves (no contiguous copy was made).
    assert tracer.touched.get("cos_sin_cache", 0) > 0 and tracer.touched.get("positions", 0) > 0
    assert tracer.touched.get("qkv", 0) > 0
    g = next(g for g in x.guards if g.name == "cos_sin_cache")
    assert torch.isnan(g.buffer[0]).all() and torch.isnan(g.buffer[-1]).all()
    assert torch.isnan(g.buffer[1:-2, case.spec.rotary_dim:]).all()
