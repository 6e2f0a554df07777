"""transformers' cos/sin table as a table implementation (docs/spec.md §1.2): the inverse frequencies
and the attention scaling from ``ROPE_INIT_FUNCTIONS`` (what every transformers rotary module is
built from), then the rotary modules' forward: positions times inv_freq in float32 (a [F, 1] x
[1, T] matmul, one product per element), cos and sin in float32, each times ``attention_scaling``,
cast to the activation dtype.

The config handed to the init function is a LlamaConfig carrying the spec's ``rope_parameters``
(transformers 5) with ``max_position_embeddings`` the original length (dynamic NTK grows its base
past it, LongRoPE switches to its long factors past it), called at the sequence length
``spec.max_position``.  vLLM's fixed NTK ("ntk") has no transformers counterpart, and
deepseek_yarn is transformers' "yarn" only where mscale and mscale_all_dim are both given (a lone
mscale is ignored there): those are unsupported.
"""

from __future__ import annotations

import functools

import torch

from rope.backends import declare, require
from rope.spec import RopeSpec
from rope.table import check_table_call

transformers = require("transformers", distribution="transformers", install="pip install '.[oracle]'")

__all__ = ["cos_sin_table_transformers", "rope_parameters"]


def rope_parameters(spec: RopeSpec) -> dict:
    """transformers 5's ``rope_parameters`` describing the spec (deepseek_yarn as "yarn")."""
    s = spec.scaling
    params = {"rope_theta": float(spec.effective_base if s is None else spec.base),
              "rope_type": "default" if s is None else s.rope_type}
    if s is not None:
        if s.rope_type == "deepseek_yarn":
            params["rope_type"] = "yarn"
        for key, value in s.to_dict().items():
            if key != "rope_type":
                params["original_max_position_embeddings" if key == "original_max_position" else key] = value
    if (s is None or s.rope_type != "proportional") and spec.rotary_dim != spec.head_size:
        params["partial_rotary_factor"] = spec.rotary_dim / spec.head_size
    return params


def _reason(spec, dtype, device) -> str | None:
    s = spec.scaling
    if s is not None and s.rope_type == "ntk":
        return "vLLM's fixed / mixed NTK has no transformers rope type"
    if s is not None and s.rope_type == "deepseek_yarn" and not (s.mscale and s.mscale_all_dim):
        return "transformers' yarn ignores a lone mscale (vLLM's DeepSeek YaRN reads it)"
    if s is not None and spec.ntk_alpha is not None:
        return "XD-RoPE's NTK-alpha beside a scaling has no transformers config"
    if spec.rotary_dim != spec.head_size and (s is None or s.rope_type != "proportional") and \
            int(spec.head_size * (spec.rotary_dim / spec.head_size)) != spec.rotary_dim:
        return f"partial_rotary_factor {spec.rotary_dim}/{spec.head_size} does not give rotary_dim back in transformers"
    return None


@functools.lru_cache(maxsize=64)
def _init(spec: RopeSpec) -> tuple[torch.Tensor, float]:
    from transformers import LlamaConfig, logging
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    logging.set_verbosity_error()          # its validation warns about factors < 1; the formulas still apply
    params = rope_parameters(spec)
    original = spec.scaling.original_max_position if spec.scaling is not None else None
    config = LlamaConfig(hidden_size=spec.head_size * 2, num_attention_heads=2, head_dim=spec.head_size,
                         max_position_embeddings=original or spec.max_position, rope_parameters=params)
    if params["rope_type"] == "default":      # kept on each rotary module, not in ROPE_INIT_FUNCTIONS
        # Llama's reads the whole head_dim; the partial-rotary families' (GPT-NeoX's) the rotating part.
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        config.head_dim = spec.rotary_dim
        inv_freq, scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(config, device="cpu")
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu", seq_len=spec.max_position)
    return inv_freq.float(), float(scaling)


def cos_sin_table_transformers(spec: RopeSpec, max_position: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """transformers' rotary-module table of ``max_position`` rows, ``cos | sin``."""
    check_table_call(spec, max_position, dtype)
    why = _reason(spec, dtype, device)
    if why is not None:
        raise ValueError(f"spec={spec!r}: unsupported by transformers: {why}")
    inv_freq, scaling = _init(spec)
    positions = torch.arange(max_position, dtype=torch.float32)
    freqs = (inv_freq[:, None].float() @ positions[None, :].float()).transpose(0, 1)
    cos, sin = freqs.cos() * scaling, freqs.sin() * scaling
    return torch.cat((cos, sin), dim=-1).to(dtype=dtype).to(device)


declare(cos_sin_table_transformers, working_precision="float32", reason=_reason)
