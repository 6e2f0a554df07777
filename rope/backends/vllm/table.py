"""vLLM's cos/sin table as a table implementation (docs/spec.md §1.2): the ``cos_sin_cache`` that
``get_rope`` builds for a model's rope config (``vllm.model_executor.layers.rotary_embedding``; read
on vllm 0.33.0), as vLLM's decoder models call it: ``get_rope(head_size, max_position=the config's
max_position_embeddings, is_neox_style, rope_parameters, dtype)``.

The harness's spec carries the length the engine admits (``spec.max_position``,
rope.spec_scaling.admitted_length); the config's ``max_position_embeddings`` it came from is that
length divided by the factor for linear, dynamic and NTK scaling (vLLM multiplies it back when it
derives ``max_model_len``), and that length itself for the other types (YaRN's tables are built from
``original_max_position_embeddings`` times the factor).  The table returned is vLLM's, cut to the rows
asked for: where vLLM built fewer, the harness sees a table too short for the positions vLLM admits
(vllm#55910: NTK and dynamic NTK size their cache by the unscaled length).

LongRoPE: vLLM reads the factor as ``max_position_embeddings`` over the original length (the
attention factor comes from it), so the config's length is the original times the factor; it builds
the short- and long-factor tables and uses the long one when the served length (``max_model_len``,
here ``spec.max_position``) passes the original length; that one is returned.
Dynamic NTK: a decoder's config gives no ``max_trained_positions``, so vLLM takes
``max_position_embeddings`` for it, which leaves its base unscaled (vllm#41277 made the base depend on
that ratio for the embedding models that set it).
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace

import torch

from rope.backends import declare, require
from rope.backends.config_length import config_length
from rope.spec import RopeSpec
from rope.table import check_table_call

if not torch.cuda.is_available():       # as rope.backends.vllm.rotation: keep vLLM's real Triton
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
INSTALL = ("pip install vllm (CUDA); on a CPU box scripts/vllm_cpu_site.sh (PYTHONPATH=SITE): see "
           "docs/implementations.md, \"Serving engines' own code as implementations\"")
_rotary = require("vllm.model_executor.layers.rotary_embedding", distribution="vllm", install=INSTALL)
_config = require("vllm.config", distribution="vllm", install=INSTALL)

__all__ = ["cos_sin_table_vllm", "vllm_rope_call"]

# Types whose admitted length is max_position_embeddings x factor (vLLM's _get_and_verify_max_len).
_TIMES_FACTOR = ("linear", "dynamic", "ntk")


def _config_length(spec: RopeSpec) -> int | None:
    """The config's ``max_position_embeddings`` for ``spec.max_position`` (rope.backends.config_length)."""
    return config_length(spec, _TIMES_FACTOR)


def vllm_rope_call(spec: RopeSpec) -> tuple[int, dict]:
    """``get_rope``'s ``max_position`` and ``rope_parameters`` for the spec (vLLM's key names)."""
    s = spec.scaling
    params: dict = {"rope_theta": float(spec.base), "rope_type": "default" if s is None else s.rope_type}
    if s is not None:
        for key, value in s.to_dict().items():
            if key == "rope_type" or value is None:
                continue
            if key == "original_max_position":
                key = "original_max_position_embeddings"
            params[key] = list(value) if isinstance(value, tuple) else value
        if s.rope_type == "dynamic":     # a decoder's config has no max_trained_positions: vLLM uses
            params.pop("original_max_position_embeddings")      # max_position_embeddings for it
        if s.rope_type == "proportional":   # rotating fraction as partial_rotary_factor; no factor read
            params.pop("factor", None)
    if spec.rotary_dim != spec.head_size and (s is None or s.rope_type != "proportional"):
        params["rope_dim"] = spec.rotary_dim          # vLLM 0.33 reads it before partial_rotary_factor
    if spec.sections is not None and spec.num_dims == 3 and spec.layout in ("chunked", "interleaved"):
        params["mrope_section"] = list(spec.sections)     # M-RoPE (with YaRN): MRotaryEmbedding's table
        if spec.layout == "interleaved":
            params["mrope_interleaved"] = True
    return _config_length(spec), params


def _reason(spec: RopeSpec, dtype, device) -> str | None:
    s = spec.scaling
    if spec.ntk_alpha is not None:
        return "XD-RoPE's NTK-alpha base is XDRotaryEmbedding's (rope_type 'xdrope'), not a table get_rope builds alone"
    if _config_length(spec) is None:
        if s.rope_type == "longrope":
            return f"original length {s.original_max_position} x factor {s.factor} is no max_position_embeddings"
        return (f"no max_position_embeddings gives {spec.max_position} admitted positions at factor {s.factor} "
                f"(vLLM admits max_position_embeddings x factor for {s.rope_type})")
    if s is not None and s.rope_type == "longrope" and spec.max_position > _config_length(spec):
        return (f"a served length of {spec.max_position} past max_position_embeddings = original "
                f"{s.original_max_position} x factor {s.factor} (vLLM admits no more for LongRoPE)")
    if s is not None and s.rope_type == "longrope" and not spec.is_neox_style:
        return "vLLM's Phi3LongRoPEScaledRotaryEmbedding supports only NeoX pairs"
    if s is not None and s.rope_type == "longrope" and s.attention_factor is not None:
        return "vLLM's LongRoPE takes short_mscale / long_mscale, not one attention_factor"
    if s is not None and s.rope_type == "proportional" and (s.factor or 1.0) != 1.0:
        return "vLLM's Gemma4RotaryEmbedding takes no factor (proportional RoPE with factor 1 only)"
    return None


@functools.lru_cache(maxsize=16)
def _built(spec: RopeSpec, dtype: torch.dtype) -> torch.Tensor:
    """The table vLLM's op holds (float32 math, cast to ``dtype`` as vLLM casts it)."""
    max_position, params = vllm_rope_call(spec)
    device = None if torch.cuda.is_available() else _config.DeviceConfig(device="cpu")
    config = _config.VllmConfig(device_config=device) if device else _config.VllmConfig()
    # LongRoPE reads the served length from the model config (a model-free stand-in: only it is read).
    object.__setattr__(config, "model_config", SimpleNamespace(max_model_len=spec.max_position))
    _rotary._ROPE_DICT.clear()          # get_rope memoizes ops across dtypes' keys; build afresh
    with _config.set_current_vllm_config(config):
        # M-RoPE's positions_factor 1: its first max_position rows are those of the default 4x table.
        op = _rotary.get_rope(spec.head_size, max_position, spec.is_neox_style, params, dtype,
                              mrope_positions_factor=1)
    if hasattr(op, "long_short_cos_sin_cache"):                  # LongRoPE: [short rows | long rows]
        short_rows = op.original_max_position_embeddings
        table = op.long_short_cos_sin_cache
        table = table[short_rows:] if op.use_long_rope else table[:short_rows]
    else:
        table = op.cos_sin_cache
    return table.detach()


def cos_sin_table_vllm(spec: RopeSpec, max_position: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """vLLM's table for the spec's config, its first ``max_position`` rows (fewer where vLLM built fewer)."""
    check_table_call(spec, max_position, dtype)
    why = _reason(spec, dtype, device)
    if why is not None:
        raise ValueError(f"spec={spec!r}: unsupported by vLLM's get_rope: {why}")
    table = _built(spec, dtype)
    return table[:max_position].to(device=device, dtype=dtype, copy=True)


declare(cos_sin_table_vllm, working_precision="float32", reason=_reason)
