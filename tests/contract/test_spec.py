"""RopeSpec validation, the axis map (pinned exactly, docs/spec.md §2) and serialization."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from properties.strategies import KINDS, rope_specs
from tests.contract.bad_specs import BAD_SPECS, assert_bad_spec_raises
from rope.spec import RopeSpec



@pytest.mark.parametrize("kwargs,pattern", BAD_SPECS, ids=[p for _, p in BAD_SPECS])
def test_bad_spec_raises_value_error_naming_field(kwargs, pattern):
    assert_bad_spec_raises(kwargs, pattern)


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


# ------------------------------------------------------------------ the other maps (rope/row_maps.py)
def test_glm_round_robin_map_passes_full_rows_on():
    # SGLang's mrope_interleaved_glm: row i % 3 unless it has its count, then the next with room.
    glm = RopeSpec.glm_round_robin(128, 64, (8, 12, 12)).axis_map()
    assert glm == (0, 1, 2) * 8 + (1, 1, 2, 1, 1, 2, 2, 2)
    assert RopeSpec.glm_round_robin(128, 128, (16, 24, 24)).axis_map() == (0, 1, 2) * 16 + (1, 1, 2) * 4 + (2,) * 4
    for secs in ((24, 20, 20), (11, 11, 10)):      # where no bound binds: the interleaved map
        assert (RopeSpec.glm_round_robin(2 * sum(secs), 2 * sum(secs), secs).axis_map()
                == RopeSpec.interleaved(2 * sum(secs), 2 * sum(secs), secs).axis_map())


def test_ernie45_map_alternates_h_w_then_t():
    m = RopeSpec.ernie45(128, 128, (22, 22, 20), is_neox_style=False).axis_map()
    assert m == (1, 2) * 22 + (0,) * 20


def test_two_row_map_alternates_y_x():
    spec = RopeSpec.two_row_interleaved(128, 128)
    assert spec.sections == (32, 32) and spec.num_dims == 2 and spec.axis_map() == (0, 1) * 32
    assert RopeSpec.two_row_interleaved(16, 14).sections == (4, 3)


@given(spec=st.sampled_from(KINDS).flatmap(lambda k: rope_specs(kind=k)))
def test_any_map_round_trips_through_from_map(spec):
    # Every spec's map as a custom one rotates by the same rows; a chunked map comes back chunked.
    if spec.sections is None:
        return
    again = RopeSpec.from_map(spec.axis_map(), head_size=spec.head_size, num_dims=spec.num_dims,
                              is_neox_style=spec.is_neox_style, base=spec.base, max_position=spec.max_position,
                              ntk_alpha=spec.ntk_alpha)
    assert again.axis_map() == spec.axis_map() and again.num_dims == spec.num_dims
    assert (again.layout == "chunked") == (list(spec.axis_map()) == sorted(spec.axis_map()))


def test_from_map_rejects_what_is_not_a_map():
    with pytest.raises(ValueError, match=re.escape("freq_rows: row 1 of num_dims=3 drives no frequency")):
        RopeSpec.from_map((0, 2, 2), head_size=8)
    with pytest.raises(ValueError, match=re.escape("freq_rows[1]=4: must be a row index in [0, 4)")):
        RopeSpec.from_map((0, 4), head_size=8)
    with pytest.raises(ValueError, match=re.escape("freq_rows=(): must give the row")):
        RopeSpec.from_map((), head_size=8)
    with pytest.raises(ValueError, match=r"freq_rows=5: must be a sequence of ints"):
        RopeSpec.from_map(5, head_size=8)


def test_a_case_files_custom_map_is_checked_like_a_constructors():
    # A case file is untrusted: a spec's freq_rows from JSON is validated field by field.
    good = RopeSpec.from_map((0, 1, 2, 1, 0, 2), head_size=16).to_dict()
    assert good["freq_rows"] == [0, 1, 2, 1, 0, 2] and RopeSpec.from_dict(good).layout == "custom"
    assert "freq_rows" not in RopeSpec(64, 64, sections=(16, 8, 8)).to_dict()   # older readers see no new key
    for rows, pattern in (([0, 1, 2, 1, 0, "2"], r"freq_rows\[5\]='2'"), ([0, 1, 2, 1, 0, -1], r"freq_rows\[5\]=-1"),
                          ([0, 1, 2, 1, 0, 2, 2], "has 7 entries"), ({"a": 1}, "must be a sequence of ints")):
        with pytest.raises(ValueError, match=pattern):
            RopeSpec.from_dict({**good, "freq_rows": rows})
