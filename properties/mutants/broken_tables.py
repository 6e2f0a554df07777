"""Table implementations with one shipped bug each (``fn(spec, max_position, dtype, device) -> cache``).

Each mutant is rope.cache's float32 recipe with one rule written the way an engine once wrote it;
the table's properties (properties/table/test_table.py) must reject every one of them from the
drawn cases alone.  Selected with ``--rope-table-impl properties.mutants.broken_tables:<name>``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from rope import cache
from rope.spec import RopeSpec
from rope.table import check_table_call


def _table(spec: RopeSpec, max_position: int, dtype, device, *, inv_freq=None, factor=None) -> torch.Tensor:
    """rope.cache's recipe with the frequencies and the attention factor given (default: its own)."""
    check_table_call(spec, max_position, dtype)
    f = cache.inv_freq(spec) if inv_freq is None else inv_freq
    m = cache.attention_factor(spec) if factor is None else factor
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32), f)
    cos, sin = angles.cos(), angles.sin()
    if m != 1.0:
        cos, sin = cos * m, sin * m
    return torch.cat((cos, sin), dim=-1).to(dtype=dtype).to(device)


def _with_scaling(spec: RopeSpec, **changes) -> RopeSpec:
    """The spec with its scaling's fields replaced, past RopeScaling's validation (the bug's own values)."""
    scaling = spec.scaling
    fresh = object.__new__(type(scaling))
    for f in dataclasses.fields(scaling):
        object.__setattr__(fresh, f.name, changes.get(f.name, getattr(scaling, f.name)))
    out = object.__new__(RopeSpec)
    for f in dataclasses.fields(RopeSpec):
        object.__setattr__(out, f.name, fresh if f.name == "scaling" else getattr(spec, f.name))
    return out


def reference_table(spec, max_position, dtype, device="cpu"):
    """rope.cache's table (the built-in "ours"): the unmutated parent every mutant here is confirmed against."""
    return _table(spec, max_position, dtype, device)


def mscale_dropped(spec, max_position, dtype, device="cpu"):
    """The attention factor (YaRN's mscale, LongRoPE's magnitude) never multiplied into cos and sin."""
    return _table(spec, max_position, dtype, device, factor=1.0)


def mscale_twice(spec, max_position, dtype, device="cpu"):
    """The attention factor multiplied into the table, and once more where the table is handed on."""
    return _table(spec, max_position, dtype, device, factor=cache.attention_factor(spec) ** 2)


def beta_swapped(spec, max_position, dtype, device="cpu"):
    """YaRN's beta_fast and beta_slow swapped: the ramp runs from the slow bound to the fast one."""
    s = spec.scaling
    if s is None or s.rope_type not in ("yarn", "deepseek_yarn"):
        return _table(spec, max_position, dtype, device)
    return _table(spec, max_position, dtype, device,
                  inv_freq=cache.inv_freq(_with_scaling(spec, beta_fast=s.beta_slow, beta_slow=s.beta_fast)))


def llama3_factors_swapped(spec, max_position, dtype, device="cpu"):
    """Llama 3's low_freq_factor and high_freq_factor swapped: the band's edges and its blend inverted."""
    s = spec.scaling
    if s is None or s.rope_type != "llama3":
        return _table(spec, max_position, dtype, device)
    return _table(spec, max_position, dtype, device, inv_freq=cache.inv_freq(_with_scaling(
        spec, low_freq_factor=s.high_freq_factor, high_freq_factor=s.low_freq_factor)))


def original_max_ignored(spec, max_position, dtype, device="cpu"):
    """The pretraining length taken from the table's own length: YaRN's ramp, Llama 3's band and dynamic
    NTK's growth computed against max_position instead of original_max_position."""
    s = spec.scaling
    if s is None or s.original_max_position is None or s.rope_type == "longrope":
        return _table(spec, max_position, dtype, device)
    return _table(spec, max_position, dtype, device,
                  inv_freq=cache.inv_freq(_with_scaling(spec, original_max_position=spec.max_position)))


def dynamic_at_original_length(spec, max_position, dtype, device="cpu"):
    """Dynamic NTK's base grown for the original length (never grown) where the admitted length is longer."""
    s = spec.scaling
    if s is None or s.rope_type != "dynamic":
        return _table(spec, max_position, dtype, device)
    short = dataclasses.replace(spec, max_position=s.original_max_position)
    return _table(spec, max_position, dtype, device, inv_freq=cache.inv_freq(short))


def proportional_as_prefix(spec, max_position, dtype, device="cpu"):
    """Gemma 4's proportional RoPE read as ordinary partial rotary: the rotating frequencies' exponents
    over the rotating width (2i / (p D)) instead of the whole head's (2i / D)."""
    s = spec.scaling
    if s is None or s.rope_type != "proportional":
        return _table(spec, max_position, dtype, device)
    rotating = int(s.partial_rotary_factor * spec.head_size // 2)
    f = 1.0 / (spec.base ** (torch.arange(0, 2 * rotating, 2, dtype=torch.float32) / (2 * rotating)))
    f = torch.cat((f, torch.zeros(spec.head_size // 2 - rotating, dtype=torch.float32))) / s.factor
    return _table(spec, max_position, dtype, device, inv_freq=f)


def inv_freq_bf16(spec, max_position, dtype, device="cpu"):
    """The inverse frequencies rounded to bfloat16 before the product (built in the activation dtype)."""
    return _table(spec, max_position, dtype, device, inv_freq=cache.inv_freq(spec).to(torch.bfloat16).float())


def cache_shorter_than_admitted(spec, max_position, dtype, device="cpu"):
    """The cache sized for the unscaled length while max_position_embeddings x factor positions are admitted
    (vllm#55910: NTK's cache): max_position / factor rows."""
    s = spec.scaling
    factor = 1.0 if s is None or s.factor is None else s.factor
    rows = max(1, min(max_position, math.ceil(max_position / factor))) if factor > 1 else max_position
    return _table(spec, rows, dtype, device)


def rounded_to_activation_dtype(spec, max_position, dtype, device="cpu"):
    """The table rounded to bfloat16 (the activation dtype) where the engine hands the kernel float32."""
    return _table(spec, max_position, torch.bfloat16, device).to(dtype)


BROKEN_TABLES = {fn.__name__: fn for fn in (
    mscale_dropped, mscale_twice, beta_swapped, llama3_factors_swapped, original_max_ignored,
    dynamic_at_original_length, proportional_as_prefix, inv_freq_bf16, cache_shorter_than_admitted,
    rounded_to_activation_dtype)}
