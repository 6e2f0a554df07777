"""transformers as an external implementation: each model family's own rotary code.

Two halves.  The catalogue and runner (``FAMILIES``, ``text_config``, ``hf_rotate``, the head layouts)
build a family's text config from a :class:`RopeSpec` (no weights, no hub) and run its rotary module
and rotation function; ``tests/reference/hf_oracle.py`` uses them as an oracle for the reference.

The adapter (``rotate_transformers``, registry name ``transformers``) is the same rotation path fed from
the harness's cos|sin cache: per-row cos/sin are gathered from the cache, the family's rotary module
recomposes them (``recomposition_frequencies``: its axis map and its cos layout, cat(f, f) or GPT-J
repeat_interleave) and the family's ``apply_rotary_pos_emb`` rotates q/k, exactly as the attention layer
does.  The recomposition only selects values, so feeding the (already rounded) cache gives what the
module's own float32 cos/sin rounded to the activation dtype give (``test_transformers_oracle.py``
checks that they are bit-identical).  Which family runs is decided by the spec:

* 4 rows or an NTK alpha: HunYuanVL (XD-RoPE; its image-token layout is the known divergence);
* interleaved: Qwen3-VL;  chunked GPT-J: GLM-4.1V;  chunked NeoX partial: GLM-4.5V;  else Qwen2-VL;
* ernie45: Ernie-4.5-VL (GPT-J, whole head), its cos/sin fed in the module's permuted frequency order;
* 1-D RoPE (or one row): the same family with three equal rows, as transformers feeds text tokens.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

import torch
from packaging.version import Version

from rope.backends import declare, require
from rope.spec import RopeSpec, check_rotation_inputs

transformers = require("transformers", distribution="transformers", install="pip install '.[oracle]'")

TRANSFORMERS_VERSION = Version(transformers.__version__)

# These tests build configs through ``rope_parameters`` (the 5.x config API); 4.x used ``rope_scaling``.
MIN_TRANSFORMERS = Version("5.0.0")


# ----------------------------------------------------------------------------------------- catalogue
@dataclass(frozen=True)
class HFFamily:
    """One transformers model family whose rotary code serves as an oracle.

    Attributes:
        key: model family name used in test ids.
        package: ``transformers.models.<package>``.
        rotary_class: the text rotary module in ``modeling_<package>``.
        config_class: the text config in ``configuration_<package>``.
        since: a transformers release known to ship the package.  Below it a missing package skips;
            at or above it, it fails.  (A later release than the true first one only narrows the skip
            window, so an unverified first release is never claimed.)
        is_neox_style: pairing of the family's rotation function.
        layout: the RopeSpec layout of the family's canonical axis map.
        working_precision: as in ``rope.registry``: "activation" (the rotation function computes in
            q's dtype, float64 here) or "float32" (it upcasts q/k/cos/sin to float32 and casts back).
    """

    key: str
    package: str
    rotary_class: str
    config_class: str
    since: str
    is_neox_style: bool
    layout: str
    working_precision: str = "activation"

    @property
    def modeling_module(self) -> str:
        return f"transformers.models.{self.package}.modeling_{self.package}"

    @property
    def configuration_module(self) -> str:
        return f"transformers.models.{self.package}.configuration_{self.package}"


# since "5.0.0": present in 5.0.0 (docs/spec.md §8.6), the first release these tests support.
FAMILIES: dict[str, HFFamily] = {f.key: f for f in (
    # Qwen2-VL / Qwen2.5-VL: chunked sections [t, h, w], NeoX.
    HFFamily("qwen2-vl", "qwen2_vl", "Qwen2VLRotaryEmbedding", "Qwen2VLTextConfig", "5.0.0", True, "chunked"),
    HFFamily("qwen2.5-vl", "qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding", "Qwen2_5_VLTextConfig", "5.0.0", True,
             "chunked"),
    # Qwen3-VL (dense and MoE): interleaved T H W T H W ..., NeoX.
    HFFamily("qwen3-vl", "qwen3_vl", "Qwen3VLTextRotaryEmbedding", "Qwen3VLTextConfig", "5.0.0", True,
             "interleaved"),
    HFFamily("qwen3-vl-moe", "qwen3_vl_moe", "Qwen3VLMoeTextRotaryEmbedding", "Qwen3VLMoeTextConfig", "5.0.0",
             True, "interleaved"),
    # GLM-4.1V and GLM-OCR: chunked, GPT-J adjacent pairs (GLM-4.1V partial rotary).  GLM-4.5V: NeoX.
    HFFamily("glm-4.1v", "glm4v", "Glm4vTextRotaryEmbedding", "Glm4vTextConfig", "5.0.0", False, "chunked"),
    HFFamily("glm-ocr", "glm_ocr", "GlmOcrTextRotaryEmbedding", "GlmOcrTextConfig", "5.12.1", False, "chunked"),
    HFFamily("glm-4.5v", "glm4v_moe", "Glm4vMoeTextRotaryEmbedding", "Glm4vMoeTextConfig", "5.0.0", True,
             "chunked"),
    # HunYuanVL / HunyuanOCR: XD-RoPE, 3 or 4 rows, NTK-alpha; rotation upcasts to float32.
    # Its image-token layout differs from the canonical one (docs/spec.md §2; KNOWN_MISMATCH_HUNYUAN_VL).
    HFFamily("hunyuan-vl", "hunyuan_vl", "HunYuanVLRotaryEmbedding", "HunYuanVLTextConfig", "5.13.0", True,
             "chunked", working_precision="float32"),
    # Ernie-4.5-VL: sections (s_h, s_w, s_t), H/W alternating then T, GPT-J pairs over the whole head; its
    # module stores inv_freq permuted (the first s_h + s_w even ones, then the odd ones, then T's), which its
    # recomposition puts back; the rotation upcasts to float32.
    HFFamily("ernie-4.5-vl", "ernie4_5_vl_moe", "Ernie4_5_VLMoeTextRotaryEmbedding", "Ernie4_5_VLMoeTextConfig",
             "5.0.0", False, "ernie45", working_precision="float32"),
)}

KNOWN_MISMATCH_HUNYUAN_VL = (
    "known mismatch: transformers HunYuanVL (5.13+) splits the full rotary head into blocks of 2*s_i "
    "(block i takes position row i), so the two channels of a NeoX pair can take different rows for "
    "image tokens; the canonical HunyuanOCR layout (Tencent's code, vLLM, mlx-vlm; docs/spec.md §2) applies the "
    "chunked map to each half. Text tokens (all rows equal) agree."
)


def unavailable_reason(family: HFFamily) -> str | None:
    """Why the family cannot be checked with the installed transformers, or None.

    Only a release older than ``since`` (or than MIN_TRANSFORMERS) is a reason; a missing package in
    a release that should have it returns None, so the test runs and fails at import.
    """
    v = TRANSFORMERS_VERSION
    if v < MIN_TRANSFORMERS:
        return f"transformers {v}: these oracle tests need >= {MIN_TRANSFORMERS} (rope_parameters config API)"
    if v < Version(family.since):
        try:
            importlib.import_module(family.modeling_module)
        except ImportError:
            return f"transformers {v} has no {family.package} (needs >= {family.since} for {family.key})"
    return None


# ----------------------------------------------------------------------------------------- running
def text_config(family: HFFamily, spec: RopeSpec, *, num_heads: int):
    """The family's text config for ``spec``: head size, rotary fraction, base, sections, NTK alpha."""
    if spec.sections is None:
        raise ValueError(f"sections=None: {family.key} is a multi-row RoPE, the spec needs sections")
    config_cls = getattr(importlib.import_module(family.configuration_module), family.config_class)
    factor = spec.rotary_dim / spec.head_size
    if int(spec.head_size * factor) != spec.rotary_dim:      # transformers: dim = int(head_dim * factor)
        raise ValueError(f"rotary_dim={spec.rotary_dim}: not int(head_size * factor) for factor {factor}")
    # Always explicit: Glm4vMoeTextConfig defaults partial_rotary_factor to 0.5.
    params: dict = {"rope_type": "default", "rope_theta": float(spec.base), "mrope_section": list(spec.sections),
                    "partial_rotary_factor": factor}
    if spec.ntk_alpha is not None:
        # HunyuanOCR's checkpoint: rope type "xdrope" -> "dynamic" with a fixed alpha (static NTK-alpha base).
        params.update(rope_type="dynamic", alpha=float(spec.ntk_alpha), factor=1.0)
    return config_cls(
        hidden_size=num_heads * spec.head_size,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=spec.head_size,
        # Positions stay below this, so 5.16/5.17 HunYuanVL ("dynamic") never recomputes inv_freq.
        max_position_embeddings=spec.max_position,
        rope_parameters=params,
    )


@dataclass
class HFRotation:
    """What transformers computed for one call (transformers layouts, see the module docstring)."""

    query: torch.Tensor
    key: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    per_row: bool            # cos/sin are [rows, B, L, rotary_dim] (recomposed by the rotation function)
    function: str            # the rotation function that ran
    attention_scaling: float


def hf_rotate(family: HFFamily, spec: RopeSpec, position_ids: torch.Tensor, query: torch.Tensor,
              key: torch.Tensor) -> HFRotation:
    """Run the family's rotary module and rotation function.

    Args:
        position_ids: int64 [rows, B, L].
        query: [B, num_q_heads, L, head_size]; key: [B, num_kv_heads, L, head_size]; same dtype
            (the rotary module casts cos/sin to it).
    """
    modeling = importlib.import_module(family.modeling_module)
    config = text_config(family, spec, num_heads=query.shape[1])
    rotary = getattr(modeling, family.rotary_class)(config)
    with torch.no_grad():
        cos, sin = rotary(query, position_ids)
        if cos.dim() == 4:
            # <= 5.16: one cos/sin per position row; the rotation function recomposes the sections.
            apply = getattr(modeling, "apply_multimodal_rotary_pos_emb", None)
            if apply is None:
                raise AssertionError(
                    f"{family.key}: {family.rotary_class} returned per-row cos {tuple(cos.shape)} but "
                    f"{family.modeling_module} (transformers {TRANSFORMERS_VERSION}) has no "
                    f"apply_multimodal_rotary_pos_emb to recompose them")
            q_out, k_out = apply(query, key, cos, sin, list(config.rope_parameters["mrope_section"]))
            name = "apply_multimodal_rotary_pos_emb"
        elif cos.dim() == 3:
            q_out, k_out = modeling.apply_rotary_pos_emb(query, key, cos, sin)
            name = "apply_rotary_pos_emb"
        else:
            raise AssertionError(f"{family.key}: {family.rotary_class} returned cos {tuple(cos.shape)}; "
                                 f"expected [B, L, rotary_dim] or [rows, B, L, rotary_dim]")
    return HFRotation(q_out, k_out, cos, sin, per_row=cos.dim() == 4, function=f"{family.package}.{name}",
                      attention_scaling=float(rotary.attention_scaling))


# ---------------------------------------------------------------------------------------- layouts
def to_hf_heads(x: torch.Tensor, batch: int, head_size: int) -> torch.Tensor:
    """[B*L, heads*head_size] (token t = b*L + l) -> [B, heads, L, head_size]."""
    tokens = x.shape[0]
    return x.reshape(batch, tokens // batch, x.shape[1] // head_size, head_size).transpose(1, 2)


def from_hf_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, L, head_size] -> [B*L, heads*head_size]."""
    b, h, seq, d = x.shape
    return x.transpose(1, 2).reshape(b * seq, h * d)


# ----------------------------------------------------------------------------------------- adapter
def family_for(spec: RopeSpec) -> tuple[HFFamily | None, str | None]:
    """(the family whose rotation path runs ``spec``, None) or (None, why none can)."""
    partial = spec.rotary_dim != spec.head_size
    if spec.layout == "ernie45":
        if spec.is_neox_style or partial or spec.ntk_alpha is not None:
            return None, "Ernie-4.5-VL pairs GPT-J-style over the whole head (no NeoX, no partial, no NTK alpha)"
        family = FAMILIES["ernie-4.5-vl"]
        reason = unavailable_reason(family)
        return (None, reason) if reason else (family, None)
    if spec.layout not in ("chunked", "interleaved"):
        return None, f"no transformers family here maps frequencies {spec.layout!r}"
    if spec.num_dims == 4 or spec.ntk_alpha is not None:
        family = FAMILIES["hunyuan-vl"]
        if spec.layout != "chunked" or not spec.is_neox_style or partial:
            return None, "HunYuanVL (XD-RoPE) is chunked, NeoX, whole head only"
    elif spec.layout == "interleaved":
        family = FAMILIES["qwen3-vl"]
        if not spec.is_neox_style or partial:
            return None, "Qwen3-VL (interleaved) pairs NeoX-style over the whole head (no GPT-J, no partial)"
    elif not spec.is_neox_style:
        family = FAMILIES["glm-4.1v"]
    elif partial:
        family = FAMILIES["glm-4.5v"]
    else:
        family = FAMILIES["qwen2-vl"]
    if spec.num_dims == 1 and spec.num_freqs < 3:
        return None, f"text tokens go through a 3-row map, which needs rotary_dim/2 >= 3 (got {spec.num_freqs})"
    reason = unavailable_reason(family)
    return (None, reason) if reason else (family, None)


def module_frequency_order(family: HFFamily, spec: RopeSpec) -> list[int] | None:
    """The frequency each slot of the family's rotary module holds before its recomposition, where
    that is not slot i = frequency i (None): Ernie-4.5-VL's pre-rotation, the even frequencies of the
    first s_h + s_w, then the odd ones, then T's (its ``compute_default_rope_parameters``)."""
    if family.key != "ernie-4.5-vl":
        return None
    hw = spec.sections[0] + spec.sections[1]
    return [*range(0, hw, 2), *range(1, hw, 2), *range(hw, spec.num_freqs)]


def _three_rows(spec: RopeSpec) -> RopeSpec:
    """A 1-D (or one-row) spec as the family sees text tokens: three rows (all equal), any sections."""
    half = spec.num_freqs
    return RopeSpec(spec.head_size, spec.rotary_dim, spec.is_neox_style, (1, 1, half - 2), "chunked",
                    spec.base, spec.max_position, spec.ntk_alpha)


@functools.lru_cache(maxsize=64)
def _rotary_module(family: HFFamily, spec: RopeSpec):
    modeling = importlib.import_module(family.modeling_module)
    return getattr(modeling, family.rotary_class)(text_config(family, spec, num_heads=1)), modeling


def rotate_transformers(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    family, why = family_for(spec)
    if family is None:
        raise ValueError(f"spec={spec}: transformers has no rotation path for it ({why})")
    rows = positions.reshape(spec.num_dims, -1).long()
    if spec.num_dims == 1:
        spec, rows = _three_rows(spec), rows.expand(3, -1)
    rotary, modeling = _rotary_module(family, spec)
    recompose = getattr(rotary, "recomposition_frequencies", None)
    if recompose is None:
        raise ValueError(f"transformers {TRANSFORMERS_VERSION}: {family.rotary_class} has no "
                         f"recomposition_frequencies (<= 5.16); the adapter needs transformers >= 5.17")
    cos, sin = cos_sin_cache[rows].chunk(2, dim=-1)               # [rows, T, rd/2] each
    order = module_frequency_order(family, spec)
    if order is not None:                                          # the module's own inv_freq order
        cos, sin = cos[..., order], sin[..., order]
    with torch.no_grad():
        cos = recompose(cos.unsqueeze(1).clone())                  # [1, T, rd]
        sin = recompose(sin.unsqueeze(1).clone())
        hs = spec.head_size
        k_in = key if key is not None else query[:, :hs]
        q_out, k_out = modeling.apply_rotary_pos_emb(to_hf_heads(query, 1, hs), to_hf_heads(k_in, 1, hs), cos, sin)
    return from_hf_heads(q_out), (from_hf_heads(k_out) if key is not None else None)


def _reason(spec: RopeSpec, dtype, device: str) -> str | None:
    family, why = family_for(spec)
    if family is None:
        return why
    rotary_class = getattr(importlib.import_module(family.modeling_module), family.rotary_class)
    if not hasattr(rotary_class, "recomposition_frequencies"):
        return f"transformers {TRANSFORMERS_VERSION} recomposes cos/sin in the rotation function (<= 5.16)"
    return None


# The rotation functions compute in q's dtype, HunYuanVL's in float32: "activation" bounds both.
rotate_transformers = declare(rotate_transformers, working_precision="activation", reason=_reason)
