"""The reference cos/sin table of a rope config, in float64 (docs/spec.md §1).

One function per rope type turns the spec's base and scaling into the inverse frequencies; one
gives the magnitude (the attention factor, YaRN's mscale) the table's cos and sin are multiplied
by; :func:`cos_sin_table` puts them together.  Everything is float64 and follows the formulas as
written in §1, with their sources there: the harness holds rope/cache.py's float32 table (what an
engine builds) to this one, and this one to transformers' ROPE_INIT_FUNCTIONS
(tests/reference/test_table_oracle.py).

The table is for a sequence length: dynamic NTK grows its base past the original length, and
LongRoPE switches from its short to its long factors there.  The length is the spec's max_position
(the positions the engine admits) unless ``seq_len`` says otherwise.
"""

from __future__ import annotations

import math

import torch

from rope.spec import RopeSpec

__all__ = ["attention_factor", "cos_sin_table", "inv_freq", "yarn_ramp_bounds"]

F64 = torch.float64


def _exponents(spec: RopeSpec) -> torch.Tensor:
    """2i / R for i = 0 .. R/2 - 1, float64."""
    return torch.arange(0, spec.rotary_dim, 2, dtype=F64) / spec.rotary_dim


def _plain(spec: RopeSpec, base: float | None = None) -> torch.Tensor:
    """base ** -(2i / R), the unscaled frequencies (the effective base: XD-RoPE's NTK-alpha applied)."""
    return float(spec.effective_base if base is None else base) ** -_exponents(spec)


def _linear(spec: RopeSpec, seq_len: int) -> torch.Tensor:
    # Position interpolation: every frequency divided by the factor (positions p / s).
    return _plain(spec) / spec.scaling.factor


def _dynamic(spec: RopeSpec, seq_len: int) -> torch.Tensor:
    # NTK-aware base growth at the sequence length L (never below the original length L0):
    # base' = base * (s * L / L0 - (s - 1)) ** (R / (R - 2)).
    s, rd = spec.scaling, spec.rotary_dim
    length = max(seq_len, s.original_max_position)
    grown = spec.base * (s.factor * length / s.original_max_position - (s.factor - 1)) ** (rd / (rd - 2))
    return _plain(spec, grown)


def _ntk(spec: RopeSpec, seq_len: int) -> torch.Tensor:
    # vLLM's fixed NTK: base' = base * s and one more division by s ** (2 / R), so frequency i is
    # base ** (-2i/R) * s ** (-(2i + 2) / R).  Mixed NTK (mixed_b = b): base ** (-2i/R) divided by
    # exp(a * (i + 1) ** b), a = ln(s) / (R/2) ** b.
    s, rd = spec.scaling, spec.rotary_dim
    if s.mixed_b is None:
        return _plain(spec, spec.base * s.factor) / s.factor ** (2 / rd)
    a = math.log(s.factor) / (rd / 2) ** s.mixed_b
    i1 = torch.arange(1, rd // 2 + 1, dtype=F64)
    return _plain(spec) / torch.exp(a * i1 ** s.mixed_b)


def yarn_ramp_bounds(spec: RopeSpec) -> tuple[float, float]:
    """YaRN's (low, high): the frequencies below low keep their value (they turn more than
    beta_fast times over the original length), those above high are divided by the factor (fewer
    than beta_slow turns); in between a linear ramp.  Dimension d turns L0 / (2 pi base ** (2d/R))
    times, so the frequency index that turns n times is R ln(L0 / (2 pi n)) / (2 ln base).  Truncated
    (the default) rounds low down and high up; both are clamped to [0, R - 1]."""
    s, rd = spec.scaling, spec.rotary_dim

    def index_turning(n: float) -> float:
        return rd * math.log(s.original_max_position / (n * 2 * math.pi)) / (2 * math.log(spec.base))

    low, high = index_turning(s.beta_fast), index_turning(s.beta_slow)
    if s.truncate is not False:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rd - 1)


def _yarn(spec: RopeSpec, seq_len: int) -> torch.Tensor:
    # Blend of the kept (extrapolated) and the divided (interpolated) frequencies by the ramp
    # r(i) = clamp((i - low) / (high - low), 0, 1): r = 0 keeps base ** (-2i/R), r = 1 divides it by s.
    low, high = yarn_ramp_bounds(spec)
    if low == high:
        high += 0.001                 # one-point ramp: the upstream implementations' nudge
    i = torch.arange(spec.num_freqs, dtype=F64)
    ramp = ((i - low) / (high - low)).clamp(0, 1)
    kept = _plain(spec)
    return kept * (1 - ramp) + (kept / spec.scaling.factor) * ramp


def _llama3(spec: RopeSpec, seq_len: int) -> torch.Tensor:
    # By wavelength w = 2 pi / f against the original length L0: w < L0 / high_freq_factor keeps f;
    # w > L0 / low_freq_factor divides it by s; in between, with t = (L0 / w - low) / (high - low),
    # f' = (1 - t) f / s + t f.
    s = spec.scaling
    f = _plain(spec)
    w = 2 * math.pi / f
    t = (s.original_max_position / w - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - t) * f / s.factor + t * f
    out = torch.where(w > s.original_max_position / s.low_freq_factor, f / s.factor, blended)
    return torch.where(w < s.original_max_position / s.high_freq_factor, f, out)


def _longrope(spec: RopeSpec, seq_len: int) -> torch.Tensor:
    # Frequency i divided by the long factor when the sequence is longer than the original length,
    # by the short factor otherwise.
    s = spec.scaling
    factors = s.long_factor if seq_len > s.original_max_position else s.short_factor
    return _plain(spec) / torch.tensor(factors, dtype=F64)


def _proportional(spec: RopeSpec, seq_len: int) -> torch.Tensor:
    # Gemma 4: the whole head's D/2 frequencies base ** (-2i/D), of which the first
    # floor(p * D / 2) rotate and the rest are 0 (cos 1, sin 0: those pairs pass through); all
    # divided by the factor.  Pairs are (i, i + D/2), not a prefix of the head.
    s = spec.scaling
    rotating = int(s.partial_rotary_factor * spec.head_size // 2)
    f = _plain(spec)
    f[rotating:] = 0.0
    return f / s.factor


_INV_FREQ = {"linear": _linear, "dynamic": _dynamic, "ntk": _ntk, "yarn": _yarn, "deepseek_yarn": _yarn,
             "llama3": _llama3, "longrope": _longrope, "proportional": _proportional}


def inv_freq(spec: RopeSpec, seq_len: int | None = None) -> torch.Tensor:
    """float64 [rotary_dim/2]: the inverse frequencies of the spec's rope config at ``seq_len``
    (default: spec.max_position)."""
    if spec.scaling is None:
        return _plain(spec)
    return _INV_FREQ[spec.scaling.rope_type](spec, spec.max_position if seq_len is None else seq_len)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude 0.1 * mscale * ln(s) + 1 (1 for s <= 1; the paper's Eq. 21)."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(spec: RopeSpec, seq_len: int | None = None) -> float:
    """The magnitude cos and sin are multiplied by: 1 for most types; yarn: the config's
    attention_factor, else mscale(s, mscale) / mscale(s, mscale_all_dim) where both are given
    (and non-zero), else mscale(s); deepseek_yarn: mscale(s, mscale) / mscale(s, mscale_all_dim);
    longrope: the config's attention_factor, else sqrt(1 + ln s / ln L0) for s > 1."""
    s = spec.scaling
    if s is None or s.rope_type not in ("yarn", "deepseek_yarn", "longrope"):
        return 1.0
    if s.attention_factor is not None:
        return float(s.attention_factor)
    if s.rope_type == "deepseek_yarn":
        return float(_yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim))
    if s.rope_type == "yarn":
        if s.mscale and s.mscale_all_dim:
            return float(_yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim))
        return _yarn_mscale(s.factor)
    if s.factor <= 1:
        return 1.0
    return math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_position))


def cos_sin_table(spec: RopeSpec, rows: int | None = None, seq_len: int | None = None) -> torch.Tensor:
    """float64 [rows, rotary_dim] (default rows: spec.max_position): row p is
    ``m * [cos(p f_0) .. cos(p f_{F-1}) | sin(p f_0) .. sin(p f_{F-1})]``, f = :func:`inv_freq`,
    m = :func:`attention_factor`, both at ``seq_len`` (default spec.max_position)."""
    rows = spec.max_position if rows is None else rows
    freqs = torch.arange(rows, dtype=F64)[:, None] * inv_freq(spec, seq_len)[None, :]
    m = attention_factor(spec, seq_len)
    return torch.cat((freqs.cos() * m, freqs.sin() * m), dim=-1)
