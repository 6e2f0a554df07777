"""Hand-written buggy rotations, each one slip a kernel author makes, with the diagnosis label each
must get (rope.harness.rotation.diagnosis) and a fixed case on which it fails.

A case module, not a test module: tests/harness/test_handwritten_bugs.py checks each bug on its
fixed case, and ``python -m tests.harness.diagnosis_accuracy`` measures, over the rotation
properties' drawn cases, the share of each bug's failures that carry its label (docs/mutation.md).

Every bug is the plain-torch kernel :func:`_rotate` with one slip switched on; like a user's kernel
it runs 1-D RoPE and the chunked and interleaved maps, and declares the other maps unsupported.
All take the registry signature ``fn(spec, positions, query, key, cos_sin_cache)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from properties.strategies import RotationCase
from rope.spec import RopeSpec

__all__ = ["BUGS", "CORRECT", "Bug"]


def _axis(spec: RopeSpec, slips: frozenset) -> torch.Tensor:
    """The position row of each frequency: chunked by the cumulative section bounds, interleaved
    T H W T H W up to 3*s of each row."""
    half = spec.num_freqs
    freq = torch.arange(half)
    if spec.sections is None or len(spec.sections) == 1:
        return torch.zeros(half, dtype=torch.long)
    n = len(spec.sections)
    if spec.layout == "interleaved":
        rows = freq % n
        bounded = torch.tensor([0] + [3 * s for s in spec.sections[1:]])
        axis = torch.where(freq < bounded[rows], rows, 0)
        if "interleaved_lanes_t_w_h" in slips and n == 3:
            axis = torch.tensor([0, 2, 1])[axis]            # the lanes' rows written T W H
        return axis
    bounds = torch.tensor(spec.sections).cumsum(0)
    return torch.bucketize(freq, bounds, right="bucketize_default_right" not in slips)


def _rows(spec: RopeSpec, positions: torch.Tensor, slips: frozenset) -> torch.Tensor:
    rows = positions.reshape(spec.num_dims, -1)
    if "h_w_rows_swapped" in slips and spec.num_dims >= 3:
        rows = rows[[0, 2, 1, *range(3, spec.num_dims)]]
    if "rows_as_row_zero" in slips:
        rows = rows[:1].expand_as(rows)
    return rows


def _rotate_one(spec: RopeSpec, positions, x, cache, slips: frozenset, num_heads: int | None = None):
    """x [T, H * head_size] rotated (only its first ``num_heads`` heads when given), in float32."""
    if x is None:
        return None
    tokens, hs, rd, half = x.shape[0], spec.head_size, spec.rotary_dim, spec.num_freqs
    picked = _rows(spec, positions, slips)[_axis(spec, slips)].T           # [T, half]: the position of freq i
    freq = torch.arange(half)
    cos = cache[picked, freq].float()[:, None, :]
    sin = cache[picked, half + freq].float()[:, None, :]
    if "cos_sin_swapped" in slips:
        cos, sin = sin, cos
    if "sin_sign_flipped" in slips:
        sin = -sin
    heads = x.reshape(tokens, x.shape[1] // hs, hs).float()
    out = torch.zeros_like(heads) if "pass_through_not_copied" in slips else heads.clone()
    neox = spec.is_neox_style != ("pairing_inverted" in slips)
    if neox:
        # 1. NeoX pairs (i, i + rotary_dim/2); the slip takes head_size/2 as the partner offset.
        partner = hs // 2 if "partner_at_head_half" in slips else half
        a_idx, b_idx = freq, freq + partner
    else:
        a_idx, b_idx = 2 * freq, 2 * freq + 1                                  # 2. GPT-J pairs (2i, 2i + 1)
    a, b = heads[..., a_idx], heads[..., b_idx]
    limit = tokens - 1 if "last_token_skipped" in slips else tokens          # 3. the token loop bound
    h = heads.shape[1] if num_heads is None else min(num_heads, heads.shape[1])
    out[:limit, :h, a_idx] = (a * cos - b * sin)[:limit, :h]
    out[:limit, :h, b_idx] = (b * cos + a * sin)[:limit, :h]
    if "pass_through_not_copied" in slips:
        out[..., rd:] = 0.0
    return out.to(x.dtype).reshape(x.shape)


def _kernel(*slips: str):
    slips = frozenset(slips)

    def rotate(spec, positions, query, key, cos_sin_cache):
        kv_heads = None if key is None else key.shape[1] // spec.head_size
        q_heads = kv_heads if "head_loop_bound_kv" in slips else None
        q = _rotate_one(spec, positions, query, cos_sin_cache, slips, q_heads)
        if "key_left_unrotated" in slips:
            _rotate_one(spec, positions, key, cos_sin_cache, slips)          # rotated into a copy, then dropped
            return q, key
        return q, _rotate_one(spec, positions, key, cos_sin_cache, slips)
    rotate.working_precision = "float32"
    rotate.unsupported_reason = _unsupported
    return rotate


def _unsupported(spec: RopeSpec, dtype, device) -> str | None:
    if spec.sections is not None and len(spec.sections) > 1 and spec.layout not in ("chunked", "interleaved"):
        return "chunked and interleaved maps only"
    return None


@dataclass(frozen=True)
class Bug:
    """A hand-written bug: its kernel, the label its failures must get, what the slip is, and a
    fixed case on which it fails."""
    fn: object
    label: str
    slip: str
    case: RotationCase


_GLM = RopeSpec(128, 64, False, (8, 12, 12), "chunked", max_position=4096)           # GPT-J, partial
_QWEN2_VL = RopeSpec(128, 128, True, (16, 24, 24), "chunked", max_position=4096)
_QWEN3_VL = RopeSpec(128, 128, True, (24, 20, 20), "interleaved", base=5000000.0, max_position=4096)
_PARTIAL_NEOX = RopeSpec(128, 64, True, (8, 12, 12), "chunked", max_position=4096)


def _case(spec, seed, tokens=6, q_heads=4, kv_heads=2, dtype="float32", positions="uniform"):
    return RotationCase(spec, tokens, q_heads, kv_heads, dtype, positions, False, seed)


# name -> Bug; each a different slip.
BUGS = {
    "bucketize_default_right": Bug(
        _kernel("bucketize_default_right"), "section_boundary_shifted",
        "chunked map by torch.bucketize(freq, cumsum(sections)) with its default right=False",
        _case(_QWEN2_VL, 1, positions="grid")),
    "last_token_skipped": Bug(
        _kernel("last_token_skipped"), "token_subset", "the token loop stops one short: range(num_tokens - 1)",
        _case(_GLM, 2)),
    "sin_sign_flipped": Bug(
        _kernel("sin_sign_flipped"), "cos_sin_misused", "x1*cos + x2*sin, x2*cos - x1*sin: a rotation by -theta",
        _case(_GLM, 3)),
    "cos_sin_swapped": Bug(
        _kernel("cos_sin_swapped"), "cos_sin_misused", "cos read from the sin half of the cache row and the reverse",
        _case(_QWEN2_VL, 4)),
    "head_loop_bound_kv": Bug(
        _kernel("head_loop_bound_kv"), "head_subset", "the query's head loop bounded by the key's head count (GQA)",
        _case(_GLM, 5, q_heads=4, kv_heads=1)),
    "pairing_inverted": Bug(
        _kernel("pairing_inverted"), "pairing_swapped", "is_neox_style read the wrong way round",
        _case(_GLM, 6)),
    "h_w_rows_swapped": Bug(
        _kernel("h_w_rows_swapped"), "position_rows_swapped", "the H and W position rows read in each other's place",
        _case(_QWEN2_VL, 7)),
    "partner_at_head_half": Bug(
        _kernel("partner_at_head_half"), "partial_rotary_stride",
        "partial rotary NeoX pairs frequency i with channel i + head_size/2, not i + rotary_dim/2",
        _case(_PARTIAL_NEOX, 8)),
    "interleaved_lanes_t_w_h": Bug(
        _kernel("interleaved_lanes_t_w_h"), "position_rows_swapped",
        "interleaved lanes read the rows in T W H order: the H lanes (below 3*s_h) read W, the W lanes H",
        _case(_QWEN3_VL, 9)),
    "key_left_unrotated": Bug(
        _kernel("key_left_unrotated"), "key_only", "the key rotated into a copy and the input returned",
        _case(_GLM, 10)),
    "pass_through_not_copied": Bug(
        _kernel("pass_through_not_copied"), "pass_through_touched",
        "the output allocated with zeros and only the rotary channels written",
        _case(_GLM, 11)),
    "rows_as_row_zero": Bug(
        _kernel("rows_as_row_zero"), "position_rows_misread", "every frequency reads position row 0 (1-D positions)",
        _case(_QWEN2_VL, 12)),
}

# The same kernel without a slip: it matches the reference (the bugs above differ from it by one slip).
CORRECT = _kernel()
