"""Liger-Kernel's rotations: M-RoPE (``liger_kernel.transformers.qwen2vl_mrope.liger_multimodal_rotary_pos_emb``,
the ``LigerQwen2VLMRopeFunction`` autograd function: :func:`rotate_liger`, registered as ``"liger"``) and
1-D RoPE (``liger_kernel.ops.rope.LigerRopeFunction``: :func:`rotate_liger_1d`, by import path).

Liger's API is transformers-shaped (checked on liger-kernel 0.8.5):

* q ``[B, n_q_heads, L, head_dim]``, k ``[B, n_kv_heads, L, head_dim]``, each the ``transpose(1, 2)`` of
  ``[B, L, heads, head_dim]`` storage (the kernel transposes back and calls ``.contiguous()``; with the
  harness's contiguous q/k that is a view, so it rotates them in place);
* cos, sin ``[3, B, L, head_dim]``: one row per position row (t, h, w), laid out ``cat(f, f)`` (only the
  first half is read);
* ``mrope_section`` ``[s_t, s_h, s_w]``: chunked, NeoX pairs, the whole head rotates.

One Triton program per token computes in the cos dtype (the activation dtype: working precision
"activation").  Not covered by the kernel, so reported unsupported: 1-D RoPE (Liger's separate
``liger_rotary_pos_emb``), interleaved sections (Liger patches Qwen3-VL with the 1-D kernel), 4 rows,
GPT-J pairs, partial rotary.  The harness's 1-D B = 1 batch is one sequence of T tokens.

``LigerRopeFunction`` takes the same q/k layout and cos, sin ``[1, T, rotary_dim]`` (``cat(f, f)`` per
token, already gathered: position t of the sequence reads row t), rotates the first rotary_dim channels
of each head with NeoX pairs (partial rotary), NeoX only, in the cos dtype.

Both are ``torch.autograd.Function``s (Liger is a training library): their backward is the same
kernel with the sine negated (``BACKWARD_PASS``), which gives query and key their gradients and
cos/sin none; both adapters declare ``autograd``.  Their backward rotates the upstream gradient in
its own storage whenever ``dq.transpose(1, 2).contiguous()`` is a view (the gradient of the harness's
``[T, heads * head_size]`` outputs always is): the gradient tensor autograd handed in is overwritten.
"""

from __future__ import annotations

import torch

from rope.backends import declare, require, triton_reason
from rope.backends.known_faults import LIGER_BACKWARD_DEFECT, liger_mrope_defect
from rope.spec import RopeSpec, check_rotation_inputs

_mrope = require("liger_kernel.transformers.qwen2vl_mrope", distribution="liger-kernel",
                 install="pip install '.[backends]'  (liger-kernel>=0.6)")
_rope = require("liger_kernel.ops.rope", distribution="liger-kernel",
                install="pip install '.[backends]'  (liger-kernel>=0.6)")


def to_liger(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """[T, heads * head_size] -> [1, heads, T, head_size] (a view of [1, T, heads, head_size])."""
    return x.unflatten(1, (-1, head_size)).unsqueeze(0).transpose(1, 2)


def from_liger(x: torch.Tensor) -> torch.Tensor:
    """[1, heads, T, head_size] -> [T, heads * head_size]."""
    return x.transpose(1, 2).flatten(2).squeeze(0)


def liger_cos_sin(cache: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [3, 1, T, rotary_dim] = cat(f, f) per position row, read from the harness cache."""
    cos, sin = cache[positions.long()].chunk(2, dim=-1)          # [3, T, rd/2] each
    return torch.cat((cos, cos), -1).unsqueeze(1), torch.cat((sin, sin), -1).unsqueeze(1)


def engine_call(spec: RopeSpec, positions, query, key, cos_sin_cache, *, pregathered: bool = False):
    """Liger's call on these inputs, bound once: a function of no arguments returning (q, k).  The
    cos/sin gather into Liger's ``[3, 1, T, rotary_dim]`` layout runs inside the call, as a model
    patched with Liger runs it, or once here (``pregathered``: the kernel alone is timed)."""
    hs = spec.head_size
    # Liger always rotates a key; without one it gets a one-head scratch key that is thrown away.
    k_in = key if key is not None else query.new_zeros(query.shape[0], hs)
    q_l, k_l, sections = to_liger(query, hs), to_liger(k_in, hs), list(spec.sections)

    def rotate(cos, sin):
        q_out, k_out = _mrope.liger_multimodal_rotary_pos_emb(q_l, k_l, cos, sin, sections)
        return from_liger(q_out), (from_liger(k_out) if key is not None else None)
    if pregathered:
        cos, sin = liger_cos_sin(cos_sin_cache, positions)
        return lambda: rotate(cos, sin)
    return lambda: rotate(*liger_cos_sin(cos_sin_cache, positions))


def rotate_liger(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    return engine_call(spec, positions, query, key, cos_sin_cache)()


def _reason(spec: RopeSpec, dtype, device: str) -> str | None:
    if spec.sections is None:
        return "liger_multimodal_rotary_pos_emb is M-RoPE only (1-D RoPE is liger_rotary_pos_emb, not this kernel)"
    if spec.num_dims != 3:
        return f"liger_multimodal_rotary_pos_emb reads exactly 3 position rows (spec has {spec.num_dims})"
    if spec.layout != "chunked":
        return f"liger_multimodal_rotary_pos_emb has chunked sections only (layout={spec.layout!r})"
    if not spec.is_neox_style:
        return "liger_multimodal_rotary_pos_emb pairs NeoX-style only (no GPT-J)"
    if spec.rotary_dim != spec.head_size:
        return "liger_multimodal_rotary_pos_emb rotates the whole head (no partial rotary)"
    return triton_reason(device, dtype, bf16_arithmetic=True)


rotate_liger = declare(rotate_liger, working_precision="activation", reason=_reason, defect=liger_mrope_defect)
rotate_liger.autograd = True
rotate_liger.backward_defect = LIGER_BACKWARD_DEFECT


def rotate_liger_1d(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """1-D RoPE through ``LigerRopeFunction`` (autograd: Liger's backward)."""
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    hs = spec.head_size
    # Liger always rotates a key; without one it gets a one-head scratch key that is thrown away.
    k_in = key if key is not None else query.new_zeros(query.shape[0], hs)
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)            # [T, rd/2] each
    cos, sin = torch.cat((cos, cos), -1).unsqueeze(0), torch.cat((sin, sin), -1).unsqueeze(0)
    q_out, k_out = _rope.LigerRopeFunction.apply(to_liger(query, hs), to_liger(k_in, hs), cos, sin)
    return from_liger(q_out), (from_liger(k_out) if key is not None else None)


def _reason_1d(spec: RopeSpec, dtype, device: str) -> str | None:
    if spec.sections is not None:
        return "LigerRopeFunction is 1-D RoPE only (M-RoPE is liger_multimodal_rotary_pos_emb: rotate_liger)"
    if not spec.is_neox_style:
        return "LigerRopeFunction pairs NeoX-style only (no GPT-J)"
    return triton_reason(device, dtype, bf16_arithmetic=True)


rotate_liger_1d = declare(rotate_liger_1d, working_precision="activation", reason=_reason_1d)
rotate_liger_1d.autograd = True
rotate_liger_1d.backward_defect = LIGER_BACKWARD_DEFECT
