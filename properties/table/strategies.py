"""Hypothesis strategies of the table's cases: a spec of every rope type with valid parameters (M-RoPE
with YaRN among them), sized as an engine sizes it (the positions it admits: rope.spec_scaling's
admitted_length, up to 2^20 rows), and a dtype.  The width shrinks as the table grows, so a drawn
table stays under 2^22 elements: a 2^20-row table is 4 wide, a 4096-row one up to 256."""

from __future__ import annotations

from hypothesis import strategies as st

from rope.harness.table.cases import DTYPES, TableCase
from rope.spec import RopeSpec
from rope.spec_scaling import ROPE_TYPES, RopeScaling, admitted_length

__all__ = ["MAX_ELEMENTS", "MAX_ROWS", "scalings", "table_cases"]

MAX_ROWS = 1 << 20
MAX_ELEMENTS = 1 << 22
_FACTORS = (4.0, 2.0, 8.0, 16.0, 32.0, 40.0, 64.0, 1.0)
_ORIGINALS = (4096, 256, 2048, 8192, 32768)
_BASES = (10000.0, 500000.0, 1000000.0, 10000000.0, 150000.0)
# A zero in the pair is a config's own way of saying "no ratio" (transformers then takes g(s, 1); an engine
# that takes the ratio whenever both are given does not).
_MSCALES = ((None, None), (1.0, 1.0), (0.707, 0.707), (1.0, 0.707), (0.707, 1.0), (0.707, 0.0), (0.0, 1.0))


def _factor():
    return st.one_of(st.sampled_from(_FACTORS), st.floats(1.0, 64.0, allow_nan=False, allow_infinity=False))


@st.composite
def scalings(draw, rope_type: str, num_freqs: int) -> dict:
    """The fields of a valid RopeScaling of ``rope_type`` for ``num_freqs`` frequencies."""
    fields = {"rope_type": rope_type}
    if rope_type not in ("proportional", "default"):
        fields["factor"] = draw(_factor())
    if rope_type in ("dynamic", "yarn", "deepseek_yarn", "llama3", "longrope"):
        fields["original_max_position"] = draw(st.sampled_from(_ORIGINALS))
    if rope_type in ("yarn", "deepseek_yarn"):
        slow = draw(st.sampled_from((1.0, 0.5, 2.0)))
        fields["beta_slow"], fields["beta_fast"] = slow, slow * draw(st.sampled_from((32.0, 8.0, 64.0)))
        fields["mscale"], fields["mscale_all_dim"] = draw(st.sampled_from(_MSCALES))
    if rope_type == "yarn":
        fields["truncate"] = draw(st.booleans())
        fields["attention_factor"] = draw(st.sampled_from((None, None, 1.2)))     # the config's, over the formula
    if rope_type == "deepseek_yarn" and fields["mscale"] is None:
        fields["mscale"], fields["mscale_all_dim"] = 1.0, 1.0
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
        fields["factor"] = draw(st.sampled_from((1.0, 8.0)))
        fields["partial_rotary_factor"] = draw(st.sampled_from((0.25, 0.5, 0.125, 1.0)))
    return fields


@st.composite
def _sections(draw, half: int) -> tuple[int, int, int]:
    a = draw(st.integers(1, half - 2))
    b = draw(st.integers(1, half - a - 1))
    return a, b, half - a - b


@st.composite
def table_cases(draw, rope_types=ROPE_TYPES, dtypes=tuple(DTYPES.values())) -> TableCase:
    """A table case: the spec's rope type, its admitted length (<= 2^20), a width that keeps the
    table under MAX_ELEMENTS, every row asked for (sometimes fewer), a dtype and the rows' seed."""
    rope_type = draw(st.sampled_from(rope_types))
    mpe = draw(st.sampled_from((4096, 8192, 2048, 32768, 300, 131072)))
    probe = draw(scalings(rope_type, 1)) if rope_type not in ("default", "longrope") else None
    scaled = None if probe is None or rope_type == "default" else RopeScaling.from_dict(probe)
    # LongRoPE served at its switch between the short and long factors: the original length, or one
    # past it (the longest position then is the original length itself: an engine that switches on a
    # position past it, not on the length, reads the long table's first row there).
    at_switch = draw(st.sampled_from((None, 1, 0, 2))) if rope_type == "longrope" else None
    if at_switch is not None:
        mpe = max(_ORIGINALS) + 2                  # sizes the width; the length is set once the original is drawn
    length = admitted_length(scaled, mpe) if rope_type != "longrope" else mpe
    length = max(2, min(length, MAX_ROWS))
    widest = max(2, min(128, MAX_ELEMENTS // length // 2))
    half = draw(st.integers(2 if rope_type != "longrope" else 1, widest).filter(lambda h: h >= 1))
    fields = draw(scalings(rope_type, half)) if rope_type in ("longrope", "proportional") else probe
    if at_switch is not None:
        length = fields["original_max_position"] + at_switch
    head = 2 * half if rope_type == "proportional" else 2 * half + 2 * draw(st.sampled_from((0, 0, 16)))
    if rope_type == "proportional" and int(fields["partial_rotary_factor"] * head // 2) < 1:
        fields["partial_rotary_factor"] = 1.0
    secs, layout = None, "chunked"
    if rope_type in ("yarn", "default") and half >= 3 and draw(st.booleans()):       # M-RoPE (with YaRN)
        secs = draw(_sections(half))
        layout = draw(st.sampled_from(("chunked", "interleaved")))
    spec = RopeSpec(head, 2 * half, is_neox_style=draw(st.booleans()), sections=secs, layout=layout,
                    base=draw(st.sampled_from(_BASES)), max_position=length, scaling=fields)
    rows = draw(st.one_of(st.just(length), st.integers(1, length)))
    return TableCase(spec, rows, draw(st.sampled_from(dtypes)), draw(st.integers(0, 2 ** 32)))
