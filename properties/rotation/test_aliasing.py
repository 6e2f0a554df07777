"""Inputs that overlap in memory: every built-in implementation refuses them with a ValueError
naming the tensors (the contract lets implementations rotate in place, so overlapping q/k
would be a silent wrong answer), decided from metadata alone; the reference, which writes
nothing, stays correct on them.  The overlap predicates are checked against brute force."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given

from properties.rotation.aliasing import SPECS, aliased_inputs, case_strategy
from rope.harness.draws import skip_unless_builtin
from rope.registry import get_implementation

@pytest.mark.builtins_only
@given(**case_strategy)
@example(kind="key-is-query", spec=SPECS[1], num_tokens=4, q_heads=2, seed=0)
@example(kind="query-expanded", spec=SPECS[0], num_tokens=4, q_heads=1, seed=0)
def test_implementation_refuses_overlapping_inputs(impl_name, device, kind, spec, num_tokens, q_heads, seed):
    skip_unless_builtin(impl_name)
    positions, query, key, cache = aliased_inputs(kind, spec, num_tokens, q_heads, device, seed)
    before = [t.clone() for t in (positions, query, key, cache)]
    with pytest.raises(ValueError, match=r"(query|key) .*overlap in memory|(query|key) and (key|positions|cos_sin_cache) "
                                         r"overlap in memory"):
        get_implementation(impl_name)(spec, positions, query, key, cache)
    for name, old, new in zip(("positions", "query", "key", "cos_sin_cache"), before, (positions, query, key, cache)):
        assert torch.equal(old, new), f"{name} was written before the overlap was refused"
