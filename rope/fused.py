"""The contract of the fused ops RoPE lives in (docs/spec.md, "Fused ops"): the checks of their
inputs, shared by the float64 reference (reference/fused.py) and the built-in kernels
(rope/triton/fused_qk_norm_rope.py, rope/triton/rope_kv_cache.py), so that bad input is a
``ValueError`` naming the field, raised before any arithmetic or launch.

Three ops:

* **QK-norm + RoPE** on a packed ``qkv`` [T, (Hq + Hk + Hv) * D]: RMSNorm of every q and k head with
  its weight, then the rotation of the spec (§2-3); V untouched.
* **RoPE + KV-cache write**: q and k rotated (the live k too), k and v written to a paged cache at
  ``slot_mapping`` (slot = block * block_size + offset; -1: padding, skipped), NHD
  ([num_blocks, block_size, H, D]) or HND ([num_blocks, H, block_size, D]); a bf16/fp16 cache of
  the activations' dtype, or FP8 (e4m3fn, e5m2) storing ``value / scale`` per tensor.
* **MLA** (DeepSeek): q_pe and k_pe rotated, ``kv_c`` and the rotated ``k_pe`` written side by side
  into the latent cache [num_blocks, block_size, kv_lora_rank + rope_dim] at the slots.

Value checks (slots in range and distinct, positions inside the cos/sin cache) read the values on
the host: done where ``rope.spec.checks_values`` says so (the CPU; a GPU under ROPE_CHECK_VALUES=1),
always by the reference.  Error messages follow ``<field>=<value>: <rule> (<actual>)``.
"""

from __future__ import annotations

import math

import torch

from rope.overlap import check_no_overlap, overlaps_itself
from rope.spec import RopeSpec, check_rotation_inputs, checks_values

__all__ = ["FP8_DTYPES", "KV_LAYOUTS", "PADDING_SLOT", "cache_geometry", "check_mla_inputs",
           "check_qk_norm_rope_inputs", "check_rope_kv_cache_inputs", "check_slot_mapping", "fp8_max",
           "is_fp8", "scale_float", "scale_value"]

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
KV_LAYOUTS = ("NHD", "HND")
PADDING_SLOT = -1          # a token whose slot is -1 writes no cache row (CUDA-graph padding)
_SLOT_DTYPES = (torch.int64, torch.int32)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an FP8 dtype: what a saturating store writes for anything larger
    (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor(name: str, t, *, optional: bool = False) -> None:
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}={type(t).__name__}: must be a torch.Tensor")


def _same_device(named: dict) -> None:
    devices = {n: t.device for n, t in named.items() if t is not None}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{n}.device={d}" for n, d in sorted(devices.items()))
        raise ValueError(f"devices: all tensors must be on one device ({listed})")


def _check_weight(name: str, weight, head_size: int, dtype: torch.dtype) -> None:
    _tensor(name, weight)
    if weight.dim() != 1 or weight.shape[0] != head_size:
        raise ValueError(f"{name}.shape={tuple(weight.shape)}: must be [head_size={head_size}]")
    if weight.dtype != dtype:
        raise ValueError(f"{name}.dtype={weight.dtype}: must equal qkv.dtype={dtype} (the engines' layout)")


def check_qk_norm_rope_inputs(spec: RopeSpec, positions, qkv, num_heads_q, num_heads_k, num_heads_v,
                              q_weight, k_weight, eps, cos_sin_cache, *, may_write: bool = True,
                              check_values: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a QK-norm + RoPE call; return the q and k column views of ``qkv``.

    ``qkv`` [T, (num_heads_q + num_heads_k + num_heads_v) * head_size], q heads first, then k, then
    v; weights [head_size] in qkv's dtype; ``eps`` a finite float >= 0."""
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec={spec!r}: must be a RopeSpec")
    _tensor("qkv", qkv)
    for name, n, low in (("num_heads_q", num_heads_q, 1), ("num_heads_k", num_heads_k, 1),
                         ("num_heads_v", num_heads_v, 0)):
        if not _is_int(n) or n < low:
            raise ValueError(f"{name}={n!r}: must be an int >= {low}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps={eps!r}: must be a finite number >= 0")
    d = spec.head_size
    width = (num_heads_q + num_heads_k + num_heads_v) * d
    if qkv.dim() != 2 or qkv.shape[1] != width:
        raise ValueError(f"qkv.shape={tuple(qkv.shape)}: must be [num_tokens, (num_heads_q + num_heads_k + "
                         f"num_heads_v) * head_size = {width}]")
    if not qkv.dtype.is_floating_point or is_fp8(qkv.dtype):
        raise ValueError(f"qkv.dtype={qkv.dtype}: must be float32, float16 or bfloat16")
    _check_weight("q_weight", q_weight, d, qkv.dtype)
    _check_weight("k_weight", k_weight, d, qkv.dtype)
    query = qkv[:, :num_heads_q * d]
    key = qkv[:, num_heads_q * d:(num_heads_q + num_heads_k) * d]
    _same_device({"qkv": qkv, "q_weight": q_weight, "k_weight": k_weight, "positions": positions,
                  "cos_sin_cache": cos_sin_cache} if isinstance(positions, torch.Tensor)
                 and isinstance(cos_sin_cache, torch.Tensor) else {"qkv": qkv})
    # The rotation's own checks (positions, cache, aliasing of q and k with what they read): q and
    # k are disjoint column windows of qkv, which rope.overlap decides exactly.
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, may_write=may_write, check_values=check_values)
    if may_write:
        check_no_overlap({"qkv": qkv}, {"q_weight": q_weight, "k_weight": k_weight})
    return query, key


def scale_float(scale) -> float:
    """A checked scale's value on the host: 1.0 for None, a one-element tensor's value (a device
    sync where it lives on the GPU: for checks and adapters, not for a kernel's hot path)."""
    if scale is None:
        return 1.0
    return float(scale.reshape(())) if isinstance(scale, torch.Tensor) else float(scale)


def scale_value(name: str, scale, cache_dtype: torch.dtype) -> float | torch.Tensor | None:
    """``scale`` checked: None (1.0), a finite float > 0, or a one-element floating tensor (the
    engines keep the scale on the device).  Scales apply to FP8 caches only: for a bf16/fp16 cache
    a scale other than None or 1.0 is refused (it would be silently ignored, as vLLM's "auto" does)."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.dtype.is_floating_point:
            raise ValueError(f"{name}.shape={tuple(scale.shape)}, dtype={scale.dtype}: must hold one floating value")
        if not is_fp8(cache_dtype):
            raise ValueError(f"{name}: a scale tensor is for an FP8 cache (the cache is {cache_dtype}, written unscaled)")
        if checks_values(scale):
            value = float(scale.reshape(()))
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}={value!r}: must be a finite number > 0")
        return scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{name}={scale!r}: must be a finite number > 0, a one-element tensor or None")
    if not is_fp8(cache_dtype) and scale != 1.0:
        raise ValueError(f"{name}={scale!r}: the cache is {cache_dtype}, written unscaled (scales are for FP8 caches)")
    return float(scale)


def cache_geometry(name: str, cache: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(num_blocks, block_size, num_heads, head_size) of a 4-D paged cache in ``layout``."""
    if cache.dim() != 4:
        raise ValueError(f"{name}.shape={tuple(cache.shape)}: must be 4-D ({'[num_blocks, block_size, num_heads, head_size]' if layout == 'NHD' else '[num_blocks, num_heads, block_size, head_size]'} for {layout})")
    if layout == "NHD":
        num_blocks, block_size, heads, d = cache.shape
    else:
        num_blocks, heads, block_size, d = cache.shape
    return num_blocks, block_size, heads, d


def check_slot_mapping(slot_mapping, num_tokens: int, num_slots: int, *, check_values: bool | None = None) -> None:
    """``slot_mapping`` int32/int64 [<= num_tokens] (tokens past its length are padding, as in
    vLLM V1), each slot -1 (padding) or in [0, num_slots), no slot twice."""
    _tensor("slot_mapping", slot_mapping)
    if slot_mapping.dtype not in _SLOT_DTYPES:
        raise ValueError(f"slot_mapping.dtype={slot_mapping.dtype}: must be torch.int64 or torch.int32")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] > num_tokens:
        raise ValueError(f"slot_mapping.shape={tuple(slot_mapping.shape)}: must be [n] with n <= num_tokens={num_tokens}")
    if not (checks_values(slot_mapping) if check_values is None else check_values) or not slot_mapping.numel():
        return
    slots = slot_mapping.to("cpu", torch.int64)
    bad = (slots != PADDING_SLOT) & ((slots < 0) | (slots >= num_slots))
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise ValueError(f"slot_mapping[{first}]={int(slots[first])}: must be -1 (padding) or in [0, num_blocks * "
                         f"block_size = {num_slots})")
    written = slots[slots >= 0]
    if written.numel() != torch.unique(written).numel():
        values, counts = torch.unique(written, return_counts=True)
        raise ValueError(f"slot_mapping: slot {int(values[counts > 1][0])} appears more than once (two tokens "
                         f"would write one cache row)")


def _check_cache_pair(key_cache, value_cache, layout: str, num_kv_heads: int, head_size: int,
                      act_dtype: torch.dtype) -> tuple[int, int]:
    """(num_blocks, block_size) of two paged caches of one shape, dtype and layout."""
    _tensor("key_cache", key_cache)
    _tensor("value_cache", value_cache)
    geometry = cache_geometry("key_cache", key_cache, layout)
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache.shape={tuple(value_cache.shape)}: must equal key_cache.shape={tuple(key_cache.shape)}")
    num_blocks, block_size, heads, d = geometry
    if heads != num_kv_heads or d != head_size:
        raise ValueError(f"key_cache.shape={tuple(key_cache.shape)}: {layout} needs {num_kv_heads} heads of "
                         f"head_size={head_size} (got {heads} heads of {d})")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dtype != act_dtype and not is_fp8(cache.dtype):
            raise ValueError(f"{name}.dtype={cache.dtype}: must be the activations' {act_dtype}, torch.float8_e4m3fn "
                             f"or torch.float8_e5m2")
        if cache.stride(-1) != 1:
            raise ValueError(f"{name}.stride()={cache.stride()}: the head_size dim must have stride 1")
        if overlaps_itself(cache):
            raise ValueError(f"{name}.stride()={cache.stride()}: its elements overlap in memory (an expanded view)")
    if value_cache.dtype != key_cache.dtype:
        raise ValueError(f"value_cache.dtype={value_cache.dtype}: must equal key_cache.dtype={key_cache.dtype}")
    if key_cache.numel() and key_cache.data_ptr() == value_cache.data_ptr():
        raise ValueError("key_cache and value_cache: are the same memory; pass separate caches")
    return num_blocks, block_size


def check_rope_kv_cache_inputs(spec: RopeSpec, positions, query, key, value, key_cache, value_cache, slot_mapping,
                               cos_sin_cache, *, kv_layout: str = "NHD", k_scale=None, v_scale=None,
                               may_write: bool = True, check_values: bool | None = None):
    """Validate a RoPE + KV-cache write; return (k_scale, v_scale) as :func:`scale_value` gives them.

    query [T, Hq * D], key and value [T, Hkv * D] (any row strides: views of a packed qkv), caches in
    ``kv_layout`` with Hkv heads of D, slot_mapping as :func:`check_slot_mapping`."""
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout={kv_layout!r}: must be one of {KV_LAYOUTS}")
    if key is None:
        raise ValueError("key=None: a KV-cache write needs the key")
    num_tokens, _, num_kv_heads = check_rotation_inputs(spec, positions, query, key, cos_sin_cache,
                                                        may_write=may_write, check_values=check_values)
    _tensor("value", value)
    if value.dim() != 2 or value.shape != key.shape:
        raise ValueError(f"value.shape={tuple(value.shape)}: must equal key.shape={tuple(key.shape)}")
    if value.dtype != key.dtype:
        raise ValueError(f"value.dtype={value.dtype}: must equal key.dtype={key.dtype}")
    if value.shape[1] and value.stride(1) != 1:
        raise ValueError(f"value.stride()={value.stride()}: the head dim must have stride 1")
    num_blocks, block_size = _check_cache_pair(key_cache, value_cache, kv_layout, num_kv_heads, spec.head_size,
                                               key.dtype)
    _same_device({"query": query, "value": value, "key_cache": key_cache, "value_cache": value_cache,
                  "slot_mapping": slot_mapping if isinstance(slot_mapping, torch.Tensor) else None})
    check_slot_mapping(slot_mapping, num_tokens, num_blocks * block_size, check_values=check_values)
    scales = (scale_value("k_scale", k_scale, key_cache.dtype), scale_value("v_scale", v_scale, value_cache.dtype))
    if may_write:
        check_no_overlap({"query": query, "key": key}, {"value": value, "positions": positions,
                                                        "cos_sin_cache": cos_sin_cache, "slot_mapping": slot_mapping})
        _caches_apart({"key_cache": key_cache, "value_cache": value_cache},
                      {"query": query, "key": key, "value": value, "positions": positions,
                       "cos_sin_cache": cos_sin_cache, "slot_mapping": slot_mapping})
    return scales


def _caches_apart(caches: dict, others: dict) -> None:
    """A cache must not share bytes with any tensor the call reads or writes besides it (the caches
    are separate allocations in every engine; byte ranges, conservative)."""
    for name, cache in caches.items():
        if not cache.numel():
            continue
        lo = cache.data_ptr()
        hi = lo + (sum((n - 1) * s for n, s in zip(cache.shape, cache.stride())) + 1) * cache.element_size()
        for other, t in others.items():
            if t is None or not t.numel():
                continue
            t_lo = t.data_ptr()
            t_hi = t_lo + (sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()
            if t_lo < hi and lo < t_hi:
                raise ValueError(f"{name} and {other} overlap in memory; the cache must be a separate buffer")


def check_mla_inputs(spec: RopeSpec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache, *,
                     scale=None, may_write: bool = True, check_values: bool | None = None):
    """Validate an MLA RoPE + latent-cache write; return (k_pe as [T, R], scale as :func:`scale_value`).

    q_pe [T, H, R] (any strides: the rope channels of q [T, H, nope + R], token- or heads-major),
    k_pe [T, R] or [T, 1, R], kv_c [T, L], kv_cache [num_blocks, block_size, L + R] of the
    activations' dtype or FP8; the spec's head_size and rotary_dim are R (DeepSeek: 64, GPT-J
    pairing).  With ``may_write`` q_pe and k_pe (rotated in place) must not overlap themselves, each
    other or anything the call reads."""
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec={spec!r}: must be a RopeSpec")
    r = spec.head_size
    if spec.rotary_dim != r:
        raise ValueError(f"spec: MLA rotates every rope channel (rotary_dim={spec.rotary_dim} must equal head_size={r})")
    for name, t in (("q_pe", q_pe), ("k_pe", k_pe), ("kv_c", kv_c), ("kv_cache", kv_cache)):
        _tensor(name, t)
    if q_pe.dim() != 3 or q_pe.shape[2] != r or q_pe.shape[1] == 0:
        raise ValueError(f"q_pe.shape={tuple(q_pe.shape)}: must be [num_tokens, num_heads >= 1, rope_dim={r}]")
    if not q_pe.dtype.is_floating_point or is_fp8(q_pe.dtype):
        raise ValueError(f"q_pe.dtype={q_pe.dtype}: must be float32, float16 or bfloat16")
    if isinstance(positions, torch.Tensor) and positions.dim() >= 1 and q_pe.shape[0] != positions.shape[-1]:
        raise ValueError(f"q_pe.shape={tuple(q_pe.shape)}: must have num_tokens={positions.shape[-1]} rows like "
                         f"positions")
    if k_pe.dim() == 3 and k_pe.shape[1] == 1:
        k_pe = k_pe[:, 0]
    if k_pe.dim() != 2 or k_pe.shape[1] != r or k_pe.shape[0] != q_pe.shape[0]:
        raise ValueError(f"k_pe.shape={tuple(k_pe.shape)}: must be [num_tokens={q_pe.shape[0]}, rope_dim={r}] "
                         f"(or [num_tokens, 1, {r}])")
    for name, t in (("k_pe", k_pe), ("kv_c", kv_c)):
        if t.dtype != q_pe.dtype:
            raise ValueError(f"{name}.dtype={t.dtype}: must equal q_pe.dtype={q_pe.dtype}")
    if kv_c.dim() != 2 or kv_c.shape[0] != q_pe.shape[0] or kv_c.shape[1] == 0:
        raise ValueError(f"kv_c.shape={tuple(kv_c.shape)}: must be [num_tokens={q_pe.shape[0]}, kv_lora_rank >= 1]")
    _check_latent_cache(kv_cache, kv_c.shape[1] + r, q_pe.dtype)
    # The rotation's checks on q_pe as [T, H * R] (a copy where q_pe is a strided view: read only).
    num_tokens, _, _ = check_rotation_inputs(spec, positions, q_pe.reshape(q_pe.shape[0], -1), k_pe, cos_sin_cache,
                                             may_write=False, check_values=check_values)
    _same_device({"q_pe": q_pe, "k_pe": k_pe, "kv_c": kv_c, "kv_cache": kv_cache,
                  "slot_mapping": slot_mapping if isinstance(slot_mapping, torch.Tensor) else None})
    check_slot_mapping(slot_mapping, num_tokens, kv_cache.shape[0] * kv_cache.shape[1], check_values=check_values)
    scale = scale_value("scale", scale, kv_cache.dtype)
    if may_write:
        check_no_overlap({"q_pe": q_pe, "k_pe": k_pe}, {"kv_c": kv_c, "positions": positions,
                                                        "cos_sin_cache": cos_sin_cache, "slot_mapping": slot_mapping})
        _caches_apart({"kv_cache": kv_cache}, {"q_pe": q_pe, "k_pe": k_pe, "kv_c": kv_c, "positions": positions,
                                               "cos_sin_cache": cos_sin_cache, "slot_mapping": slot_mapping})
    return k_pe, scale


def _check_latent_cache(kv_cache: torch.Tensor, width: int, act_dtype: torch.dtype) -> None:
    """The MLA latent cache: [num_blocks, block_size, kv_lora_rank + rope_dim], the activations' dtype
    or FP8, unit channel stride, no element twice in memory."""
    if kv_cache.dim() != 3 or kv_cache.shape[2] != width:
        raise ValueError(f"kv_cache.shape={tuple(kv_cache.shape)}: must be [num_blocks, block_size, kv_lora_rank + "
                         f"rope_dim = {width}]")
    if kv_cache.dtype != act_dtype and not is_fp8(kv_cache.dtype):
        raise ValueError(f"kv_cache.dtype={kv_cache.dtype}: must be the activations' {act_dtype}, "
                         f"torch.float8_e4m3fn or torch.float8_e5m2")
    if kv_cache.stride(-1) != 1:
        raise ValueError(f"kv_cache.stride()={kv_cache.stride()}: the channel dim must have stride 1")
    if overlaps_itself(kv_cache):
        raise ValueError(f"kv_cache.stride()={kv_cache.stride()}: its elements overlap in memory (an expanded view)")
