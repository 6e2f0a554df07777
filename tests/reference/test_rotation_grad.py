"""The reference VJP (reference/rotation_grad.py) held to torch.autograd of the float64 reference
forward (reference.rotate), with respect to query, key and the cos/sin cache.

The tensors are small integers in float64, so every product and every sum either side computes is
exact: the two must agree bit for bit whatever order they add in (autograd accumulates the cache's
gradient through index_put, the reference through index_add), with no tolerance to choose.  One
finite-difference gradcheck ties autograd itself to the forward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, strategies as st

import reference
from properties.strategies import KINDS, RotationCase, build_rotation_inputs, rotation_cases
from rope.spec import RopeSpec
from properties.rotation.backward_cases import with_model_examples

SMALL_CASES = st.sampled_from(KINDS).flatmap(
    lambda kind: rotation_cases(kind=kind, max_tokens=6, head_sizes=(8, 16, 32, 64), max_positions=(1, 7, 300)))


def _integers(shape, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-8, 9, shape, generator=gen).to(torch.float64)


def _autograd_and_reference(case: RotationCase):
    """(autograd's gradients, the reference VJP's), each (d query, d key or None, d cache)."""
    spec = case.spec
    positions = build_rotation_inputs(case).positions
    gen = torch.Generator().manual_seed(case.seed)
    width_q, width_k = case.num_q_heads * spec.head_size, case.num_kv_heads * spec.head_size
    query = _integers((case.num_tokens, width_q), gen)
    key = _integers((case.num_tokens, width_k), gen) if case.num_kv_heads else None
    cache = _integers((spec.max_position, spec.rotary_dim), gen)
    grad_q = _integers(query.shape, gen)
    grad_k = _integers(key.shape, gen) if key is not None else None
    leaves = [t.clone().requires_grad_() for t in (query, key, cache) if t is not None]
    out_q, out_k = reference.rotate(spec, positions, *(leaves if key is not None else [leaves[0], None, leaves[1]]))
    outputs = [out_q] + ([out_k] if key is not None else [])
    upstream = [grad_q] + ([grad_k] if key is not None else [])
    grads = torch.autograd.grad(outputs, leaves, upstream, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, leaves)]
    auto = (grads[0], grads[1] if key is not None else None, grads[-1])
    dq, dk = reference.rotate_grad(spec, positions, cache, grad_q, grad_k)
    d_cache = reference.cos_sin_cache_grad(spec, positions, query, key, cache, grad_q, grad_k)
    return auto, (dq, dk, d_cache)


@given(case=SMALL_CASES)
@with_model_examples("float32")
@example(case=RotationCase(RopeSpec(8, 4, False, (1, 1), "chunked", max_position=7), 0, 1, 1, "float32"))  # T = 0
@example(case=RotationCase(RopeSpec(16, 8, True, None, max_position=1), 3, 2, 0, "float32"))   # no key, one row read
def test_reference_vjp_equals_autograd_of_the_reference(case):
    # Rejects: the upstream gradient rotated by +θ or by another row's angle, pairs crossed, pass-through
    # gradients dropped or rotated, a cache gradient from the outputs or missing a head, a token or the key.
    auto, ours = _autograd_and_reference(case)
    for name, a, b in zip(("query", "key", "cos_sin_cache"), auto, ours):
        assert (a is None) == (b is None), name
        assert a is None or (a.dtype == b.dtype == torch.float64 and torch.equal(a, b)), name


def test_autograd_of_the_reference_is_its_derivative():
    # Finite differences (torch.autograd.gradcheck), so the test above compares with a true
    # derivative: GPT-J pairs, partial rotary, 3 rows, a key, every input differentiated.
    spec = RopeSpec(16, 8, False, (1, 2, 1), "chunked", max_position=5)
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 5, (3, 3), generator=gen)
    inputs = [torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_() for shape in ((3, 32), (3, 16), (5, 8))]
    assert torch.autograd.gradcheck(lambda q, k, c: reference.rotate(spec, positions, q, k, c), inputs)


def test_bad_gradients_are_refused_naming_the_field():
    spec = RopeSpec(16, 8, True, None, max_position=4)
    positions, query, cache = torch.zeros(2, dtype=torch.long), torch.zeros(2, 32), torch.zeros(4, 8)
    with pytest.raises(ValueError, match=r"grad_key=None: must be shaped and placed like key"):
        reference.cos_sin_cache_grad(spec, positions, query, torch.zeros(2, 16), cache, torch.zeros(2, 32), None)
    with pytest.raises(ValueError, match=r"grad_query=\(2, 16\) .*: must be shaped and placed like query"):
        reference.cos_sin_cache_grad(spec, positions, query, None, cache, torch.zeros(2, 16), None)
    with pytest.raises(ValueError, match=r"grad_query\.shape=\(3, 32\): must have num_tokens=2 rows"):
        reference.rotate_grad(spec, positions, cache, torch.zeros(3, 32), None)
