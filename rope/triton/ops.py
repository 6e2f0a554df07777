"""The built-in Triton entries as torch custom ops (``torch.library``), for serving engines that
compile their model: ``torch.compile(fullgraph=True)`` traces an attention preamble (q/k from a
linear layer, the rotation, a write) through them without a graph break, and the compiled
function can be captured in a CUDA graph.

    torch.ops.rope_harness.rotary_(positions, query, key, cos_sin_cache,
                                   head_size, rotary_dim, is_neox_style, sections, layout, freq_rows) -> ()
        rotates query and key (None allowed) in place; ``sections`` empty for 1-D RoPE,
        ``freq_rows`` empty except for layout "custom" (the spec's fields of those names).
    torch.ops.rope_harness.rotary(positions, query, key, cos_sin_cache, head_size, rotary_dim,
                                  is_neox_style, sections, layout, freq_rows, inverse) -> (q_out, k_out)
        the same rotation out of place (by -θ with ``inverse``), differentiable: its backward is
        this op with ``inverse`` flipped on the upstream gradients.  ``k_out`` is [T, 0] without a key.
    torch.ops.rope_harness.prepare_positions_(prefill_positions, prefill_delta, idx_mapping,
                                              query_start_loc, prefill_lens, num_computed_tokens,
                                              num_dims, out) -> ()
        the runner's position step, writing ``out[:, :num_tokens]`` in place.

Each declares what it mutates, and has a fake implementation (shapes only, nothing computed) for
tracing.  :func:`rotary`, :func:`rotate_with_grad` and :func:`prepare_positions` take the harness's
own arguments (a ``RopeSpec``) and return what the entries return.

Autograd.  ``torch.library`` registers a backward only for a functional op (``register_autograd``
refuses one that mutates its inputs), so the differentiable rotation is ``rotary``: it rotates a
copy of query and key in place with the kernel and returns the copies (one extra read and write of
q and k against ``rotary_``).  Its backward saves no activation: the rotation's gradient with
respect to q and k is the upstream gradient rotated by -θ, which needs the positions and the cache
alone (reference/rotation_grad.py), so it would stay right even with the forward in place, and the
kernel with its INVERSE switch computes it, again on a copy: the upstream gradient it is handed is
never written (autograd may hand one gradient tensor to several consumers).  The cache gets no
gradient (:func:`rotate_with_grad` refuses a cache that requires one).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from rope.spec import RopeSpec
from rope.triton.positions import prepare_positions_triton
from rope.triton.rotary import rotate_triton

__all__ = ["NAMESPACE", "prepare_positions", "rotary", "rotate", "rotate_with_grad"]

NAMESPACE = "rope_harness"


@functools.lru_cache(maxsize=256)
def _spec(head_size: int, rotary_dim: int, is_neox_style: bool, sections: tuple[int, ...], layout: str,
          freq_rows: tuple[int, ...]) -> RopeSpec:
    """The spec of an op call (validated once per configuration); the kernel reads neither the
    base nor the cache length, which the cache tensor already holds."""
    return RopeSpec(head_size=head_size, rotary_dim=rotary_dim, is_neox_style=is_neox_style,
                    sections=sections or None, layout=layout, freq_rows=freq_rows or None)


@torch.library.custom_op(f"{NAMESPACE}::rotary_", mutates_args=("query", "key"))
def _rotary_op(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor],
               cos_sin_cache: torch.Tensor, head_size: int, rotary_dim: int, is_neox_style: bool,
               sections: list[int], layout: str, freq_rows: list[int]) -> None:
    spec = _spec(head_size, rotary_dim, is_neox_style, tuple(sections), layout, tuple(freq_rows))
    q_out, k_out = rotate_triton(spec, positions, query, key, cos_sin_cache)
    # The entry rotates a copy when the last dim is strided: the op's contract is in place.
    if q_out is not query:
        query.copy_(q_out)
    if key is not None and k_out is not key:
        key.copy_(k_out)


@_rotary_op.register_fake
def _rotary_fake(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox_style, sections, layout,
                 freq_rows):
    return None


@torch.library.custom_op(f"{NAMESPACE}::rotary", mutates_args=())
def _rotary_functional_op(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor],
                          cos_sin_cache: torch.Tensor, head_size: int, rotary_dim: int, is_neox_style: bool,
                          sections: list[int], layout: str, freq_rows: list[int],
                          inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    spec = _spec(head_size, rotary_dim, is_neox_style, tuple(sections), layout, tuple(freq_rows))
    q_out = query.clone(memory_format=torch.contiguous_format)
    k_out = key.clone(memory_format=torch.contiguous_format) if key is not None else _no_key(query)
    rotate_triton(spec, positions, q_out, k_out if key is not None else None, cos_sin_cache, inverse=inverse)
    return q_out, k_out


def _no_key(query: torch.Tensor) -> torch.Tensor:
    """The op's second output without a key: no heads."""
    return query.new_empty((query.shape[0], 0))


@_rotary_functional_op.register_fake
def _rotary_functional_fake(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox_style, sections,
                            layout, freq_rows, inverse):
    return (torch.empty_like(query, memory_format=torch.contiguous_format),
            torch.empty_like(key, memory_format=torch.contiguous_format) if key is not None else _no_key(query))


def _rotary_setup_context(ctx, inputs, output):
    positions, _, key, cos_sin_cache, *spec_fields, inverse = inputs
    ctx.save_for_backward(positions, cos_sin_cache)      # no activation: q and k never enter the gradient
    ctx.spec_fields = spec_fields
    ctx.inverse = inverse
    ctx.has_key = key is not None


def _rotary_backward(ctx, grad_query, grad_key):
    """The upstream gradients rotated the other way (the same op, ``inverse`` flipped: so the
    backward is differentiable too)."""
    positions, cos_sin_cache = ctx.saved_tensors
    dq, dk = torch.ops.rope_harness.rotary(positions, grad_query, grad_key if ctx.has_key else None, cos_sin_cache,
                                           *ctx.spec_fields, not ctx.inverse)
    return (None, dq, dk if ctx.has_key else None) + (None,) * 8


_rotary_functional_op.register_autograd(_rotary_backward, setup_context=_rotary_setup_context)


@torch.library.custom_op(f"{NAMESPACE}::prepare_positions_", mutates_args=("out",))
def _prepare_positions_op(prefill_positions: torch.Tensor, prefill_delta: torch.Tensor, idx_mapping: torch.Tensor,
                          query_start_loc: torch.Tensor, prefill_lens: torch.Tensor,
                          num_computed_tokens: torch.Tensor, num_dims: int, out: torch.Tensor) -> None:
    prepare_positions_triton(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                             num_computed_tokens, num_dims, out)


@_prepare_positions_op.register_fake
def _prepare_positions_fake(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                            num_computed_tokens, num_dims, out):
    return None


def rotary(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """The rotation through the custom op: the rotation contract's call, returning (query, key)
    rotated in place."""
    torch.ops.rope_harness.rotary_(positions, query, key, cos_sin_cache, spec.head_size, spec.rotary_dim,
                                   spec.is_neox_style, list(spec.sections or ()), spec.layout,
                                   list(spec.freq_rows or ()))
    return query, key


@functools.wraps(rotate_triton)      # its declarations too (the registry's "triton" is this entry)
def rotate(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """The registered ``"triton"`` rotation: :func:`rope.triton.rotary.rotate_triton`, and under
    torch.compile the op above, one opaque node whose fake gives the shapes: Dynamo cannot trace the
    launcher's host code with symbolic sizes (an InternalTorchDynamoError at the launch on an H100,
    torch 2.11, dynamic=True; found by properties/rotation/test_modes.py)."""
    if torch.compiler.is_compiling():
        return rotary(spec, positions, query, key, cos_sin_cache)
    return rotate_triton(spec, positions, query, key, cos_sin_cache)


def rotate_with_grad(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """The rotation as torch.autograd differentiates it (the registered ``"triton-autograd"``):
    (query_out, key_out or None), new tensors rotated by the Triton kernel, query and key left as
    they were; ``torch.autograd`` differentiates them with respect to query and key (the kernel
    again, by -θ), and ``torch.compile(fullgraph=True)`` traces through it (the op is opaque to the
    compiler).  Inputs are checked as ``rotate_triton`` checks them (ValueError, before any launch);
    a ``cos_sin_cache`` that requires a gradient is refused: no gradient flows to the table."""
    if cos_sin_cache.requires_grad:
        raise ValueError("cos_sin_cache.requires_grad=True: the Triton rotation gives the cos/sin cache no gradient "
                         "(detach it, or differentiate the table with another implementation)")
    q_out, k_out = torch.ops.rope_harness.rotary(positions, query, key, cos_sin_cache, spec.head_size,
                                                 spec.rotary_dim, spec.is_neox_style, list(spec.sections or ()),
                                                 spec.layout, list(spec.freq_rows or ()), False)
    return q_out, (k_out if key is not None else None)


def prepare_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                      num_computed_tokens, num_dims, out) -> None:
    """The position step through the custom op (the position-step contract's call)."""
    torch.ops.rope_harness.prepare_positions_(prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                              prefill_lens, num_computed_tokens, num_dims, out)


rotary.working_precision = rotate_triton.working_precision
rotary.supports = rotate_triton.supports
rotate_with_grad.working_precision = rotate_triton.working_precision
rotate_with_grad.supports = rotate_triton.supports
rotate_with_grad.switch_tokens = rotate_triton.switch_tokens      # the same kernel and plan, both ways
rotate_with_grad.autograd = True
prepare_positions.supports = prepare_positions_triton.supports
