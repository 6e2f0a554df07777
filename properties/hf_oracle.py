"""transformers' own rotary code as a weight-free oracle for ``reference.rotate`` (SPEC §1-3).

For one model family this module builds the text config from a :class:`RopeSpec` (default-constructed
config class plus explicit RoPE fields: no weights, no hub), runs the family's rotary module for the
positions and then the family's own rotation function on q/k, exactly as the family's attention layer
does.  Shapes on the transformers side:

* ``position_ids``: int64 ``[rows, B, L]`` (3 rows for M-RoPE, 3 or 4 for HunYuanVL's XD-RoPE);
* ``query``/``key``: ``[B, heads, L, head_dim]``;
* cos/sin: ``[B, L, rotary_dim]``, or ``[rows, B, L, rotary_dim]`` where the release leaves the
  section recomposition to the rotation function (see below).

Which rotation function runs depends on the release, and is *detected*, never assumed:

* up to 5.16 (Qwen2-VL, Qwen2.5-VL, HunYuanVL; seen in 5.12.1 and 5.16.1) the rotary module returns
  one cos/sin per position row and ``apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section)``
  recomposes them;
* from 5.17 every family recomposes inside the rotary module (``recomposition_frequencies``) and the
  attention calls the plain ``apply_rotary_pos_emb``.

A module that returns per-row cos/sin in a release without ``apply_multimodal_rotary_pos_emb`` is an
error, not a skip.

The other half holds what the comparisons need beyond ``rope.tolerance``: per-channel cos/sin maps
(canonical, per row, or any other row assignment), a bound for outputs that are not rotations (the
HunYuanVL block layout), and bitwise / element-wise assertions with the mismatch anatomy.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
import transformers
from packaging.version import Version

from rope.spec import RopeSpec
from rope.tolerance import SUBNORMAL_SPACING, unit_roundoff, working_dtype

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


# since "5.0.0": present in 5.0.0 (notes/peers.md §1), the first release these tests support.
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
    # Its image-token layout differs from the canonical one (SPEC §2; KNOWN_MISMATCH_HUNYUAN_VL).
    HFFamily("hunyuan-vl", "hunyuan_vl", "HunYuanVLRotaryEmbedding", "HunYuanVLTextConfig", "5.13.0", True,
             "chunked", working_precision="float32"),
)}

KNOWN_MISMATCH_HUNYUAN_VL = (
    "known mismatch: transformers HunYuanVL (5.13+) splits the full rotary head into blocks of 2*s_i "
    "(block i takes position row i), so the two channels of a NeoX pair can take different rows for "
    "image tokens; the canonical HunyuanOCR layout (Tencent's code, vLLM, mlx-vlm; SPEC §2) applies the "
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
    return x.reshape(batch, tokens // batch, -1, head_size).transpose(1, 2)


def from_hf_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, L, head_size] -> [B*L, heads*head_size]."""
    b, h, seq, d = x.shape
    return x.transpose(1, 2).reshape(b * seq, h * d)


def canonical_channel_map(spec: RopeSpec, *, neox_order: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, frequency) of each rotary channel under the spec's axis map (SPEC §2).

    ``neox_order``: channel c carries frequency c mod rotary_dim/2 (cos laid out cat(f, f)); else
    frequency c // 2 (cos laid out repeat_interleave(f, 2), the GPT-J order).
    """
    c = torch.arange(spec.rotary_dim)
    freqs = c % spec.num_freqs if neox_order else c // 2
    rows = torch.tensor(spec.axis_map(), dtype=torch.long)[freqs]
    return rows, freqs


def row_channel_map(spec: RopeSpec, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every channel from one position row, NeoX order: a per-row cos/sin of the <= 5.16 modules."""
    c = torch.arange(spec.rotary_dim)
    return torch.full_like(c, row), c % spec.num_freqs


def gather_channels(cache: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
                    freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin as float64 [T, rotary_dim]: channel c reads cache[positions[rows[c], t], freqs[c]].

    Args:
        cache: [max_position, rotary_dim] = cos | sin.  positions: [rows, T].
    """
    half = cache.shape[1] // 2
    cache = cache.to(torch.float64)
    pos = positions.long()[rows]                                # [rotary_dim, T]
    cos = cache[pos, freqs[:, None]].T                          # [T, rotary_dim]
    sin = cache[pos, half + freqs[:, None]].T
    return cos.contiguous(), sin.contiguous()


def partner_channels(spec: RopeSpec) -> torch.Tensor:
    """The other channel of each rotary channel's pair: NeoX c <-> c +- rd/2, GPT-J 2i <-> 2i+1."""
    c = torch.arange(spec.rotary_dim)
    if spec.is_neox_style:
        return (c + spec.num_freqs) % spec.rotary_dim
    return c ^ 1


def channel_bound(spec: RopeSpec, x: torch.Tensor, expected: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  precision: str) -> torch.Tensor:
    """float64 [T, heads*head_size]: largest legitimate |computed - expected| for a float64 output.

    ``rope.tolerance.rotation_bound`` per channel, for outputs that need not be rotations (each channel
    has its own cos/sin, [T, rotary_dim]): with M = |x_c| |cos_c| + |x_partner| |sin_c| and working unit
    roundoff u (float64 output: no store rounding), bound = u (M + |expected|) + 3 u^2 M + eta.
    Pass-through channels get 0: they must be copied exactly.
    """
    u = unit_roundoff(working_dtype(precision, torch.float64))
    tokens = x.shape[0]
    heads = x.to(torch.float64).reshape(tokens, -1, spec.head_size).abs()
    ref = expected.to(torch.float64).reshape(heads.shape).abs()
    rd = spec.rotary_dim
    mag = heads[..., :rd] * cos.abs()[:, None, :] + heads[..., partner_channels(spec)] * sin.abs()[:, None, :]
    bound = torch.zeros_like(heads)
    bound[..., :rd] = u * (mag + ref[..., :rd]) + 3 * u * u * mag + SUBNORMAL_SPACING[torch.float64]
    return bound.reshape(x.shape)


# --------------------------------------------------------------------------------------- asserting
def _index(flat: int, shape) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def mismatch_report(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> tuple[int, str]:
    """(number of elements with |actual - expected| > bound, the fixed-anatomy description)."""
    diff = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    over = diff > bound
    count, total = int(over.sum()), over.numel()
    if total == 0:
        return 0, "empty tensors"
    ratio = diff / bound.clamp_min(torch.finfo(torch.float64).tiny)
    worst_abs = int(diff.argmax())
    worst_ratio = int(ratio.argmax())
    shape = tuple(diff.shape)
    text = (
        f"mismatched elements: {count} / {total} ({100.0 * count / total:.1f}%)\n"
        f"greatest absolute difference: {float(diff.flatten()[worst_abs]):.3e} at index "
        f"{_index(worst_abs, shape)} (allowed {float(bound.flatten()[worst_abs]):.3e})\n"
        f"greatest difference / allowance: {float(ratio.flatten()[worst_ratio]):.3g} at index "
        f"{_index(worst_ratio, shape)} (actual {float(actual.flatten()[worst_ratio]):.17g}, "
        f"expected {float(expected.flatten()[worst_ratio]):.17g})")
    return count, text


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, *, what: str) -> None:
    """Element-wise |actual - expected| <= bound, else an AssertionError with the mismatch anatomy."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    count, text = mismatch_report(actual, expected, bound)
    if count:
        raise AssertionError(f"{what}: not within the allowance\n{text}")


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, *, what: str) -> None:
    """Exact equality (values and shape), reporting the first differing element."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    differ = actual != expected
    if differ.any():
        first = _index(int(differ.flatten().nonzero()[0]), tuple(actual.shape))
        raise AssertionError(
            f"{what}: not bit-identical\nmismatched elements: {int(differ.sum())} / {differ.numel()}\n"
            f"first at index {first}: actual {float(actual[first]):.17g}, expected {float(expected[first]):.17g}")
