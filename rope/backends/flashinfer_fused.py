"""FlashInfer's fused FP8 RoPE + paged-cache append, ``flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache``,
as the harness's RoPE + KV-cache write (contract B) and MLA (contract C), docs/spec.md §10 (CUDA only).

One kernel, two forms: with k ``[T, Hkv, R]`` and v it rotates q and k, writes k and v to a paged
``(k_cache, v_cache)`` (NHD or HND); with a 2-D k (MLA) it rotates q_pe and k_pe and writes kv_c and
k_pe to ``(ckv_cache, kpe_cache)``.  What it computes differs from the contracts' results, and each
adapter declares how (rope.implementation):

* ``fp8_query``: q comes back quantized to the cache's FP8 dtype, not rotated in place.  The adapter
  quantizes it with the key's scale (FlashInfer takes a q scale of its own), so a wrong q scale path
  cannot hide behind a 1.0.
* ``returns_live_key = False``: k goes to the cache only.
* ``skips_padding_tokens``: a token whose batch index is -1 is skipped whole; its q is never written.
* ``scales_by_reciprocal``: FlashInfer's ``quant_scale`` multiplies (the adapter passes 1 / scale,
  which FlashInfer keeps in fp32), where the contracts divide by the scale.

Addressing: FlashInfer finds a token's row through a page table, ``kv_indptr[batch_indices[t]] *
page_size + positions[t]``.  The adapter makes one request that owns every block in order, so a
token's ``positions`` entry is its slot; a slot of -1 and a token past ``slot_mapping`` get batch
index -1.  MLA's latent cache ``[blocks, block_size, L + R]`` is handed over as its two column views,
and q's nope input, which FlashInfer sizes to the latent width (an absorbed q), is a zero tensor
whose FP8 copy is thrown away.

FlashInfer checks its own constraints (fp16/bf16 inputs, FP8 caches, one scale for k and v, widths that
are multiples of 16, rows on 16-byte boundaries); the adapters declare them as draws
(``draws``) and as reasons (``unsupported_reason(case, device)``).  One shape its check lets through
answers wrongly, NeoX with rotary_dim an odd multiple of 16 (rope.backends.known_faults.
flashinfer_fused_straddle): a reason too, "known defect", pinned on a GPU by
tests/backends/test_flashinfer_fused.py so that a fix upstream shows.
"""

from __future__ import annotations

import sys

import torch

from rope.backends import require
from rope.backends.known_faults import flashinfer_fused_straddle
from rope.fused import check_mla_inputs, check_rope_kv_cache_inputs, is_fp8, scale_float
from rope.spec import RopeSpec

__all__ = ["mla_rope_kv_cache_flashinfer", "page_table", "rope_kv_cache_flashinfer"]

_rope = require("flashinfer.rope", distribution="flashinfer-python",
                install="pip install flashinfer-python (needs a CUDA GPU)")

_DRAWS = ("1d", "fp8_cache", "one_kv_scale", "dims_of_16", "half_dtypes")


def page_table(slot_mapping: torch.Tensor, num_tokens: int, num_blocks: int):
    """(kv_indices, kv_indptr, batch_indices, positions), int32 on slot_mapping's device: one request
    owning blocks 0..num_blocks-1 in order, each token's position its slot, batch index -1 for a slot
    of -1 and for tokens past slot_mapping."""
    device = slot_mapping.device
    slots = torch.full((num_tokens,), -1, dtype=torch.int32, device=device)
    count = min(num_tokens, slot_mapping.shape[0])
    slots[:count] = slot_mapping[:count].to(torch.int32)
    batch = torch.where(slots >= 0, 0, -1).to(torch.int32)
    kv_indices = torch.arange(num_blocks, dtype=torch.int32, device=device)
    kv_indptr = torch.tensor([0, num_blocks], dtype=torch.int32, device=device)
    return kv_indices, kv_indptr, batch, slots.clamp_min(0)


def _reciprocal(scale) -> float:
    """FlashInfer's quant_scale for a contract's scale (stored = x / scale): 1 / scale."""
    return 1.0 / scale_float(scale)


def _table(cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """The float32 cos|sin rows FlashInfer reads (an exact upcast of a rounded table)."""
    return cos_sin_cache.to(torch.float32).contiguous()


def rope_kv_cache_flashinfer(spec: RopeSpec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                             cos_sin_cache, *, kv_layout: str = "NHD", k_scale=None, v_scale=None):
    """Contract B through FlashInfer: returns (q as FP8 codes of q / k_scale [T, Hq * D], None);
    the caches written at ``slot_mapping``."""
    k_scale, v_scale = check_rope_kv_cache_inputs(spec, positions, query, key, value, key_cache, value_cache,
                                                  slot_mapping, cos_sin_cache, kv_layout=kv_layout,
                                                  k_scale=k_scale, v_scale=v_scale)
    if not is_fp8(key_cache.dtype):
        raise ValueError(f"key_cache.dtype={key_cache.dtype}: FlashInfer's op writes FP8 caches only")
    if _reciprocal(k_scale) != _reciprocal(v_scale):
        raise ValueError(f"v_scale={v_scale}: FlashInfer's op takes one scale for k and v (k_scale={k_scale})")
    num_tokens, d, r = query.shape[0], spec.head_size, spec.rotary_dim
    q, k, v = (t.unflatten(1, (-1, d)) for t in (query, key, value))
    block_size = key_cache.shape[1] if kv_layout == "NHD" else key_cache.shape[2]
    kv_indices, kv_indptr, batch, slots = page_table(slot_mapping, num_tokens, key_cache.shape[0])
    q_out = torch.empty(q.shape, dtype=key_cache.dtype, device=query.device)
    quant = _reciprocal(k_scale)
    _rope.rope_quantize_fp8_append_paged_kv_cache(
        q[..., :r], k[..., :r], q[..., r:], k[..., r:], v, _table(cos_sin_cache), positions.contiguous(),
        (key_cache, value_cache), kv_indices, kv_indptr, batch, slots, is_neox=spec.is_neox_style,
        quantize_dtype=key_cache.dtype, quant_scale_q=quant, quant_scale_kv=quant, page_size=block_size,
        kv_layout=kv_layout, q_rope_out=q_out[..., :r], q_nope_out=q_out[..., r:])
    return q_out.flatten(1), None


def mla_rope_kv_cache_flashinfer(spec: RopeSpec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping,
                                 cos_sin_cache, *, scale=None):
    """Contract C through FlashInfer: returns (q_pe as FP8 codes of q_pe / scale [T, H, R], None);
    the latent cache written at ``slot_mapping``."""
    k_pe, scale = check_mla_inputs(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache,
                                   scale=scale)
    if not is_fp8(kv_cache.dtype):
        raise ValueError(f"kv_cache.dtype={kv_cache.dtype}: FlashInfer's op writes FP8 caches only")
    num_tokens, num_heads, _ = q_pe.shape
    lora = kv_c.shape[1]
    kv_indices, kv_indptr, batch, slots = page_table(slot_mapping, num_tokens, kv_cache.shape[0])
    q_out = torch.empty(q_pe.shape, dtype=kv_cache.dtype, device=q_pe.device)
    absorbed_nope = torch.zeros(num_tokens, num_heads, lora, dtype=q_pe.dtype, device=q_pe.device)
    quant = _reciprocal(scale)
    _rope.rope_quantize_fp8_append_paged_kv_cache(
        q_pe, k_pe, absorbed_nope, kv_c, None, _table(cos_sin_cache), positions.contiguous(),
        (kv_cache[..., :lora], kv_cache[..., lora:]), kv_indices, kv_indptr, batch, slots,
        is_neox=spec.is_neox_style, quantize_dtype=kv_cache.dtype, quant_scale_q=quant, quant_scale_kv=quant,
        page_size=kv_cache.shape[1], q_rope_out=q_out)
    return q_out, None


def _multiple_of_16(*widths: int) -> bool:
    return all(w % 16 == 0 for w in widths)


def _common_reason(case, device: str) -> str | None:
    if not str(device).startswith("cuda"):
        return f"FlashInfer's kernels are CUDA only (device {device})"
    if case.dtype not in ("bfloat16", "float16"):
        return f"FlashInfer's FP8 rope kernels take float16/bfloat16 inputs only (dtype {case.dtype})"
    if case.cache == "activation":
        return "FlashInfer's FP8 rope + append writes FP8 caches only"
    return None


def _cache_reason(case, device: str) -> str | None:
    spec = case.spec
    common = _common_reason(case, device)
    if common:
        return common
    if spec.num_dims != 1:
        return "FlashInfer's rope + append takes 1-D positions only (no M-RoPE / XD-RoPE)"
    if not _multiple_of_16(spec.rotary_dim, spec.head_size - spec.rotary_dim):
        return (f"FlashInfer's rope + append needs rotary and pass-through widths that are multiples of 16 "
                f"(rotary {spec.rotary_dim} of {spec.head_size})")
    if case.k_scale != case.v_scale:
        return "FlashInfer's rope + append takes one scale for k and v"
    return flashinfer_fused_straddle(spec)


def _mla_reason(case, device: str) -> str | None:
    common = _common_reason(case, device)
    if common is None and not _multiple_of_16(case.spec.head_size, case.kv_lora_rank):
        return f"FlashInfer's rope + append needs widths that are multiples of 16 (rope {case.spec.head_size}, " \
               f"kv_lora_rank {case.kv_lora_rank})"
    return common or flashinfer_fused_straddle(case.spec)


for _fn, _op, _reason in ((rope_kv_cache_flashinfer, "rope_kv_cache", _cache_reason),
                          (mla_rope_kv_cache_flashinfer, "mla_rope_kv_cache", _mla_reason)):
    _fn.fused_op = _op
    _fn.working_precision = "float32"
    _fn.fp8_query = True
    _fn.returns_live_key = False
    _fn.skips_padding_tokens = True
    _fn.scales_by_reciprocal = True
    _fn.draws = _DRAWS
    _fn.unsupported_reason = _reason
    _fn.version = getattr(sys.modules.get("flashinfer"), "__version__", None)
