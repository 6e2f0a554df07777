"""FlashInfer's unfused RoPE + KV-cache write as contract B (docs/spec.md §10, CUDA only): the two
calls an engine makes without the fused FP8 op, ``flashinfer.rope.apply_rope_with_cos_sin_cache_inplace``
on q and k, then ``flashinfer.page.append_paged_kv_cache`` of the rotated k and of v.

What it computes is the contract's: q and the live k are rotated in place (in float32, stored in the
activation dtype) and returned, and k and v are copied into the paged caches.  Where the pair cannot
take a case, the adapter says why (``unsupported_reason``) instead of calling it:

* the append copies k and v bit for bit in the cache's own dtype (``page.cuh``'s
  AppendPagedKVCacheKernel: a vector ``memcpy``; nothing checks that the input's dtype is the
  cache's): caches in the activation dtype only, no FP8;
* its kernel is dispatched for head sizes 64, 128, 256 and 512 only (``DISPATCH_HEAD_DIM``);
* the rotation's own limits and measured faults and defects, as the rotation adapter declares them
  (rope/backends/flashinfer.py, whose reasons it asks): 1-D positions, float16/bfloat16, CUDA.

Addressing: one request owning every block in order, as for the fused op (rope.backends.
flashinfer_fused.page_table), so a token's ``positions`` entry is its slot.  The append has no skip
for a batch index of -1 (it reads ``kv_indptr[batch_indices[i]]`` unguarded): the adapter hands it
only the tokens with a slot, found on the host (``nonzero``), as a runner builds its append batch
from its real tokens.  Not for CUDA-graph capture.
"""

from __future__ import annotations

import sys

import torch

from rope.backends import require
from rope.backends.flashinfer_fused import page_table
from rope.backends.flashinfer import rotate_flashinfer
from rope.fused import check_rope_kv_cache_inputs
from rope.implementation import Implementation
from rope.spec import RopeSpec

__all__ = ["APPEND_HEAD_SIZES", "rope_kv_cache_flashinfer_unfused"]

_rope = require("flashinfer.rope", distribution="flashinfer-python",
                install="pip install flashinfer-python (needs a CUDA GPU)")
_page = require("flashinfer.page", distribution="flashinfer-python",
                install="pip install flashinfer-python (needs a CUDA GPU)")

# FlashInfer 0.7.4's AppendPagedKVCache: DISPATCH_HEAD_DIM (include/flashinfer/utils.cuh).
APPEND_HEAD_SIZES = (64, 128, 256, 512)


def rope_kv_cache_flashinfer_unfused(spec: RopeSpec, positions, query, key, value, key_cache, value_cache,
                                     slot_mapping, cos_sin_cache, *, kv_layout: str = "NHD", k_scale=None,
                                     v_scale=None):
    """Contract B through FlashInfer's two unfused calls: returns (query, key), rotated in place; the
    caches written at ``slot_mapping``."""
    check_rope_kv_cache_inputs(spec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                               cos_sin_cache, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    if key_cache.dtype != key.dtype or value_cache.dtype != value.dtype:
        raise ValueError(f"key_cache.dtype={key_cache.dtype}: FlashInfer's append copies k and v in the cache's "
                         f"dtype, which must be the activations' ({key.dtype}); no FP8")
    if spec.head_size not in APPEND_HEAD_SIZES:
        raise ValueError(f"head_size={spec.head_size}: FlashInfer's append runs head sizes {APPEND_HEAD_SIZES} only")
    _rope.apply_rope_with_cos_sin_cache_inplace(positions, query, key, spec.head_size,
                                                cos_sin_cache.to(torch.float32), is_neox=spec.is_neox_style)
    num_tokens, heads = query.shape[0], (-1, key.shape[1] // spec.head_size, spec.head_size)
    kv_indices, kv_indptr, batch, slots = page_table(slot_mapping, num_tokens, key_cache.shape[0])
    tokens = (batch >= 0).nonzero()[:, 0]          # the append reads kv_indptr[batch] unguarded
    if tokens.numel():
        block_size = key_cache.shape[1] if kv_layout == "NHD" else key_cache.shape[2]
        last_page_len = torch.tensor([block_size], dtype=torch.int32, device=key.device)
        _page.append_paged_kv_cache(key[tokens].reshape(heads), value[tokens].reshape(heads), batch[tokens],
                                    slots[tokens], (key_cache, value_cache), kv_indices, kv_indptr, last_page_len,
                                    kv_layout=kv_layout)
    return query, key


def _reason(case, device: str) -> str | None:
    """The pair's cache and head limits, then the rotation adapter's own reasons, known faults and
    known defects (rope/backends/flashinfer.py), which the pair's first call shares."""
    spec = case.spec
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(case.dtype, torch.float32)
    where = "cuda" if str(device).startswith("cuda") else str(device)
    rotation = Implementation.of("flashinfer", rotate_flashinfer)
    why = rotation.unsupported_reason(spec, dtype, where)
    if why:
        return why
    if case.cache != "activation":
        return "FlashInfer's append_paged_kv_cache copies k and v in the cache's dtype: no FP8 cache"
    if spec.head_size not in APPEND_HEAD_SIZES:
        return f"FlashInfer's append_paged_kv_cache runs head sizes {APPEND_HEAD_SIZES} only (head {spec.head_size})"
    fault = rotation.known_fault(spec, dtype, where)
    if fault:
        return f"known fault: {fault}"
    defect = rotation.known_defect(spec, case.num_tokens, dtype, where, num_heads=case.num_q_heads,
                                   num_kv_heads=case.num_kv_heads)
    return f"known defect: {defect}" if defect else None


rope_kv_cache_flashinfer_unfused.fused_op = "rope_kv_cache"
rope_kv_cache_flashinfer_unfused.working_precision = "float32"
rope_kv_cache_flashinfer_unfused.draws = ("1d", "activation_cache", "append_heads", "half_dtypes")
rope_kv_cache_flashinfer_unfused.unsupported_reason = _reason
rope_kv_cache_flashinfer_unfused.version = getattr(sys.modules.get("flashinfer"), "__version__", None)
