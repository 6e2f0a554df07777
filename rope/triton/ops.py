"""The built-in Triton entries as torch custom ops (``torch.library``), for serving engines that
compile their model: ``torch.compile(fullgraph=True)`` traces an attention preamble (q/k from a
linear layer, the rotation, a write) through them without a graph break, and the compiled
function can be captured in a CUDA graph.

    torch.ops.rope_harness.rotary_(positions, query, key, cos_sin_cache,
                                   head_size, rotary_dim, is_neox_style, sections, layout, freq_rows) -> ()
        rotates query and key (None allowed) in place; ``sections`` empty for 1-D RoPE,
        ``freq_rows`` empty except for layout "custom" (the spec's fields of those names).
    torch.ops.rope_harness.prepare_positions_(prefill_positions, prefill_delta, idx_mapping,
                                              query_start_loc, prefill_lens, num_computed_tokens,
                                              num_dims, out) -> ()
        the runner's position step, writing ``out[:, :num_tokens]`` in place.

Each declares what it mutates, and has a fake implementation (shapes only, nothing computed) for
tracing.  :func:`rotary` and :func:`prepare_positions` take the harness's own arguments (a
``RopeSpec``) and return what the entries return.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from rope.spec import RopeSpec
from rope.triton.positions import prepare_positions_triton
from rope.triton.rotary import rotate_triton

__all__ = ["NAMESPACE", "prepare_positions", "rotary"]

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


def prepare_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                      num_computed_tokens, num_dims, out) -> None:
    """The position step through the custom op (the position-step contract's call)."""
    torch.ops.rope_harness.prepare_positions_(prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                              prefill_lens, num_computed_tokens, num_dims, out)


rotary.working_precision = rotate_triton.working_precision
rotary.supports = rotate_triton.supports
prepare_positions.supports = prepare_positions_triton.supports
