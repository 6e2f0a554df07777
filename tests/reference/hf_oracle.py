"""transformers' own rotary code as a weight-free oracle for ``reference.rotate`` (docs/spec.md §1-3).

For one model family this module builds the text config from a :class:`RopeSpec` (default-constructed
config class plus explicit RoPE fields: no weights, no hub), runs the family's rotary module for the
positions and then the family's own rotation function on q/k, exactly as the family's attention layer
does.  Shapes on the transformers side:

* ``position_ids``: int64 ``[rows, B, L]`` (3 rows for M-RoPE, 3 or 4 for HunYuanVL's XD-RoPE);
* ``query``/``key``: ``[B, heads, L, head_dim]``;
* cos/sin: ``[B, L, rotary_dim]``, or ``[rows, B, L, rotary_dim]`` where the release leaves the
  section recomposition to the rotation function (see below).

Which rotation function runs depends on the release, and is *detected*, never assumed:

* up to 5.16 (Qwen2-VL, Qwen2.5-VL, HunYuanVL; seen in 5.12.1 and 5.16.1) the rotary module returns
  one cos/sin per position row and ``apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section)``
  recomposes them;
* from 5.17 every family recomposes inside the rotary module (``recomposition_frequencies``) and the
  attention calls the plain ``apply_rotary_pos_emb``.

A module that returns per-row cos/sin in a release without ``apply_multimodal_rotary_pos_emb`` is an
error, not a skip.

The other half holds what the comparisons need beyond ``rope.harness.rotation.bound``: per-channel cos/sin maps
(canonical, per row, or any other row assignment), a bound for outputs that are not rotations (the
HunYuanVL block layout), and bitwise / element-wise assertions with the mismatch anatomy.
"""

from __future__ import annotations

import torch

# The family catalogue and runner live with the transformers adapter (rope/backends/transformers/rotation.py).
from rope.backends.transformers.rotation import (  # noqa: F401  (re-exported for the oracle tests)
    FAMILIES,
    KNOWN_MISMATCH_HUNYUAN_VL,
    MIN_TRANSFORMERS,
    TRANSFORMERS_VERSION,
    HFFamily,
    HFRotation,
    from_hf_heads,
    hf_rotate,
    text_config,
    to_hf_heads,
    unavailable_reason,
)
from rope.spec import RopeSpec
from rope.harness.rotation.bound import SUBNORMAL_SPACING, unit_roundoff, working_dtype


def canonical_channel_map(spec: RopeSpec, *, neox_order: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, frequency) of each rotary channel under the spec's axis map (docs/spec.md §2).

    ``neox_order``: channel c carries frequency c mod rotary_dim/2 (cos laid out cat(f, f)); else
    frequency c // 2 (cos laid out repeat_interleave(f, 2), the GPT-J order).
    """
    c = torch.arange(spec.rotary_dim)
    freqs = c % spec.num_freqs if neox_order else c // 2
    rows = torch.tensor(spec.axis_map(), dtype=torch.long)[freqs]
    return rows, freqs


def row_channel_map(spec: RopeSpec, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every channel from one position row, NeoX order: a per-row cos/sin of the <= 5.16 modules."""
    c = torch.arange(spec.rotary_dim)
    return torch.full_like(c, row), c % spec.num_freqs


def gather_channels(cache: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
                    freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin as float64 [T, rotary_dim]: channel c reads cache[positions[rows[c], t], freqs[c]].

    Args:
        cache: [max_position, rotary_dim] = cos | sin.  positions: [rows, T].
    """
    half = cache.shape[1] // 2
    cache = cache.to(torch.float64)
    pos = positions.long()[rows]                                # [rotary_dim, T]
    cos = cache[pos, freqs[:, None]].T                          # [T, rotary_dim]
    sin = cache[pos, half + freqs[:, None]].T
    return cos.contiguous(), sin.contiguous()


def partner_channels(spec: RopeSpec) -> torch.Tensor:
    """The other channel of each rotary channel's pair: NeoX c <-> c +- rd/2, GPT-J 2i <-> 2i+1."""
    c = torch.arange(spec.rotary_dim)
    if spec.is_neox_style:
        return (c + spec.num_freqs) % spec.rotary_dim
    return c ^ 1


def channel_bound(spec: RopeSpec, x: torch.Tensor, expected: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  precision: str) -> torch.Tensor:
    """float64 [T, heads*head_size]: largest legitimate |computed - expected| for a float64 output.

    ``rope.harness.rotation.bound.rotation_bound`` per channel, for outputs that need not be rotations (each channel
    has its own cos/sin, [T, rotary_dim]): with M = |x_c| |cos_c| + |x_partner| |sin_c| and working unit
    roundoff u (float64 output: no store rounding), bound = u (M + |expected|) + 3 u^2 M + eta.
    Pass-through channels get 0: they must be copied exactly.
    """
    u = unit_roundoff(working_dtype(precision, torch.float64))
    tokens = x.shape[0]
    heads = x.to(torch.float64).reshape(tokens, -1, spec.head_size).abs()
    ref = expected.to(torch.float64).reshape(heads.shape).abs()
    rd = spec.rotary_dim
    mag = heads[..., :rd] * cos.abs()[:, None, :] + heads[..., partner_channels(spec)] * sin.abs()[:, None, :]
    bound = torch.zeros_like(heads)
    bound[..., :rd] = u * (mag + ref[..., :rd]) + 3 * u * u * mag + SUBNORMAL_SPACING[torch.float64]
    return bound.reshape(x.shape)


# --------------------------------------------------------------------------------------- asserting
def _index(flat: int, shape) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def mismatch_report(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> tuple[int, str]:
    """(number of elements with |actual - expected| > bound, the fixed-anatomy description)."""
    diff = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    over = diff > bound
    count, total = int(over.sum()), over.numel()
    if total == 0:
        return 0, "empty tensors"
    ratio = diff / bound.clamp_min(torch.finfo(torch.float64).tiny)
    worst_abs = int(diff.argmax())
    worst_ratio = int(ratio.argmax())
    shape = tuple(diff.shape)
    text = (
        f"mismatched elements: {count} / {total} ({100.0 * count / total:.1f}%)\n"
        f"greatest absolute difference: {float(diff.flatten()[worst_abs]):.3e} at index "
        f"{_index(worst_abs, shape)} (allowed {float(bound.flatten()[worst_abs]):.3e})\n"
        f"greatest difference / allowance: {float(ratio.flatten()[worst_ratio]):.3g} at index "
        f"{_index(worst_ratio, shape)} (actual {float(actual.flatten()[worst_ratio]):.17g}, "
        f"expected {float(expected.flatten()[worst_ratio]):.17g})")
    return count, text


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, *, what: str) -> None:
    """Element-wise |actual - expected| <= bound, else an AssertionError with the mismatch anatomy."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    count, text = mismatch_report(actual, expected, bound)
    if count:
        raise AssertionError(f"{what}: not within the allowance\n{text}")


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, *, what: str) -> None:
    """Exact equality (values and shape), reporting the first differing element."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    differ = actual != expected
    if differ.any():
        first = _index(int(differ.flatten().nonzero()[0]), tuple(actual.shape))
        raise AssertionError(
            f"{what}: not bit-identical\nmismatched elements: {int(differ.sum())} / {differ.numel()}\n"
            f"first at index {first}: actual {float(actual[first]):.17g}, expected {float(expected[first]):.17g}")
