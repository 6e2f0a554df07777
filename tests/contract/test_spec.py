"""RopeSpec validation, the axis map (pinned exactly, docs/spec.md §2) and serialization."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from properties.strategies import KINDS, rope_specs
from rope.spec import RopeSpec

# (kwargs, field named in the message, message regex): OpInfo-style error inputs.
BAD_SPECS = [
    (dict(head_size=0, rotary_dim=0), r"head_size=0: must be a positive int"),
    (dict(head_size=128, rotary_dim=63), r"rotary_dim=63: must be even"),
    (dict(head_size=64, rotary_dim=128), r"rotary_dim=128: must be <= head_size"),
    (dict(head_size=128, rotary_dim=64, sections=(8, 12, 11)),
     re.escape("sections=(8, 12, 11): must sum to rotary_dim/2 = 32 (got 31)")),
    (dict(head_size=128, rotary_dim=128, sections=(16, 16, 16, 15)),   # XD-RoPE sum unchecked (bug 8)
     re.escape("sections=(16, 16, 16, 15): must sum to rotary_dim/2 = 64 (got 63)")),
    (dict(head_size=128, rotary_dim=64, sections=(8, 0, 24)), r"sections=.*positive int"),
    (dict(head_size=128, rotary_dim=64, sections=(8, 8, 8, 4, 4)), r"sections=.*1 to 4 rows"),
    (dict(head_size=128, rotary_dim=128, sections=(16, 16, 16, 16), layout="interleaved"),
     r"sections=.*interleaved' needs exactly 3 rows"),
    (dict(head_size=128, rotary_dim=128, layout="interleaved"), r"layout='interleaved': needs sections"),
    (dict(head_size=128, rotary_dim=128, layout="zigzag"), r"layout='zigzag': must be one of"),
    (dict(head_size=128, rotary_dim=128, base=0.5), r"base=0.5: must be a finite number > 1"),
    (dict(head_size=128, rotary_dim=128, base=float("nan")), r"base=nan"),
    (dict(head_size=128, rotary_dim=128, max_position=0), r"max_position=0: must be a positive int"),
    (dict(head_size=128, rotary_dim=128, ntk_alpha=-1.0), r"ntk_alpha=-1.0"),
    (dict(head_size=128, rotary_dim=128, is_neox_style=1), r"is_neox_style=1: must be a bool"),
    (dict(head_size=128, rotary_dim=128, sections=(64.0,)), r"sections=.*positive int"),
    (dict(head_size=128, rotary_dim=128, sections=64), r"sections=64: must be a sequence of ints or None"),
    (dict(head_size=128, rotary_dim=64.0), r"rotary_dim=64.0: must be a positive int"),
    (dict(head_size=True, rotary_dim=2), r"head_size=True: must be a positive int"),
    (dict(head_size=2, rotary_dim=2, sections=(1,), ntk_alpha=1000.0), r"ntk_alpha=1000.0: needs rotary_dim > 2"),
    # Values that build garbage: a non-finite cache, an unallocatable one, alpha without sections.
    (dict(head_size=128, rotary_dim=128, sections=(16, 16, 16, 16), ntk_alpha=1e300),
     r"ntk_alpha=1e\+300: makes the effective base inf .* must be a finite number > 1"),
    (dict(head_size=128, rotary_dim=128, sections=(16, 16, 16, 16), ntk_alpha=1e-300),
     r"ntk_alpha=1e-300: makes the effective base 1.73e-301 .* must be a finite number > 1"),
    (dict(head_size=128, rotary_dim=128, ntk_alpha=1000.0), r"ntk_alpha=1000.0: is XD-RoPE's, which has sections"),
    (dict(head_size=128, rotary_dim=128, max_position=10 ** 15), r"max_position=1000000000000000: must be at most 16777216"),
    (dict(head_size=4096, rotary_dim=128), r"head_size=4096: must be at most 1024"),
    (dict(head_size=128, rotary_dim=128, ntk_alpha=float("inf")), r"ntk_alpha=inf"),
    (dict(head_size=128, rotary_dim=128, max_position=True), r"max_position=True: must be a positive int"),
]


@pytest.mark.parametrize("kwargs,pattern", BAD_SPECS, ids=[p for _, p in BAD_SPECS])
def test_bad_spec_raises_value_error_naming_field(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        RopeSpec(**kwargs)


def _counts(spec):
    m = spec.axis_map()
    return [m.count(d) for d in range(spec.num_dims)]


def test_interleaved_map_qwen3vl_is_thw_then_t_tail():
    spec = RopeSpec(128, 128, True, (24, 20, 20), "interleaved")
    m = spec.axis_map()
    assert m[:6] == (0, 1, 2, 0, 1, 2)            # T H W T H W, not "THTHWHTHW"
    assert m[57:60] == (0, 1, 2) and m[60:] == (0, 0, 0, 0)
    assert _counts(spec) == [24, 20, 20]


def test_interleaved_map_qwen35_sections():
    spec = RopeSpec(256, 64, True, (11, 11, 10), "interleaved")
    m = spec.axis_map()
    assert [i for i, a in enumerate(m) if a == 1] == list(range(1, 32, 3))       # 11 H
    assert [i for i, a in enumerate(m) if a == 2] == list(range(2, 30, 3))       # 10 W
    assert _counts(spec) == [11, 11, 10]


def test_interleaved_map_short_half_counts_differ_from_sections():
    # 3*s_h = 36 > 32 frequencies: the rule still holds, so counts are (11, 11, 10), not (8, 12, 12).
    assert _counts(RopeSpec(128, 64, True, (8, 12, 12), "interleaved")) == [11, 11, 10]


def test_interleaved_map_bounds_are_strict():
    # i = 3*s_h + 1 has i % 3 == 1 but is past the H section: it must be T (the `<=` off-by-one).
    spec = RopeSpec(128, 128, True, (44, 10, 10), "interleaved")
    m = spec.axis_map()
    assert m[28] == 1 and m[31] == 0 and m[29] == 2 and m[32] == 0


def test_chunked_map():
    assert RopeSpec(128, 64, False, (8, 12, 12)).axis_map() == (0,) * 8 + (1,) * 12 + (2,) * 12
    assert RopeSpec(128, 128, True, (16, 16, 16, 16)).axis_map() == sum(((d,) * 16 for d in range(4)), ())


@given(spec=st.sampled_from(KINDS).flatmap(lambda k: rope_specs(kind=k)))
def test_axis_map_counts_match_sections(spec):
    m = spec.axis_map()
    assert len(m) == spec.rotary_dim // 2 and set(m) <= set(range(spec.num_dims))
    if spec.layout == "chunked" and spec.sections:
        assert _counts(spec) == list(spec.sections)
        assert list(m) == sorted(m)


@given(spec=st.sampled_from(KINDS).flatmap(lambda k: rope_specs(kind=k)))
def test_spec_round_trips_through_dict(spec):
    assert RopeSpec.from_dict(spec.to_dict()) == spec


def test_from_dict_rejects_unknown_field():
    with pytest.raises(ValueError, match=r"spec: unknown fields \['mrope'\]"):
        RopeSpec.from_dict({"head_size": 64, "rotary_dim": 64, "mrope": True})


def test_num_dims_and_effective_base():
    assert RopeSpec(64, 64).num_dims == 1
    assert RopeSpec(128, 128, sections=(16, 16, 16, 16)).num_dims == 4
    hy = RopeSpec(128, 128, sections=(16, 16, 16, 16), base=10000.0, ntk_alpha=1000.0)
    assert hy.effective_base == pytest.approx(10000.0 * 1000.0 ** (128 / 126), rel=1e-15)
    assert RopeSpec(128, 128, base=5e6).effective_base == 5e6
