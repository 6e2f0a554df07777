"""The correct kernels raise no false alarm under the guard checker (rope/harness/guards.py and each
slice's guards): the edge
cases, the known-bug triggers, generated cases and the position step, with the guarded cache
reaching the kernel as a strided view."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from rope.devices import is_interpreter
from rope.registry import get_implementation, get_positions_implementation
from rope.spec import RopeSpec
from rope.harness.guards import trace_memory
from rope.harness.position_step.guards import check_plain_and_guarded as check_positions
from rope.harness.rotation.guards import assert_matches_reference_guarded, guard_rotation_inputs
from rope.harness.rotation.guards import check_plain_and_guarded as check_rotation
from properties.known_cases import KNOWN_BUG_CASES
from properties.mutants.kernel import HEAD_SIZES, KNOWN_PAIRS, MAX_POSITIONS, MAX_TOKENS
from properties.strategies import KINDS, RotationCase, ragged_batches, rotation_cases
from properties.position_step.known_steps import CHUNK_1, CHUNK_2, DECODE


pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.stack,              # meets the installed torch and Triton: CI runs it on every stack (.ci/run)
    pytest.mark.skipif(not is_interpreter(), reason="needs Triton's interpreter (TRITON_INTERPRET=1): the "
                                                    "tracer and the mutants' stray accesses are CPU-only"),
]

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
    check_positions("triton", get_positions_implementation("triton"), batch)


def test_guarded_cache_is_strided_and_accepted():
    # rotate_triton passes cache.stride(0) to the kernel and check_rotation_inputs accepts any row
    # stride: the guarded cache reaches the kernel as a view, not a contiguous copy.
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
