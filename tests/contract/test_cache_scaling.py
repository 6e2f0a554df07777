"""The cos/sin cache of a spec with a scaling (rope/cache.py, docs/spec.md §1): its float32 frequencies
lie within float32 rounding of the float64 reference's, its magnitude is the reference's attention
factor exactly, folded into cos and sin before the cast, and a plain spec's cache is what it was."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

import reference
from rope.cache import attention_factor, cos_sin_cache, inv_freq
from rope.spec import RopeSpec
from tests.reference.scaling_cases import MODELLED_TYPES, SCALED_MODELS, U32, float32_bound, scaled_specs

CATALOGUE = [m.spec for m in SCALED_MODELS.values()]
# Configs that expose a known table bug where the catalogue's models would not: YaRN's mscale pair
# unequal (a ratio inverted or squared shows; DeepSeek's released pairs are equal), a lone mscale.
KNOWN_BUG_SPECS = {
    "yarn-unequal-mscales": RopeSpec(64, 64, False, max_position=2048, scaling={
        "rope_type": "yarn", "factor": 40.0, "original_max_position": 4096, "mscale": 1.0, "mscale_all_dim": 0.707}),
    "deepseek-lone-mscale": RopeSpec(64, 64, False, max_position=2048, scaling={
        "rope_type": "deepseek_yarn", "factor": 40.0, "original_max_position": 4096, "mscale": 0.707}),
}
ROWS = {**{key: m.spec for key, m in SCALED_MODELS.items()}, **KNOWN_BUG_SPECS}


def check_frequencies(spec: RopeSpec) -> None:
    ours = inv_freq(spec)
    ref = reference.inv_freq(spec)
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    bound = torch.tensor(float32_bound(spec, ref.tolist(), spec.max_position), dtype=torch.float64)
    excess = (ours.double() - ref).abs() - bound
    worst = int(excess.argmax())
    assert float(excess[worst]) <= 0, (
        f"{spec.scaling.rope_type}: inv_freq[{worst}] = {float(ours[worst])!r}, reference {float(ref[worst])!r}, "
        f"bound {float(bound[worst]):.3g}")
    assert attention_factor(spec) == reference.attention_factor(spec)


def check_table(spec: RopeSpec, dtype: torch.dtype, rows: int = 512) -> None:
    """The cache's first ``rows`` rows (the frequencies' bound grows with the position; the frequency
    checks above hold them at the whole length)."""
    spec = RopeSpec.from_dict(spec.to_dict() | {"max_position": min(spec.max_position, rows)})
    cache = cos_sin_cache(spec, dtype)
    ref = reference.cos_sin_table(spec)
    assert cache.shape == ref.shape == (spec.max_position, spec.rotary_dim) and cache.dtype == dtype
    m = reference.attention_factor(spec)
    f = reference.inv_freq(spec)
    # angle p f: the frequency's own error times p, one rounding of the product; cos/sin: one more;
    # the magnitude: one rounding; the cast: half a unit of the dtype.
    p = torch.arange(spec.max_position, dtype=torch.float64)[:, None]
    angle = p * (torch.tensor(float32_bound(spec, f.tolist(), spec.max_position), dtype=torch.float64)
                 + U32 * f) + 4 * U32
    bound = (m * angle + 2 * U32 * m).repeat(1, 2) + (torch.finfo(dtype).eps / 2) * ref.abs()
    assert bool(((cache.double() - ref).abs() <= bound).all())


@pytest.mark.parametrize("rope_type", MODELLED_TYPES)
@given(data=st.data())
def test_cache_frequencies_are_the_reference_within_float32_rounding(rope_type, data):
    check_frequencies(data.draw(scaled_specs(rope_types=(rope_type,)), label="spec"))


@pytest.mark.parametrize("key", ROWS)
def test_cache_frequencies_of_catalogued_models_and_known_bugs(key):
    check_frequencies(ROWS[key])


@given(spec=scaled_specs(max_positions=(1, 64, 300)), dtype=st.sampled_from((torch.float32, torch.bfloat16)))
def test_scaled_cache_is_the_reference_table_within_float32_rounding(spec, dtype):
    # the table's assembly (frequencies per type are checked above): angles, cos | sin, magnitude, cast
    check_table(spec, dtype)


@pytest.mark.parametrize("key", ROWS)
def test_scaled_cache_of_catalogued_models_and_known_bugs(key):
    check_table(ROWS[key], torch.bfloat16)


@given(spec=scaled_specs(rope_types=("yarn", "longrope"), max_positions=(1, 64)))
def test_attention_factor_is_folded_into_cos_and_sin(spec):
    m = attention_factor(spec)
    cache = cos_sin_cache(spec, torch.float32)
    half = spec.num_freqs
    assert torch.equal(cache[0, :half], torch.full((half,), m, dtype=torch.float32))   # cos(0) * m, rounded once
    assert bool((cache[0, half:] == 0).all())
    if m != 1.0:
        plain = RopeSpec.from_dict(spec.to_dict() | {"scaling": None})
        assert not torch.equal(cache, cos_sin_cache(plain, torch.float32))


def test_proportional_cache_leaves_the_unrotated_pairs_whole():
    # Gemma 4's full-attention layers: a 512-wide head, a quarter of its 256 frequencies rotating.
    spec = RopeSpec(512, 512, base=1e6, max_position=64, scaling={"rope_type": "proportional",
                                                                   "partial_rotary_factor": 0.25})
    cache = cos_sin_cache(spec, torch.bfloat16)
    assert bool((cache[:, 64:256] == 1).all()) and bool((cache[:, 256 + 64:] == 0).all())
    assert not bool((cache[1:, :64] == 1).all())


def test_dynamic_cache_takes_its_base_at_the_cache_length():
    # vLLM's dynamic NTK: the table of an engine admitting factor x the original length (vllm#55910).
    spec = RopeSpec(128, 128, max_position=8192, scaling={"rope_type": "dynamic", "factor": 2.0,
                                                          "original_max_position": 4096})
    grown = 10000.0 * 3.0 ** (128 / 126)
    expected = 1.0 / (grown ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    assert torch.equal(inv_freq(spec), expected)
    short = RopeSpec.from_dict(spec.to_dict() | {"max_position": 4096})
    assert torch.equal(inv_freq(short), inv_freq(RopeSpec(128, 128)))


def test_inv_freq_rounded_to_bf16_is_caught_by_the_bound():
    # The bug class of a bf16 inv_freq (pi of phase at 4096): the bound above is far tighter than it.
    spec = CATALOGUE[0] if CATALOGUE else RopeSpec(128, 128, scaling={"rope_type": "linear", "factor": 8.0})
    ref = reference.inv_freq(spec)
    rounded = inv_freq(spec).to(torch.bfloat16).double()
    bound = torch.tensor(float32_bound(spec, ref.tolist(), spec.max_position), dtype=torch.float64)
    assert bool(((rounded - ref).abs() > bound).any())
    assert math.isfinite(float(bound.max()))
