"""Implementations that compute their own float32 angles (``angles = "own-float32"``) are held to the
exact float64 angles, scaled specs and positions past 2^17 included: one whose sine and cosine reduce
the argument exactly passes; one that reduces it as fast-math ``__sinf`` does fails, at 2^17 and
already at 4096 (properties/mutants/own_angles.py)."""

from __future__ import annotations

import dataclasses

import pytest

from properties.mutants.own_angles import fast_math_angles, range_reduced_angles
from properties.rotation.scaled_cases import model_scaled_cases
from rope.harness.rotation.check import compare_case
from rope.harness.rotation.cases import RotationCase
from rope.spec import RopeSpec

SCALED = model_scaled_cases(dtype="float32", cache_dtype="float32")
PLAIN_LONG = RotationCase(spec=RopeSpec(64, 64, True, None, base=10000.0, max_position=1 << 20), num_tokens=6,
                          num_q_heads=2, num_kv_heads=1, dtype="float32", positions_kind="last_row", seed=3)
PLAIN_AT = {rows: dataclasses.replace(PLAIN_LONG, spec=dataclasses.replace(PLAIN_LONG.spec, max_position=rows))
            for rows in (4097, 131072)}


@pytest.mark.parametrize("case", [PLAIN_LONG, *SCALED.values()], ids=["plain-2^20", *SCALED])
def test_range_reduced_float32_angles_pass(case):
    comparison = compare_case("range_reduced_angles", range_reduced_angles, case, "cpu")
    assert comparison.ok, comparison.message(case.brief())


@pytest.mark.parametrize("rows", sorted(PLAIN_AT), ids=lambda rows: f"positions-to-{rows - 1}")
def test_fast_math_angles_fail(rows):
    comparison = compare_case("fast_math_angles", fast_math_angles, PLAIN_AT[rows], "cpu")
    assert not comparison.ok
    # Caught at pair 0, whose float32 angle is exact: the error is the reduction's alone.
    assert any(m.channel in (0, 32) for m in comparison.worst), comparison.message()
