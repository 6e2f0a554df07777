"""llama.cpp's ggml rope (rope/backends/ggml.py) and the bound for implementations that compute their
own angles (rope/harness/rotation/bound.py, ``own_angle_error``).  The drawn suite runs it as
``pytest --rope-impl ggml``; tests/backends/test_backends.py runs its bounded property and the
known-bug triggers.  Here: the bound is neither loose enough to pass a wrong map nor tight enough to
fail ggml's own float32 recurrence, and the IMROPE fourth-row divergence is pinned."""

from __future__ import annotations

import pytest
import torch

from rope.harness.rotation.check import exact_rotation
from rope.harness.rotation.bound import compare_rotation, own_angle_error
from rope.spec import RopeSpec

try:
    from rope.backends import ggml
except ImportError as exc:
    ggml, REASON = None, str(exc)
else:
    REASON = ""

needs_ggml = pytest.mark.skipif(ggml is None, reason=f"needs libggml-python: {REASON}")
QWEN3_VL = RopeSpec.interleaved(128, 128, (24, 20, 20), is_neox_style=True, base=5000000.0, max_position=1 << 20)


def _inputs(spec: RopeSpec, tokens: int, top: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, top, (spec.num_dims, tokens), generator=gen)
    query = torch.randn(tokens, 4 * spec.head_size, generator=gen)
    return positions, query


def _check(spec, positions, query, out):
    ref_q, _ = exact_rotation(spec, positions, query, None)
    return compare_rotation(spec, positions, query, None, torch.empty(1, spec.rotary_dim), out, None, ref_q, None,
                            "float32", angles="own-float32")


def _float32_recurrence(spec: RopeSpec, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's angles, written out: theta = p, then theta *= powf(base, -2 / d) per pair, in float32."""
    rows = positions.reshape(spec.num_dims, -1)[torch.tensor(spec.axis_map())].T.to(torch.float32)   # [T, F]
    scale = torch.tensor(spec.effective_base, dtype=torch.float32) ** torch.tensor(-2.0 / spec.rotary_dim)
    # Each row's theta starts at its position and is multiplied by scale once per pair (every row
    # steps at every pair; a pair reads the row its map gives it).
    theta = rows.clone()
    for i in range(1, spec.num_freqs):
        theta[:, i:] = theta[:, i:] * scale
    return theta.cos().to(torch.float64), theta.sin().to(torch.float64)


def test_own_angle_bound_admits_the_float32_recurrence_up_to_a_million():
    # The recurrence the bound is derived for, at positions up to 2^20: inside the bound.
    from reference.rotation import rotate_heads
    positions, query = _inputs(QWEN3_VL, 64, 1 << 20)
    cos, sin = _float32_recurrence(QWEN3_VL, positions)
    out = rotate_heads(QWEN3_VL, query, cos, sin).to(torch.float32)
    result = _check(QWEN3_VL, positions, query, out)
    assert result.ok, result.message("the float32 recurrence")


def test_own_angle_bound_rejects_a_shifted_angle():
    # One pair's angle off by 10 times its allowance at p < 4096: outside the bound.
    from reference.rotation import exact_cos_sin, rotate_heads
    spec = RopeSpec(64, 64, True, None, max_position=4096)
    positions, query = _inputs(spec, 16, 4096)
    positions = positions[0]
    cos, sin = exact_cos_sin(spec, positions)
    theta = torch.atan2(sin, cos)
    theta[:, 5] += 10 * own_angle_error(spec, positions)[:, 5]
    out = rotate_heads(spec, query, theta.cos(), theta.sin()).to(torch.float32)
    assert not _check(spec, positions, query, out).ok


@needs_ggml
@pytest.mark.parametrize("spec", [
    QWEN3_VL,
    RopeSpec(128, 64, True, (8, 12, 12), max_position=1 << 16),
    RopeSpec(128, 128, True, (16, 16, 16, 16), max_position=32768, ntk_alpha=1000.0),
    RopeSpec(64, 64, False, None, max_position=1 << 16),
], ids=["imrope-qwen3vl", "mrope-partial", "mrope-4rows-ntk", "1d-gptj"])
def test_ggml_matches_the_exact_angles(spec):
    positions, query = _inputs(spec, 32, spec.max_position)
    positions = positions if spec.num_dims > 1 else positions[0]
    out = ggml._rope(spec, query, ggml._position_rows(spec, positions))
    result = _check(spec, positions, query, out)
    assert result.ok, result.message(f"ggml {spec.variant()}")


@needs_ggml
def test_ggml_in_the_wrong_mode_is_caught():
    # IMROPE (the interleaved map) for a chunked spec: a wrong map the own-angle bound must not pass.
    spec = RopeSpec(128, 128, True, (24, 20, 20), max_position=4096)
    positions, query = _inputs(spec, 16, 4096)
    wrong = RopeSpec.interleaved(128, 128, (24, 20, 20), is_neox_style=True, max_position=4096)
    out = ggml._rope(wrong, query, ggml._position_rows(spec, positions))
    assert not _check(spec, positions, query, out).ok


@needs_ggml
def test_ggml_imrope_reads_a_fourth_row_past_three_sections():
    # Qwen3-VL's [24, 20, 20] over 64 pairs: IMROPE gives pairs 61 and 62 the fourth row, where the
    # model reads T.  With llama.cpp's image-token rows (fourth row 0) exactly those two pairs move.
    positions, query = _inputs(QWEN3_VL, 8, 4096)
    rows = ggml._position_rows(QWEN3_VL, positions)
    as_text = ggml._rope(QWEN3_VL, query, rows)
    rows[3] = 0                                                   # mtmd's set_position_mrope_2d
    as_image = ggml._rope(QWEN3_VL, query, rows)
    heads = (as_text - as_image).abs().reshape(8, 4, 128).amax(dim=(0, 1))
    moved = sorted({int(c) % 64 for c in torch.nonzero(heads > 0).flatten()})
    assert moved == [61, 62]
    assert _check(QWEN3_VL, positions, query, as_text).ok and not _check(QWEN3_VL, positions, query, as_image).ok


def test_own_angles_leave_an_infinity_s_sign_open_only_where_cos_or_sin_is():
    # 1-D, pair 1 (frequency 0.01; pair 0's angle is the position itself, exact in float32): a = +inf,
    # b = 1.  Token 0 at a position whose cos is within the float32 angle error of 0 (the sign of
    # cos, and of inf * cos, is not determined there); token 1 where it is far from 0.  Both
    # answered with the wrong-signed infinity: only token 1 is a mismatch.
    spec = RopeSpec(4, 4, True, None, max_position=1 << 20)
    every = torch.arange(1, 1 << 20)
    allowance = own_angle_error(spec, every)[:, 1]
    angle_cos = (every.to(torch.float64) * 10000.0 ** -0.5).cos().abs()
    ambiguous = int(every[angle_cos < 1e-3 * allowance][0])
    positions = torch.tensor([ambiguous, 3])
    query = torch.tensor([[1.0, float("inf"), 1.0, 1.0], [1.0, float("inf"), 1.0, 1.0]])
    ref_q, _ = exact_rotation(spec, positions, query, None)
    flipped = torch.where(torch.isinf(ref_q), -ref_q, ref_q).to(torch.float32)
    result = compare_rotation(spec, positions, query, None, torch.empty(1, 4), flipped, None, ref_q, None,
                              "float32", angles="own-float32")
    assert not result.ok and {m.token for m in result.worst if m.ratio == float("inf")} == {1}
