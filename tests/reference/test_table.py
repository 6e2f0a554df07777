"""The float64 table of a rope config (reference/table.py) says what docs/spec.md §1 says each rope
type does: the properties that define the type (which frequencies it keeps, divides or blends, when
it switches), checked on drawn configs and on every scaled model of the catalogue."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, strategies as st

import reference
from reference.table import yarn_ramp_bounds
from rope.spec import RopeScaling, RopeSpec
from tests.reference.scaling_cases import SCALED_MODELS, scaled_specs

F64 = torch.float64


def _plain(spec: RopeSpec) -> torch.Tensor:
    return spec.base ** -(torch.arange(0, spec.rotary_dim, 2, dtype=F64) / spec.rotary_dim)


def _catalogued(rope_type: str):
    """The catalogue's specs of one rope type, as @example rows."""
    return [m.spec for m in SCALED_MODELS.values() if m.spec.scaling.rope_type == rope_type]


def _with_examples(rope_type: str, **extra):
    """@example rows: every catalogued spec of the rope type (with ``extra`` arguments, if the test draws more)."""
    def decorate(test):
        for spec in _catalogued(rope_type):
            test = example(spec=spec, **extra)(test)
        return test
    return decorate


@given(spec=st.builds(RopeSpec, head_size=st.just(128), rotary_dim=st.sampled_from((2, 64, 128)),
                      max_position=st.sampled_from((1, 300)), base=st.sampled_from((1e4, 5e5, 1e7))))
def test_unscaled_table_is_the_plain_formula(spec):
    assert torch.equal(reference.inv_freq(spec), _plain(spec))
    assert reference.attention_factor(spec) == 1.0
    p = torch.arange(spec.max_position, dtype=F64)[:, None] * _plain(spec)
    assert torch.equal(reference.cos_sin_table(spec), torch.cat((p.cos(), p.sin()), -1))


@_with_examples("yarn")
@_with_examples("deepseek_yarn")
@given(spec=scaled_specs(rope_types=("yarn", "deepseek_yarn")))
def test_yarn_keeps_fast_frequencies_divides_slow_ones_blends_between(spec):
    s, plain, got = spec.scaling, _plain(spec), reference.inv_freq(spec)
    low, high = yarn_ramp_bounds(spec)
    i = torch.arange(spec.num_freqs, dtype=F64)
    kept, divided, between = i <= low, i >= high, (i > low) & (i < high)
    torch.testing.assert_close(got[kept], plain[kept], rtol=1e-15, atol=0)
    torch.testing.assert_close(got[divided], plain[divided] / s.factor, rtol=1e-15, atol=0)
    lo, hi = torch.minimum(plain, plain / s.factor), torch.maximum(plain, plain / s.factor)
    assert bool(((got >= lo * (1 - 1e-15)) & (got <= hi * (1 + 1e-15)))[between].all())
    # the frequency index that turns beta times over the original length bounds the ramp
    turns = s.original_max_position * plain / (2 * math.pi)
    if s.truncate is not False and high > low + 1:
        assert bool((turns[kept] >= s.beta_fast * (1 - 1e-12)).all() or low == 0)
        assert bool((turns[divided] <= s.beta_slow * (1 + 1e-12)).all() or high == spec.rotary_dim - 1)


@_with_examples("llama3")
@given(spec=scaled_specs(rope_types=("llama3",)))
def test_llama3_bands_by_wavelength(spec):
    s, plain, got = spec.scaling, _plain(spec), reference.inv_freq(spec)
    wavelength = 2 * math.pi / plain
    short = wavelength < s.original_max_position / s.high_freq_factor
    long = wavelength > s.original_max_position / s.low_freq_factor
    assert torch.equal(got[short], plain[short])
    torch.testing.assert_close(got[long], plain[long] / s.factor, rtol=1e-15, atol=0)
    mid = ~short & ~long
    lo, hi = torch.minimum(plain, plain / s.factor), torch.maximum(plain, plain / s.factor)
    assert bool(((got >= lo * (1 - 1e-14)) & (got <= hi * (1 + 1e-14)))[mid].all())


@given(spec=scaled_specs(rope_types=("dynamic",)), seq_len=st.integers(1, 1 << 20))
def test_dynamic_ntk_grows_the_base_only_past_the_original_length(spec, seq_len):
    s, plain = spec.scaling, _plain(spec)
    got = reference.inv_freq(spec, seq_len)
    if seq_len <= s.original_max_position:
        torch.testing.assert_close(got, plain, rtol=1e-15, atol=0)
        return
    grown = 1 + s.factor * (seq_len / s.original_max_position - 1)
    base = spec.base * grown ** (spec.rotary_dim / (spec.rotary_dim - 2))
    expected = base ** -(torch.arange(0, spec.rotary_dim, 2, dtype=F64) / spec.rotary_dim)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    assert got[0] == 1.0 and (s.factor < 1 or bool((got <= plain * (1 + 1e-15)).all()))


@_with_examples("longrope", past=True)
@_with_examples("longrope", past=False)
@given(spec=scaled_specs(rope_types=("longrope",)), past=st.booleans())
def test_longrope_switches_factor_lists_past_the_original_length(spec, past):
    s = spec.scaling
    seq_len = s.original_max_position + 1 if past else s.original_max_position
    factors = torch.tensor(s.long_factor if past else s.short_factor, dtype=F64)
    torch.testing.assert_close(reference.inv_freq(spec, seq_len) * factors, _plain(spec), rtol=1e-15, atol=0)
    expected = 1.0 if s.factor <= 1 else math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_position))
    assert reference.attention_factor(spec, seq_len) == (s.attention_factor or expected)


@_with_examples("proportional")
@given(spec=scaled_specs(rope_types=("proportional",)))
def test_proportional_rotates_a_share_of_the_whole_heads_frequencies(spec):
    s, got = spec.scaling, reference.inv_freq(spec)
    rotating = int(s.partial_rotary_factor * spec.head_size // 2)
    assert got.shape == (spec.head_size // 2,) and spec.rotary_dim == spec.head_size
    torch.testing.assert_close(got[:rotating], _plain(spec)[:rotating] / s.factor, rtol=1e-15, atol=0)
    assert bool((got[rotating:] == 0).all())
    table = reference.cos_sin_table(spec, rows=50)
    half = spec.head_size // 2    # the pass-through pairs: cos 1, sin 0 at every position
    assert bool((table[:, rotating:half] == 1).all()) and bool((table[:, half + rotating:] == 0).all())


@given(spec=scaled_specs(rope_types=("ntk",)))
def test_fixed_ntk_scales_the_base_and_shifts_by_one_frequency(spec):
    s, got = spec.scaling, reference.inv_freq(spec)
    if s.mixed_b is not None:
        i = torch.arange(spec.num_freqs, dtype=F64)
        torch.testing.assert_close(got, _plain(spec) * s.factor ** -(((i + 1) / spec.num_freqs) ** s.mixed_b),
                                   rtol=1e-12, atol=0)
        return
    i = torch.arange(spec.num_freqs, dtype=F64)
    torch.testing.assert_close(got, _plain(spec) * s.factor ** (-(2 * i + 2) / spec.rotary_dim), rtol=1e-12, atol=0)


@given(spec=scaled_specs(rope_types=("linear",)), p=st.integers(0, 1 << 20))
def test_linear_interpolates_positions(spec, p):
    # position p with frequencies / s is position p / s with the plain ones
    torch.testing.assert_close(p * reference.inv_freq(spec), (p / spec.scaling.factor) * _plain(spec),
                               rtol=1e-15, atol=0)


# Magnitudes of the catalogue's models (docs/spec.md §1), and the two DeepSeek readings of a lone mscale.
@pytest.mark.parametrize("scaling, expected", [
    (RopeScaling("deepseek_yarn", factor=40.0, original_max_position=4096, mscale=1.0, mscale_all_dim=1.0), 1.0),
    (RopeScaling("yarn", factor=40.0, original_max_position=4096, mscale=1.0, mscale_all_dim=1.0), 1.0),
    (RopeScaling("yarn", factor=32.0, original_max_position=4096, truncate=False), 0.1 * math.log(32) + 1),
    (RopeScaling("yarn", factor=4.0, original_max_position=262144), 0.1 * math.log(4) + 1),
    (RopeScaling("yarn", factor=4.0, original_max_position=262144, attention_factor=1.5), 1.5),
    (RopeScaling("yarn", factor=0.5, original_max_position=4096), 1.0),
    # transformers' yarn reads mscale only beside mscale_all_dim; vLLM's DeepSeek YaRN reads it alone
    (RopeScaling("yarn", factor=40.0, original_max_position=4096, mscale=0.707), 0.1 * math.log(40) + 1),
    (RopeScaling("deepseek_yarn", factor=40.0, original_max_position=4096, mscale=0.707),
     0.1 * 0.707 * math.log(40) + 1),
    (RopeScaling("longrope", factor=32.0, original_max_position=4096, short_factor=[1.0] * 48,
                 long_factor=[1.0] * 48), math.sqrt(1 + math.log(32) / math.log(4096))),
    (RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192), 1.0),
])
def test_attention_factor_of_known_configs(scaling, expected):
    spec = RopeSpec(96, 96, scaling=scaling)
    assert reference.attention_factor(spec) == pytest.approx(expected, rel=1e-15)
    table = reference.cos_sin_table(spec, rows=2)
    assert table[0, 0] == pytest.approx(expected, rel=1e-15) and table[0, 48] == 0
