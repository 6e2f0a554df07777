"""The reference on aliased inputs: it writes nothing, so on overlapping views it gives what it
gives on private copies."""

from __future__ import annotations

import torch
from hypothesis import given

import reference
from properties.rotation.aliasing import aliased_inputs, case_strategy


@given(**case_strategy)
def test_reference_is_correct_on_overlapping_inputs(kind, spec, num_tokens, q_heads, seed):
    # The reference writes nothing: on aliased views it must give what it gives on private copies.
    positions, query, key, cache = aliased_inputs(kind, spec, num_tokens, q_heads, "cpu", seed)
    before = [t.clone() for t in (positions, query, key, cache)]
    q_out, k_out = reference.rotate(spec, positions, query, key, cache)
    q_ref, k_ref = reference.rotate(spec, *(t.clone() for t in before))
    torch.testing.assert_close(q_out, q_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(k_out, k_ref, rtol=0, atol=0, equal_nan=True)
    for old, new in zip(before, (positions, query, key, cache)):
        assert torch.equal(old, new), "the reference wrote to an input"
