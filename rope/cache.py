"""The cos/sin cache (docs/spec.md §1), exactly the float32 recipe serving engines use.

``cache[p] = [cos(p * inv_freq) | sin(p * inv_freq)]`` with
``inv_freq[i] = base ** -(2i / rotary_dim)``, everything in float32 on the CPU, then cast
to the activation dtype.  Implementations and the reference consume this very (rounded)
cache, so the only legitimate differences between them are the implementations' rounding.
Built on the CPU and moved, so it is bit-identical on every device.

A spec with a scaling (``spec.scaling``) gets its rope type's inverse frequencies, computed in
float32 in the order transformers' ROPE_INIT_FUNCTIONS and vLLM's rotary_embedding package
compute them (one function per type below), at the sequence length ``spec.max_position`` (dynamic
NTK's base, LongRoPE's short or long factors), and its attention factor (YaRN's mscale, LongRoPE's
magnitude) multiplied into cos and sin in float32 before the cast, as both do.
"""

from __future__ import annotations

import functools
import math

import torch

from rope.spec import RopeSpec

__all__ = ["attention_factor", "axis_table", "cos_sin_cache", "inv_freq"]


def _plain(base: float, rd: int) -> torch.Tensor:
    """float32 base ** -(2i / rd), the engines' recipe: 1 / base ** (arange(0, rd, 2) / rd)."""
    return 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))


def _linear(spec: RopeSpec) -> torch.Tensor:
    # transformers divides inv_freq by the factor; vLLM divides the positions (docs/spec.md §1).
    return _plain(spec.base, spec.rotary_dim) / spec.scaling.factor


def _dynamic(spec: RopeSpec) -> torch.Tensor:
    s, rd = spec.scaling, spec.rotary_dim
    length = max(spec.max_position, s.original_max_position)
    base = spec.base * ((s.factor * length / s.original_max_position) - (s.factor - 1)) ** (rd / (rd - 2))
    return _plain(base, rd)


def _ntk(spec: RopeSpec) -> torch.Tensor:
    s, rd = spec.scaling, spec.rotary_dim
    if s.mixed_b is None:
        return _plain(spec.base * s.factor, rd) / s.factor ** (2 / rd)
    a = torch.tensor(s.factor).log() / (rd / 2) ** s.mixed_b
    return _plain(spec.base, rd) / (a * torch.arange(1, rd // 2 + 1).float() ** s.mixed_b).exp()


def _yarn_bounds(spec: RopeSpec) -> tuple[float, float]:
    s, rd, base = spec.scaling, spec.rotary_dim, spec.base

    def index_turning(turns: float) -> float:
        return (rd * math.log(s.original_max_position / (turns * 2 * math.pi))) / (2 * math.log(base))

    low, high = index_turning(s.beta_fast), index_turning(s.beta_slow)
    if s.truncate is not False:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rd - 1)


def _yarn(spec: RopeSpec) -> torch.Tensor:
    s, rd = spec.scaling, spec.rotary_dim
    pos_freqs = spec.base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)
    low, high = _yarn_bounds(spec)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(rd // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    kept = 1 - ramp
    return interpolation * (1 - kept) + extrapolation * kept


def _llama3(spec: RopeSpec) -> torch.Tensor:
    s = spec.scaling
    f = _plain(spec.base, spec.rotary_dim)
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / f
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    return torch.where(wavelen < high_wavelen, f,
                       torch.where(wavelen > low_wavelen, f / s.factor, (1 - smooth) * f / s.factor + smooth * f))


def _longrope(spec: RopeSpec) -> torch.Tensor:
    s, rd = spec.scaling, spec.rotary_dim
    factors = s.long_factor if spec.max_position > s.original_max_position else s.short_factor
    ext = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext * spec.base ** (torch.arange(0, rd, 2, dtype=torch.int64).float() / rd))


def _proportional(spec: RopeSpec) -> torch.Tensor:
    s, head = spec.scaling, spec.head_size
    rotating = int(s.partial_rotary_factor * head // 2)
    f = 1.0 / (spec.base ** (torch.arange(0, 2 * rotating, 2, dtype=torch.float32) / head))
    f = torch.cat((f, torch.zeros(head // 2 - rotating, dtype=torch.float32)))
    return f / s.factor


_SCALED = {"linear": _linear, "dynamic": _dynamic, "ntk": _ntk, "yarn": _yarn, "deepseek_yarn": _yarn,
           "llama3": _llama3, "longrope": _longrope, "proportional": _proportional}


def inv_freq(spec: RopeSpec) -> torch.Tensor:
    """float32 [rotary_dim/2]: base' ** -(2i / rotary_dim), or the spec's scaled frequencies."""
    if spec.scaling is not None:
        return _SCALED[spec.scaling.rope_type](spec)
    rd = spec.rotary_dim
    return 1.0 / (spec.effective_base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(spec: RopeSpec) -> float:
    """The magnitude the cache's cos and sin are multiplied by (1.0 unless yarn, deepseek_yarn or
    longrope), computed in Python floats as transformers and vLLM do."""
    s = spec.scaling
    if s is None or s.rope_type not in ("yarn", "deepseek_yarn", "longrope"):
        return 1.0
    if s.attention_factor is not None:
        return float(s.attention_factor)
    if s.rope_type == "deepseek_yarn" or (s.mscale and s.mscale_all_dim):
        return float(_mscale(s.factor, s.mscale) / _mscale(s.factor, s.mscale_all_dim))
    if s.rope_type == "yarn":
        return float(_mscale(s.factor))
    return 1.0 if s.factor <= 1.0 else math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_position))


def cos_sin_cache(spec: RopeSpec, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """[spec.max_position, rotary_dim] = cos | sin, cast to ``dtype`` and moved to ``device``."""
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec={spec!r}: must be a RopeSpec")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r}: must be a floating torch.dtype")
    t = torch.arange(spec.max_position, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq(spec))
    cos, sin = freqs.cos(), freqs.sin()
    scale = attention_factor(spec)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    cache = torch.cat((cos, sin), dim=-1)
    return cache.to(dtype=dtype).to(device)


@functools.lru_cache(maxsize=256)
def axis_table(axis_map: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A spec's axis map (``RopeSpec.axis_map()``) as an int64 tensor on ``device``, built once per
    (map, device): the native path gathers with it and the Triton kernel reads its rows from it, and
    neither copies it to the device per call (create it before capturing a CUDA graph: a warm-up
    call does)."""
    return torch.tensor(axis_map, dtype=torch.int64, device=device)
