"""lmdeploy's PyTorch engine as a rotation implementation (read on lmdeploy 0.18.0).

lmdeploy selects each frequency's position row in PyTorch (``MRotaryEmbedding.apply_mrope`` of
``lmdeploy.pytorch.nn.rotary_embedding``: Qwen2-VL's chunked map or Qwen3-VL's interleaved one, over
``[3, T, dim]`` tables) and rotates q and k with its generic Triton kernel
(``lmdeploy.pytorch.kernels.cuda.apply_rotary_pos_emb``: rotate-half pairs over cos/sin ``[T, dim]``,
or adjacent pairs in its ``complex_mode`` over ``[T, dim / 2]``; the leading ``dim`` channels of a
wider head rotate, the rest pass through).  The adapter gathers the per-row cos/sin from the harness's
cache, lets ``apply_mrope`` select them, as the attention layer does with the tables its rotary
module builds, and runs the kernel in place on q/k viewed as ``[T, heads, head_size]``.

lmdeploy has no GLM round-robin, Ernie or 4-row map; its kernel computes in the activation dtype.
"""

from __future__ import annotations

import functools

import torch

from rope.backends import declare, require, triton_reason
from rope.spec import RopeSpec, check_rotation_inputs

_INSTALL = ("pip install lmdeploy (CUDA); on a CPU box scripts/lmdeploy_cpu_site.sh (PYTHONPATH=SITE): see "
            "docs/implementations.md, \"Serving engines' own code as implementations\"")
_nn = require("lmdeploy.pytorch.nn.rotary_embedding", distribution="lmdeploy", install=_INSTALL)
_params = require("lmdeploy.pytorch.backends.rotary_embedding", distribution="lmdeploy", install=_INSTALL)
_kernel = require("lmdeploy.pytorch.kernels.cuda.apply_rotary_pos_emb", distribution="lmdeploy", install=_INSTALL)


@functools.lru_cache(maxsize=32)
def _mrope(spec: RopeSpec):
    """lmdeploy's M-RoPE module of the spec's sections (its ``impl``, which builds tables from
    inv_freq, is not used: the tables come from the harness's cache)."""
    return _nn.MRotaryEmbedding(torch.nn.Identity(),
                                _params.MropeParameters(list(spec.sections), spec.layout == "interleaved"))


def _tables(spec: RopeSpec, positions, cos_sin_cache):
    """cos, sin as lmdeploy's kernel takes them: [T, rotary_dim] (NeoX, cat(f, f)) or [T, rotary_dim / 2]
    (GPT-J, complex_mode), each frequency from the row ``apply_mrope`` selects."""
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)          # [T, F] or [3, T, F]
    if spec.is_neox_style:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    if spec.num_dims == 3:
        module = _mrope(spec)
        cos, sin = module.apply_mrope(cos), module.apply_mrope(sin)
    return cos, sin


def rotate_lmdeploy(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    num_tokens, hs = query.shape[0], spec.head_size
    if num_tokens == 0:
        return query, key
    cos, sin = _tables(spec, positions, cos_sin_cache.to(query.dtype))
    # The kernel takes any row and head stride but flat channels: a strided last dim is copied.
    query = query if query.stride(-1) == 1 else query.contiguous()
    key = key if key is None or key.stride(-1) == 1 else key.contiguous()
    q = query.view(num_tokens, -1, hs)
    k = key.view(num_tokens, -1, hs) if key is not None else query.new_zeros(num_tokens, 1, hs)
    _kernel.apply_rotary_pos_emb(q, k, cos, sin, q_embed=q, k_embed=k, complex_mode=not spec.is_neox_style)
    return query, key


def _reason(spec: RopeSpec, dtype, device: str) -> str | None:
    if spec.num_dims not in (1, 3):
        return f"lmdeploy's MRotaryEmbedding selects from exactly 3 position rows (spec has {spec.num_dims})"
    if spec.num_dims == 3 and spec.layout not in ("chunked", "interleaved"):
        return f"lmdeploy maps frequencies chunked or interleaved (layout={spec.layout!r})"
    return triton_reason(device, dtype, bf16_arithmetic=True)


rotate_lmdeploy = declare(rotate_lmdeploy, working_precision="activation", reason=_reason)
