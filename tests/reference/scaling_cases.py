"""Cases for the scaled cos/sin table (docs/spec.md §1): a Hypothesis strategy of specs with a
scaling, the catalogue's scaled models, and the rope parameters transformers reads for a spec.

A case module: the table's tests in tests/reference and tests/contract import it; it imports no
test module and nothing of transformers at import time.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from properties.strategies import sections
from reference.table import yarn_ramp_bounds
from rope.models import load_models
from rope.spec import RopeSpec

__all__ = ["HF_TYPES", "MODELLED_TYPES", "SCALED_MODELS", "float32_bound", "hf_rope_parameters", "scaled_specs"]

MODELLED_TYPES = ("linear", "dynamic", "ntk", "yarn", "deepseek_yarn", "llama3", "longrope", "proportional")
HF_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope", "proportional")   # transformers' ROPE_INIT_FUNCTIONS
SCALED_MODELS = {key: m for key, m in sorted(load_models().items()) if m.spec.scaling is not None}

FACTORS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 40.0, 64.0)
ORIGINALS = (4096, 256, 2048, 8192, 32768, 262144)
BASES = (10000.0, 500000.0, 1000000.0, 10000000.0, 50000.0, 150000.0)
U32 = 2.0 ** -24
# (mscale, mscale_all_dim): absent, DeepSeek-V3's and V2's equal pairs, unequal pairs (a ratio inverted
# or squared shows), a lone mscale (read by deepseek_yarn only), a lone mscale_all_dim, a zero.
MSCALES = ((None, None), (1.0, 1.0), (0.707, 0.707), (1.0, 0.707), (0.707, 1.0), (0.707, None), (None, 1.0),
           (1.0, 0.0))


def _factor():
    return st.one_of(st.sampled_from(FACTORS), st.floats(0.25, 100.0, allow_nan=False, allow_infinity=False))


@st.composite
def _scaling_fields(draw, rope_type: str, num_freqs: int) -> dict:
    fields = {"rope_type": rope_type}
    if rope_type != "proportional":
        fields["factor"] = draw(_factor())
    if rope_type in ("dynamic", "yarn", "deepseek_yarn", "llama3", "longrope"):
        fields["original_max_position"] = draw(st.sampled_from(ORIGINALS))
    if rope_type in ("yarn", "deepseek_yarn"):
        slow = draw(st.sampled_from((1.0, 0.5, 2.0, 1.0)))
        fields["beta_slow"], fields["beta_fast"] = slow, slow * draw(st.sampled_from((32.0, 1.0, 8.0, 64.0)))
        fields["mscale"], fields["mscale_all_dim"] = draw(st.sampled_from(MSCALES))
    if rope_type == "yarn":
        fields["truncate"] = draw(st.booleans())
        fields["attention_factor"] = draw(st.sampled_from((None, None, 1.0, 0.5)))
    if rope_type == "llama3":
        low = draw(st.sampled_from((1.0, 0.5, 2.0)))
        fields["low_freq_factor"], fields["high_freq_factor"] = low, low + draw(st.sampled_from((3.0, 0.25, 7.0)))
    if rope_type == "longrope":
        lists = st.lists(st.floats(1.0, 80.0, allow_nan=False), min_size=num_freqs, max_size=num_freqs)
        fields["short_factor"], fields["long_factor"] = draw(lists), draw(lists)
        fields["attention_factor"] = draw(st.sampled_from((None, None, 1.2)))
    if rope_type == "ntk":
        fields["mixed_b"] = draw(st.sampled_from((None, None, 0.625, 2.0)))
    if rope_type == "proportional":
        fields["factor"] = draw(st.sampled_from((1.0, 1.0, 8.0)))
        fields["partial_rotary_factor"] = draw(st.sampled_from((0.25, 1.0, 0.5, 0.125)))
    return fields


@st.composite
def scaled_specs(draw, *, rope_types=MODELLED_TYPES, max_positions=(4096, 1, 300, 8192, 32768),
                 with_sections: bool = True) -> RopeSpec:
    """A valid spec with a scaling of one of ``rope_types``; shrinks to the first type, rotary_dim 128
    of a head of 128, base 1e4, factor 1, max_position 4096, no sections."""
    rope_type = draw(st.sampled_from(rope_types))
    half = draw(st.one_of(st.just(64), st.integers(2, 128)))
    head = 2 * half if rope_type == "proportional" else 2 * half + 2 * draw(st.sampled_from((0, 0, 32, 64)))
    fields = draw(_scaling_fields(rope_type, half))
    if rope_type == "proportional" and int(fields["partial_rotary_factor"] * head // 2) < 1:
        fields["partial_rotary_factor"] = 1.0
    secs = None
    if with_sections and rope_type in ("yarn", "default") and half >= 3 and draw(st.booleans()):
        secs = draw(sections(total=half, parts=3))
    layout = "interleaved" if secs is not None and draw(st.booleans()) else "chunked"
    return RopeSpec(head, 2 * half, is_neox_style=draw(st.booleans()), sections=secs, layout=layout,
                    base=draw(st.sampled_from(BASES)), max_position=draw(st.sampled_from(max_positions)),
                    scaling=fields)


def hf_rope_parameters(spec: RopeSpec) -> dict:
    """The rope parameters (transformers 5's ``rope_parameters``) that describe ``spec``; deepseek_yarn
    is transformers' "yarn" (the two agree where mscale and mscale_all_dim are both non-zero)."""
    s = spec.scaling
    params = {"rope_theta": spec.base, "rope_type": "default" if s is None else s.rope_type}
    if s is None:
        return params
    if s.rope_type == "deepseek_yarn":
        params["rope_type"] = "yarn"
    for key, value in s.to_dict().items():
        if key != "rope_type":
            params["original_max_position_embeddings" if key == "original_max_position" else key] = value
    if s.rope_type != "proportional" and spec.rotary_dim != spec.head_size:
        params["partial_rotary_factor"] = spec.rotary_dim / spec.head_size
    return params


def float32_bound(spec: RopeSpec, reference_inv: list[float], seq_len: int) -> list[float]:
    """Per frequency, how far a float32 evaluation of the spec's recipe (transformers', rope.cache's)
    may lie from the float64 value f, first order in u = 2^-24:
    - the plain power base ** (2i/R) and its reciprocal: the exponent's rounding is amplified by
      |2i/R ln base| (twice, for the float32 base), a few more roundings (reciprocal, factor, list
      factor, the product): k = 8 + 2 |2i/R ln base|;
    - YaRN: the ramp r = (i - low) / (high - low) rounds (and 1 - (1 - r) twice more), off by up to
      (4 + 2 |low| / (high - low)) u; the blend moves by that times (f_kept - f_kept / s), at most s f;
    - Llama 3: t = (L0 / w - low) / (high - low) carries the frequency's error k u through L0 / w,
      so it is off by (k + 4) u (L0 / w + low) / (high - low); the blend moves by that times up to s f;
    - mixed NTK: exp(a (i + 1) ** b) with a float32 a: its argument is off by 4 u |a| (i + 1) ** b.
    Dynamic NTK's grown base is a Python float, rounded once to float32 (inside k)."""
    s, rd = spec.scaling, spec.rotary_dim
    base = spec.base
    if s.rope_type == "dynamic":
        length = max(seq_len, s.original_max_position)
        base = base * (s.factor * length / s.original_max_position - (s.factor - 1)) ** (rd / (rd - 2))
    if s.rope_type == "ntk":
        base = base * s.factor
    ramp_error = 0.0
    if s.rope_type in ("yarn", "deepseek_yarn"):
        low, high = yarn_ramp_bounds(spec)
        ramp_error = 4 + 2 * abs(low) / max(high - low, 0.001)
    out = []
    for i, f in enumerate(reference_inv):
        k = 8 + 2 * abs(2 * i / rd * math.log(base))
        amplified = max(s.factor, 1 / s.factor)
        terms = k + ramp_error * amplified
        if s.rope_type == "llama3" and f > 0:
            reach = (s.original_max_position * f / (2 * math.pi) + s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor)
            terms += (k + 4) * reach * amplified
        if s.rope_type == "ntk" and s.mixed_b is not None:
            terms += 4 * abs(math.log(s.factor)) * ((i + 1) / (rd / 2)) ** s.mixed_b
        out.append(terms * U32 * abs(f))
    return out
