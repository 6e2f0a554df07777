"""Reading a model's rope config: the RopeSpec fields of a transformers config object or a
config.json dict (``RopeSpec.from_hf_config``; docs/spec.md §1 says what each key means).

What is read, in transformers' order of precedence:
- the text part of a multimodal config (``get_text_config()``; a dict's ``text_config``, or its
  ``thinker_config``'s for the Omni models);
- the rope parameters: ``rope_parameters`` (transformers 5), else ``rope_scaling`` (older files),
  else none; a config whose parameters are keyed by layer type (Gemma 3 and 4, Cohere Compass; a
  Gemma 3 config.json with ``rope_local_base_freq``) needs ``layer_type``;
- ``rope_theta`` and ``partial_rotary_factor`` from the parameters, else from the config;
- the head: ``qk_rope_head_dim`` (MLA's rotary part), else the layer type's own ``head_dim``
  (Gemma 4's full-attention layers: ``per_layer_config``, or config.json's ``global_head_dim``),
  else ``head_dim``, else ``hidden_size // num_attention_heads``;
- sections from ``mrope_section`` (or ``xdrope_section``), the interleaved map where
  ``mrope_interleaved`` is set or the family always interleaves;
- the pairing: GPT-J where the config sets ``rope_interleave`` (DeepSeek) or the family is
  DeepSeek's (vLLM rotates their rotary part GPT-J style), NeoX otherwise: most configs do not say,
  so pass ``is_neox_style`` for the GLM and Ernie families;
- the cache length: the positions the engine admits (``admitted_length``).

Imports nothing of the project but the scaling record.
"""

from __future__ import annotations

from rope.spec_scaling import PARAMETERS, RopeScaling, admitted_length

__all__ = ["spec_fields"]

LAYER_TYPE_NAMES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")
# Families whose rotary module interleaves the M-RoPE rows whether or not the config says so.
INTERLEAVED_FAMILIES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_vl_text", "qwen3_vl_moe_text", "qwen3_5", "qwen3_5_text",
                        "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_omni_moe", "qwen3_omni_moe_thinker_text")
# DeepSeek's MLA families: vLLM turns their "yarn" into its DeepSeek YaRN and rotates GPT-J pairs.
DEEPSEEK_FAMILIES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")
# vLLM's exception to the scaled length: Gemma 3's max_position_embeddings is scaled already.
ALREADY_SCALED_FAMILIES = ("gemma3", "gemma3_text")
# Keys a scaling may carry that change the table but are not modelled: refused, never dropped.
_UNMODELLED = {"attn_factor": 1.0, "extrapolation_factor": 1.0}
_HF_NAMES = {"original_max_position_embeddings": "original_max_position"}
_NO_SCALING = ("default", "mrope")


def _get(config, key, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    try:
        value = getattr(config, key)
    except Exception:       # noqa: BLE001 - a heterogeneous config refuses a global read of a per-layer key
        return default
    return default if value is None else value


def _text_config(config):
    if isinstance(config, dict):
        config = config.get("thinker_config") or config
        text = config.get("text_config")
        return text if isinstance(text, dict) else config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _rope_parameters(text) -> dict:
    params = _get(text, "rope_parameters") or _get(text, "rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope_parameters={params!r}: must be a mapping")
    local = _get(text, "rope_local_base_freq")
    if local is not None and not _nested_keys(text, params):       # a Gemma 3 config.json
        full = dict(params, rope_theta=params.get("rope_theta", _get(text, "rope_theta")))
        params = {"sliding_attention": {"rope_type": "default", "rope_theta": local}, "full_attention": full}
    return params


def _nested_keys(text, params: dict) -> list[str]:
    names = set(_get(text, "layer_types") or ()) | set(LAYER_TYPE_NAMES)
    return [k for k in params if k in names and (params[k] is None or isinstance(params[k], dict))]


def _layer_parameters(text, layer_type) -> tuple[dict, bool]:
    """The rope parameters of ``layer_type``; and whether the config keys them by layer type."""
    params = _rope_parameters(text)
    nested = _nested_keys(text, params)
    if not nested:
        layer_types = _get(text, "layer_types")
        if layer_type is not None and layer_types and layer_type not in layer_types:
            raise ValueError(f"layer_type={layer_type!r}: not among the config's layer_types "
                             f"({', '.join(sorted(set(layer_types)))})")
        return dict(params), False
    if layer_type is None:
        raise ValueError(f"layer_type=None: this config gives each layer type its own rope parameters "
                         f"({', '.join(sorted(nested))}): name the layer type")
    if layer_type not in nested:
        raise ValueError(f"layer_type={layer_type!r}: not among the config's rope layer types "
                         f"({', '.join(sorted(nested))})")
    if params[layer_type] is None:
        raise ValueError(f"layer_type={layer_type!r}: takes no RoPE in this config "
                         f"(rope_parameters.{layer_type} is null)")
    return dict(params[layer_type]), True


def _head_size(text, layer_type) -> int:
    if _get(text, "qk_rope_head_dim"):
        return _get(text, "qk_rope_head_dim")
    if layer_type is not None:
        per_layer = _get(text, "per_layer_config")
        if per_layer is not None:
            try:
                head = _get(per_layer[layer_type], "head_dim")
            except (KeyError, IndexError, TypeError, ValueError):
                head = None
            if head:
                return head
        if layer_type == "full_attention" and _get(text, "global_head_dim"):
            return _get(text, "global_head_dim")
    head = _get(text, "head_dim")
    if head:
        return head
    hidden, heads = _get(text, "hidden_size"), _get(text, "num_attention_heads")
    if not hidden or not heads:
        raise ValueError("head_dim=None: the config has neither head_dim nor hidden_size and num_attention_heads")
    return hidden // heads


def _rope_type(params: dict, families: set) -> str:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "su":                       # LongRoPE's first name (Phi-3)
        rope_type = "longrope"
    if rope_type == "yarn" and families & set(DEEPSEEK_FAMILIES):
        rope_type = "deepseek_yarn"
    return rope_type


def _scaling(params: dict, rope_type: str, text, max_position_embeddings: int, partial: float):
    """The RopeScaling of the parameters (None for the default type), transformers' fallbacks applied."""
    if rope_type in _NO_SCALING:
        return None
    for key, neutral in _UNMODELLED.items():
        if params.get(key, neutral) != neutral:
            raise ValueError(f"{key}={params[key]!r}: changes the table and is not modelled (only {neutral} is)")
    if rope_type not in PARAMETERS:
        raise ValueError(f"rope_type={rope_type!r}: not a rope type the harness models "
                         f"(known: {', '.join(sorted(PARAMETERS))}, and the XD-RoPE alpha)")
    required, optional = PARAMETERS[rope_type]
    fields = {}
    for hf_key, value in params.items():
        key = _HF_NAMES.get(hf_key, hf_key)
        if key in required + optional and value is not None:
            fields[key] = value
    if rope_type in ("llama3", "yarn", "deepseek_yarn", "longrope"):
        top = _get(text, "original_max_position_embeddings")     # Phi-3 keeps it beside rope_scaling
        fields["original_max_position"] = top or fields.get("original_max_position") or max_position_embeddings
    if rope_type == "dynamic":
        fields["original_max_position"] = max_position_embeddings
    if rope_type in ("yarn", "deepseek_yarn", "longrope") and fields.get("factor") is None:
        fields["factor"] = max_position_embeddings / fields["original_max_position"]
    if rope_type == "proportional":
        fields["partial_rotary_factor"] = partial
    return RopeScaling(rope_type, **fields)


def _sections(params: dict, text, families: set, rotary_dim: int):
    sections = params.get("mrope_section") or _get(text, "mrope_section")
    layout = "chunked"
    if sections is None and params.get("xdrope_section") is not None:
        sections = params["xdrope_section"]
        if all(isinstance(s, float) for s in sections):     # fractions of the frequencies (ARC-Hunyuan-Video)
            sections = [round(s * rotary_dim / 2) for s in sections]
    if sections is None:
        return None, layout
    interleaved = params.get("mrope_interleaved", _get(text, "mrope_interleaved"))
    if interleaved or (interleaved is None and families & set(INTERLEAVED_FAMILIES)):
        layout = "interleaved"
    return tuple(sections), layout


def spec_fields(config, layer_type=None, *, is_neox_style=None, layout=None, max_position=None) -> dict:
    """The keyword arguments of ``RopeSpec`` for ``config`` (see the module's docstring)."""
    if layer_type is not None and not isinstance(layer_type, str):
        raise ValueError(f"layer_type={layer_type!r}: must be a layer type's name or None")
    text = _text_config(config)
    families = {_get(config, "model_type"), _get(text, "model_type")} - {None, ""}
    params, _ = _layer_parameters(text, layer_type)
    mpe = _get(text, "max_position_embeddings")
    if not isinstance(mpe, int) or isinstance(mpe, bool) or mpe <= 0:
        raise ValueError(f"max_position_embeddings={mpe!r}: the config must give a positive int")
    base = params["rope_theta"] if params.get("rope_theta") is not None else _get(text, "rope_theta")
    if base is None:
        raise ValueError("rope_theta=None: the config gives no base (a transformers config object fills its "
                         "class's default)")
    head = _head_size(text, layer_type)
    partial = params.get("partial_rotary_factor")
    partial = _get(text, "partial_rotary_factor", 1.0) if partial is None else partial
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ValueError(f"partial_rotary_factor={partial!r}: must be a number in (0, 1]")
    rope_type = _rope_type(params, families)
    alpha = params.get("alpha") if rope_type in ("dynamic", "xdrope") and "alpha" in params else None
    scaling = None if alpha is not None else _scaling(params, rope_type, text, mpe, partial)
    rotary_dim = head if rope_type == "proportional" else int(head * partial)
    sections, found_layout = _sections(params, text, families, rotary_dim)
    if is_neox_style is None:                 # the config's rope_interleave where it says, else DeepSeek's GPT-J pairs
        interleave = _get(text, "rope_interleave")
        is_neox_style = not (bool(families & set(DEEPSEEK_FAMILIES)) if interleave is None else interleave)
    if max_position is None:
        max_position = admitted_length(scaling, mpe, already_scaled=bool(families & set(ALREADY_SCALED_FAMILIES)))
    return dict(head_size=head, rotary_dim=rotary_dim, is_neox_style=is_neox_style, sections=sections,
                layout=layout or found_layout, base=float(base), max_position=max_position,
                ntk_alpha=None if alpha is None else float(alpha), scaling=scaling)
