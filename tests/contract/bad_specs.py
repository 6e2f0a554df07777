"""Bad specs, each with the message its ValueError must carry (a case module: tests/contract/test_spec.py
holds RopeSpec to them, tests/suite/test_suite_can_fail.py shows the table fails on a spec without a rule)."""

from __future__ import annotations

import re

import pytest

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
    # The other maps (rope/row_maps.py): row counts, Ernie's s_h == s_w, the two-row counts.
    (dict(head_size=64, rotary_dim=64, sections=(16, 8, 8), layout="glm_round_robin", freq_rows=(0,) * 32),
     r"freq_rows: given with layout='glm_round_robin'"),
    (dict(head_size=64, rotary_dim=64, sections=(8, 8, 8, 8), layout="glm_round_robin"),
     r"sections=.*layout='glm_round_robin' needs exactly 3 rows"),
    (dict(head_size=64, rotary_dim=64, sections=(10, 12, 10), layout="ernie45"),
     re.escape("sections=(10, 12, 10): layout='ernie45' needs s_h == s_w in (s_h, s_w, s_t) (got 10 and 12)")),
    (dict(head_size=64, rotary_dim=64, sections=(20, 12), layout="two_row_interleaved"),
     re.escape("sections=(20, 12): layout='two_row_interleaved' gives the rows (16, 16) frequencies")),
    (dict(head_size=8, rotary_dim=8, sections=(2, 2), layout="custom"), r"freq_rows=None: layout='custom' needs"),
    (dict(head_size=8, rotary_dim=8, sections=(2, 2), layout="custom", freq_rows=(0, 1, 0)),
     r"freq_rows: has 3 entries, must have rotary_dim/2 = 4"),
    (dict(head_size=8, rotary_dim=8, sections=(2, 2), layout="custom", freq_rows=(0, 1, 2, 0)),
     re.escape("freq_rows[2]=2: must be a row index in [0, 2)")),
    (dict(head_size=8, rotary_dim=8, sections=(2, 2), layout="custom", freq_rows=(0, 1, True, 0)),
     re.escape("freq_rows[2]=True: must be a row index")),
    (dict(head_size=8, rotary_dim=8, sections=(2, 2), layout="custom", freq_rows=(0, 1, 1, 1)),
     re.escape("sections=(2, 2): must be the rows' frequency counts in freq_rows (1, 3)")),
    (dict(head_size=8, rotary_dim=8, sections=(2, 2), layout="custom", freq_rows="0101"),
     r"freq_rows='0101': must be a sequence of ints or None"),
    (dict(head_size=8, rotary_dim=8, sections=(2, 2), layout=["custom"]), r"layout=\['custom'\]: must be one of"),
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


def assert_bad_spec_raises(kwargs: dict, pattern: str) -> None:
    """``RopeSpec(**kwargs)`` raises a ValueError matching ``pattern``."""
    with pytest.raises(ValueError, match=pattern):
        RopeSpec(**kwargs)
