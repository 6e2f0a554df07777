"""Broken backwards of the rotation, built on the project's Triton kernel: each forward is right
and each ``torch.autograd.Function`` backward carries one bug, so only the backward property
(properties/rotation/test_backward.py, which runs for an implementation declaring ``autograd``)
rejects it.  And one right backward that also differentiates the cos/sin cache, which it must pass.

Each is a rotation implementation (``fn(spec, positions, query, key, cos_sin_cache) -> (q, k)``):

* ``backward_returns_none``: no gradient for query and key;
* ``backward_rotates_forward``: the upstream gradient rotated by +θ instead of -θ;
* ``backward_writes_upstream_gradient``: the right values, rotated into the upstream gradient's own
  storage (as Liger-Kernel's backward does when the gradient's layout allows it);
* ``backward_reads_overwritten_input``: q and k rotated in place, and the cache's gradient computed
  from the tensors the forward was handed, which by then hold its outputs (the gradients of q and k
  need no activation and stay right; the cache's, ``g_a a + g_b b``, reads a and b).

``in_place_with_cache_grad`` is the last one done right: it keeps copies of q and k before
rotating them in place.  The first three's forwards share :class:`_SavesPositionsAndCache`'s.
"""

from __future__ import annotations

import torch

from reference.rotation import pair_indices
from rope.spec import RopeSpec
from rope.triton.rotary import rotate_triton

__all__ = ["BACKWARD_ONLY", "BROKEN_BACKWARDS", "backward_reads_overwritten_input", "backward_returns_none",
           "backward_rotates_forward", "backward_writes_upstream_gradient", "in_place_with_cache_grad"]


def _rotated_copies(spec, positions, query, key, cache, *, inverse: bool = False):
    q = query.detach().clone()
    k = key.detach().clone() if key is not None else None
    return rotate_triton(spec, positions, q, k, cache, inverse=inverse)


class _NoGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, positions, query, key, cache):
        return _rotated_copies(spec, positions, query, key, cache)

    @staticmethod
    def backward(ctx, grad_query, grad_key):
        return None, None, None, None, None


class _SavesPositionsAndCache(torch.autograd.Function):
    """The right forward, keeping what a rotation's backward needs (the positions and the cache)."""
    @staticmethod
    def forward(ctx, spec, positions, query, key, cache):
        ctx.spec, ctx.has_key = spec, key is not None
        ctx.save_for_backward(positions, cache)
        return _rotated_copies(spec, positions, query, key, cache)


class _ForwardAgain(_SavesPositionsAndCache):
    @staticmethod
    def backward(ctx, grad_query, grad_key):
        positions, cache = ctx.saved_tensors
        dq, dk = _rotated_copies(ctx.spec, positions, grad_query, grad_key if ctx.has_key else None, cache)
        return None, None, dq, dk, None


class _WritesUpstream(_SavesPositionsAndCache):
    @staticmethod
    def backward(ctx, grad_query, grad_key):
        positions, cache = ctx.saved_tensors
        dq, dk = rotate_triton(ctx.spec, positions, grad_query, grad_key if ctx.has_key else None, cache, inverse=True)
        return None, None, dq, dk, None


def cache_grad_float32(spec: RopeSpec, positions, query, key, cache, grad_query, grad_key) -> torch.Tensor:
    """The cache's gradient as an implementation computes it: pair products summed over heads and
    scattered into the rows read, in float32, then stored in the cache's dtype."""
    a_idx, b_idx = pair_indices(spec)
    d_cos = d_sin = 0
    for x, g in ((query, grad_query), (key, grad_key)):
        if x is None:
            continue
        heads = x.float().reshape(x.shape[0], x.shape[1] // spec.head_size, spec.head_size)
        g = g.float().reshape(heads.shape)
        a, b, g_a, g_b = heads[..., a_idx], heads[..., b_idx], g[..., a_idx], g[..., b_idx]
        d_cos = d_cos + (g_a * a + g_b * b).sum(dim=1)
        d_sin = d_sin + (g_b * a - g_a * b).sum(dim=1)
    rows = positions.long().reshape(spec.num_dims, -1)
    pos = rows[torch.tensor(spec.axis_map(), device=rows.device)].T
    i = torch.arange(spec.num_freqs, device=rows.device)
    grad = torch.zeros(cache.shape, dtype=torch.float32, device=cache.device)
    grad.view(-1).index_add_(0, (pos * cache.shape[1] + i).flatten(), d_cos.flatten())
    grad.view(-1).index_add_(0, (pos * cache.shape[1] + spec.num_freqs + i).flatten(), d_sin.flatten())
    return grad.to(cache.dtype)


class _InPlaceWithCacheGrad(torch.autograd.Function):
    """q and k rotated in place; the cache's gradient from ``ctx.inputs``: copies taken before the
    rotation (``keep_copies``), or the very tensors rotated (the bug)."""

    @staticmethod
    def forward(ctx, spec, positions, query, key, cache, keep_copies):
        ctx.spec, ctx.has_key = spec, key is not None
        ctx.save_for_backward(positions, cache)
        kept = [t.detach().clone() if keep_copies else t.detach() for t in (query, key) if t is not None]
        ctx.inputs = kept + [None] * (2 - len(kept))
        rotate_triton(spec, positions, query.detach(), key.detach() if key is not None else None, cache.detach())
        ctx.mark_dirty(*(t for t in (query, key) if t is not None))
        return query, key

    @staticmethod
    def backward(ctx, grad_query, grad_key):
        positions, cache = ctx.saved_tensors
        grad_key = grad_key if ctx.has_key else None
        dq, dk = _rotated_copies(ctx.spec, positions, grad_query, grad_key, cache, inverse=True)
        d_cache = cache_grad_float32(ctx.spec, positions, *ctx.inputs, cache, grad_query, grad_key)
        return None, None, dq, dk, d_cache, None


def _declared(fn=None, *, cache_grad: bool = False):
    """What each declares: the kernel's precision and support, autograd (``cache_grad``: the cache too)."""
    def declare(fn):
        fn.working_precision = "float32"
        fn.supports = rotate_triton.supports
        fn.autograd = True
        fn.cache_grad = cache_grad
        return fn
    return declare(fn) if fn is not None else declare


@_declared
def backward_returns_none(spec, positions, query, key, cos_sin_cache):
    """The forward right, the backward returning None for query and key."""
    return _NoGradient.apply(spec, positions, query, key, cos_sin_cache)


@_declared
def backward_rotates_forward(spec, positions, query, key, cos_sin_cache):
    """The backward rotating the upstream gradient by +θ (the kernel's INVERSE switch left off)."""
    return _ForwardAgain.apply(spec, positions, query, key, cos_sin_cache)


@_declared
def backward_writes_upstream_gradient(spec, positions, query, key, cos_sin_cache):
    """The right gradient values, rotated into the upstream gradient's storage."""
    return _WritesUpstream.apply(spec, positions, query, key, cos_sin_cache)


@_declared(cache_grad=True)
def backward_reads_overwritten_input(spec, positions, query, key, cos_sin_cache):
    """q and k rotated in place; the cache's gradient read from them after the forward overwrote them."""
    return _InPlaceWithCacheGrad.apply(spec, positions, query, key, cos_sin_cache, False)


@_declared(cache_grad=True)
def in_place_with_cache_grad(spec, positions, query, key, cos_sin_cache):
    """q and k rotated in place, and the cache differentiated from copies kept before: right."""
    return _InPlaceWithCacheGrad.apply(spec, positions, query, key, cos_sin_cache, True)


BROKEN_BACKWARDS = {
    "backward_returns_none": backward_returns_none,
    "backward_rotates_forward": backward_rotates_forward,
    "backward_writes_upstream_gradient": backward_writes_upstream_gradient,
    "backward_reads_overwritten_input": backward_reads_overwritten_input,
}
# As broken_rotations.MODE_ONLY: mutants whose bug no forward call shows, and the property that catches
# each (properties/rotation/test_backward.py); its diagnosis is the backward's label
# (rope.harness.rotation.backward.BACKWARD_LABELS).
BACKWARD_ONLY = {name: "test_backward_matches_reference_vjp" for name in BROKEN_BACKWARDS}
