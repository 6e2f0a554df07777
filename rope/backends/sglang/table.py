"""SGLang's cos/sin table as a table implementation (docs/spec.md §1.2): the ``cos_sin_cache`` that
``get_rope`` builds for a model's rope config (``sglang.srt.layers.rotary_embedding.factory``; read on
sglang 0.5.23), as SGLang's decoder models call it: ``get_rope(head_size, rotary_dim,
max_position=the config's max_position_embeddings, base, is_neox_style, rope_scaling, dtype,
partial_rotary_factor)`` (models/llama.py, models/gpt_oss.py, models/qwen3_5.py, models/gemma4_causal.py).

The harness's spec carries the length the engine admits (``spec.max_position``); the config's
``max_position_embeddings`` it came from is that length divided by the factor for linear and dynamic
scaling (SGLang's get_context_length multiplies it back where the config names no original length),
and that length itself for the other types (YaRN's tables are built from
``original_max_position_embeddings`` times the factor).  After loading, SGLang's model runner extends
every table to the context length (reserve_rope_cache_for_long_sequences, utils/common.py, through the
op's ``_ensure_cos_sin_cache_length``); the adapter extends it to the rows asked for (a context length
set past the config's, as ``--context-length`` does) or to ``spec.max_position``, whichever is more.

LongRoPE: SGLang builds the short table (original length) and the long one (``max_position_embeddings``
rows, whose ratio to the original length gives the attention factor) back to back and picks per batch:
the long rows when a position of the batch exceeds the original length.  The table returned is the rows
its forward reads for a batch whose largest position is ``spec.max_position - 1``.
Dynamic NTK: SGLang grows the base once, at ``max_position_embeddings`` x factor from
``max_position_embeddings`` (the config's length is the original one, as in transformers), so it builds
the table of one served length only.
Proportional (Gemma 4): the model passes ``rope_scaling={"rope_type": "proportional"}`` and the rotating
share as ``partial_rotary_factor`` (no factor).
"""

from __future__ import annotations

import functools
import os

import torch

from rope.backends import declare, require
from rope.backends.config_length import config_length
from rope.spec import RopeSpec
from rope.table import check_table_call

# SGLang's own switch for a GPU-less host (as rope.backends.sglang.rotation sets it).
if not torch.cuda.is_available():
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
INSTALL = ("pip install sglang; on a CPU box scripts/sglang_cpu_site.sh (PYTHONPATH=SITE): see "
           "docs/implementations.md, \"Serving engines' own code as implementations\"")
_factory = require("sglang.srt.layers.rotary_embedding.factory", distribution="sglang", install=INSTALL)

__all__ = ["cos_sin_table_sglang", "sglang_rope_call"]

# Types whose admitted length is max_position_embeddings x factor (SGLang's get_context_length).
_TIMES_FACTOR = ("linear", "dynamic")


def _config_length(spec: RopeSpec) -> int | None:
    """The config's ``max_position_embeddings`` for ``spec.max_position`` (rope.backends.config_length)."""
    return config_length(spec, _TIMES_FACTOR)


def _is_mrope(spec: RopeSpec) -> bool:
    return spec.sections is not None and spec.num_dims == 3 and spec.layout in ("chunked", "interleaved")


def _rope_scaling(spec: RopeSpec) -> dict | None:
    """``get_rope``'s ``rope_scaling`` for the spec (SGLang's key names), None for the plain table."""
    s = spec.scaling
    if s is None and not _is_mrope(spec):
        return None
    if s is not None and s.rope_type == "proportional":
        return {"rope_type": "proportional"}        # gemma4_causal.py passes the type alone
    params: dict = {"rope_type": "default"}
    if s is not None:
        for key, value in s.to_dict().items():
            key = "original_max_position_embeddings" if key == "original_max_position" else key
            params[key] = list(value) if isinstance(value, tuple) else value
    if _is_mrope(spec):       # M-RoPE (with YaRN): MRotaryEmbedding / YaRNScalingMRotaryEmbedding
        params["mrope_section"] = list(spec.sections)
        if spec.layout == "interleaved":
            params["mrope_interleaved"] = True
    return params


def sglang_rope_call(spec: RopeSpec) -> dict:
    """``get_rope``'s keyword arguments for the spec, but ``head_size`` and ``dtype``."""
    s = spec.scaling
    proportional = s is not None and s.rope_type == "proportional"
    return {"rotary_dim": spec.rotary_dim, "max_position": _config_length(spec), "base": float(spec.base),
            "is_neox_style": spec.is_neox_style, "rope_scaling": _rope_scaling(spec),
            "partial_rotary_factor": s.partial_rotary_factor if proportional else 1.0}


def _reason(spec: RopeSpec, dtype, device) -> str | None:
    s = spec.scaling
    if spec.ntk_alpha is not None:
        return "XD-RoPE (NTK-alpha sections) is not in SGLang"
    if s is not None and s.rope_type == "ntk":
        return "SGLang's get_rope has no 'ntk' rope type (vLLM's fixed and mixed NTK)"
    if _config_length(spec) is None:
        if s.rope_type == "longrope":
            return f"original length {s.original_max_position} x factor {s.factor} is no max_position_embeddings"
        return (f"no max_position_embeddings gives {spec.max_position} admitted positions at factor {s.factor} "
                f"(SGLang admits max_position_embeddings x factor for {s.rope_type})")
    if s is not None and s.rope_type == "dynamic" and s.original_max_position != _config_length(spec):
        return (f"SGLang's dynamic NTK grows the base from max_position_embeddings = {_config_length(spec)} "
                f"(the length admitted / factor), not original_max_position = {s.original_max_position}")
    if s is not None and s.rope_type == "longrope":
        if spec.max_position > _config_length(spec):
            return (f"a served length of {spec.max_position} past max_position_embeddings = original "
                    f"{s.original_max_position} x factor {s.factor} (SGLang builds no more long rows)")
        if not spec.is_neox_style:
            return "SGLang's Phi3LongRoPEScaledRotaryEmbedding supports only NeoX pairs"
        if s.attention_factor is not None:
            return "SGLang's LongRoPE takes short_mscale / long_mscale, not one attention_factor"
    if s is not None and s.rope_type == "proportional" and s.factor != 1.0:
        return "SGLang's Gemma 4 passes get_rope no factor (proportional RoPE with factor 1 only)"
    if s is not None and s.rope_type == "yarn" and _is_mrope(spec) and (s.mscale, s.mscale_all_dim) != (None, None):
        return "SGLang's YaRNScalingMRotaryEmbedding takes no mscale / mscale_all_dim (get_rope passes them: TypeError)"
    return None


def _rows_read(op, spec: RopeSpec, context: int) -> torch.Tensor:
    """The rows SGLang's op reads for positions 0 .. spec.max_position - 1 in one batch, its table
    extended to ``context`` rows where it has an extension."""
    if hasattr(op, "long_short_cos_sin_cache"):          # LongRoPE: [short rows | long rows]
        original = op.original_max_position_embeddings
        # Phi3LongRoPEScaledRotaryEmbedding.forward: offset by the short rows when any position > original.
        offset = original if spec.max_position - 1 > original else 0
        return op.long_short_cos_sin_cache[offset:offset + spec.max_position]
    if hasattr(op, "_ensure_cos_sin_cache_length"):      # the model runner's reserve to the context length
        op._ensure_cos_sin_cache_length(context - 1)
    return op.cos_sin_cache


@functools.lru_cache(maxsize=4)
def _built(spec: RopeSpec, dtype: torch.dtype, context: int) -> torch.Tensor:
    """The table SGLang's op holds (float32 math; cast to ``dtype`` where SGLang keeps float32)."""
    _factory._ROPE_DICT.clear()         # get_rope memoizes ops process-wide; build afresh, keep none
    try:
        op = _factory.get_rope(spec.head_size, dtype=dtype, **sglang_rope_call(spec))
        return _rows_read(op, spec, context).detach().to(dtype)
    finally:
        _factory._ROPE_DICT.clear()


def cos_sin_table_sglang(spec: RopeSpec, max_position: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """SGLang's table for the spec's config, its first ``max_position`` rows (fewer where SGLang built fewer)."""
    check_table_call(spec, max_position, dtype)
    why = _reason(spec, dtype, device)
    if why is not None:
        raise ValueError(f"spec={spec!r}: unsupported by SGLang's get_rope: {why}")
    table = _built(spec, dtype, max(max_position, spec.max_position))
    return table[:max_position].to(device=device, dtype=dtype, copy=True)


declare(cos_sin_table_sglang, working_precision="float32", reason=_reason)
