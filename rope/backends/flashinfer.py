"""FlashInfer's ``flashinfer.rope.apply_rope_with_cos_sin_cache`` (1-D RoPE, CUDA only).

Its interface is the serving engines' (docs/spec.md §8.3): positions ``[T]`` (int32 or int64),
query ``[T, heads * head_size]``, key ``[T, kv_heads * head_size]``, ``head_size``, the cos|sin cache
``[L, rotary_dim]`` (float32 only: the adapter upcasts the harness's rounded cache, which is exact) and
``is_neox``; channels past rotary_dim pass through.  It computes in float32 and returns new tensors.
No M-RoPE: positions are 1-D only, so every multi-row spec is unsupported; q/k in float16 or
bfloat16 only (float32 raises "failed to dispatch data type").
"""

from __future__ import annotations

import torch

from rope.backends import declare, require
from rope.backends.known_faults import flashinfer_defect, flashinfer_fault
from rope.spec import RopeSpec, check_rotation_inputs

_rope = require("flashinfer.rope", distribution="flashinfer-python",
                install="pip install flashinfer-python (needs a CUDA GPU)")


def engine_call(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """FlashInfer's call on these inputs, bound once: a function of no arguments returning (q, k).
    The float32 cache is made here, once, as an engine holds it."""
    k_in = key if key is not None else query.new_zeros(query.shape[0], spec.head_size)
    cache = cos_sin_cache.to(torch.float32)

    def rotate():
        q_out, k_out = _rope.apply_rope_with_cos_sin_cache(positions, query, k_in, spec.head_size, cache,
                                                           is_neox=spec.is_neox_style)
        return q_out, (k_out if key is not None else None)
    return rotate


def rotate_flashinfer(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    return engine_call(spec, positions, query, key, cos_sin_cache)()


def _reason(spec: RopeSpec, dtype, device: str) -> str | None:
    if spec.num_dims != 1:
        return "apply_rope_with_cos_sin_cache takes 1-D positions only (no M-RoPE / XD-RoPE)"
    if device != "cuda":
        return f"FlashInfer's kernels are CUDA only (device {device})"
    if dtype not in (torch.float16, torch.bfloat16):
        # 0.7.4 on the H200: "apply_rope_pos_ids_cos_sin_cache ... failed to dispatch data type"
        return f"FlashInfer's rope kernels dispatch float16/bfloat16 q/k only (dtype {dtype})"
    return None


rotate_flashinfer = declare(rotate_flashinfer, working_precision="float32", reason=_reason, fault=flashinfer_fault,
                            defect=flashinfer_defect)
