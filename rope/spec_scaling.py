"""RopeScaling: the scaling of a rope config's frequency table, one frozen record per rope type
(docs/spec.md §1: the formulas, their sources, and what each engine does with them).

The record holds the parameters exactly as a model's config names them, validated at construction
(``ValueError`` naming the field, in the ``<field>=<value>: <rule> (<actual>)`` form); what the
parameters mean for a spec's width (a LongRoPE list's length, proportional RoPE's whole-head
pairing) is checked by ``RopeSpec``, which holds the record as ``scaling``.  The record itself
computes nothing: the float32 table is rope/cache.py's, the float64 one reference/table.py's.

Imports nothing of the project (rope.spec imports it, and the spec imports nothing else).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = ["PARAMETERS", "ROPE_TYPES", "RopeScaling", "admitted_length"]

# Each rope type: (required parameters, optional ones).  "default" takes none and means no scaling.
PARAMETERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_position"), ()),
    "ntk": (("factor",), ("mixed_b",)),
    "yarn": (("factor", "original_max_position"),
             ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")),
    "deepseek_yarn": (("factor", "original_max_position"), ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position"), ()),
    "longrope": (("factor", "short_factor", "long_factor", "original_max_position"), ("attention_factor",)),
    "proportional": ((), ("factor", "partial_rotary_factor")),
}
ROPE_TYPES = tuple(PARAMETERS)

# What an absent optional parameter stands for, filled in at construction so that two records that
# build the same table compare equal.  mscale / mscale_all_dim / attention_factor of "yarn" stay None:
# transformers tells "absent" from a value there (docs/spec.md §1).
_DEFAULTS = {
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True},
    "deepseek_yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0},
    "proportional": {"factor": 1.0, "partial_rotary_factor": 1.0},
}

_POSITIVE = ("factor", "beta_fast", "beta_slow", "attention_factor", "low_freq_factor", "high_freq_factor", "mixed_b")
_NON_NEGATIVE = ("mscale", "mscale_all_dim")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, repr=False)
class RopeScaling:
    """How a rope config scales the frequencies (and the magnitude) of the cos/sin table.

    Attributes (each used by the rope types named; ``None`` where a type does not use it):
        rope_type: one of ROPE_TYPES: "linear", "dynamic" (NTK at the table's sequence length),
            "ntk" (vLLM's fixed and mixed NTK), "yarn", "deepseek_yarn", "llama3", "longrope",
            "proportional" (Gemma 4); "default" is no scaling (``RopeSpec`` keeps ``scaling=None``).
        factor: the context scale s (every type but proportional needs it; proportional divides by it).
        original_max_position: the pretraining length (yarn, deepseek_yarn, llama3, longrope; dynamic:
            the length past which the base grows, the config's max_position_embeddings).
        beta_fast, beta_slow: YaRN's ramp bounds in rotations (default 32 and 1; beta_fast >= beta_slow).
        mscale, mscale_all_dim: YaRN's magnitude exponents (yarn: both or neither count; deepseek_yarn:
            default 1 and 0).
        attention_factor: the magnitude as given by the config (yarn, longrope), overriding the formula.
        truncate: yarn: round the ramp bounds outwards to whole frequencies (default True; gpt-oss False).
        low_freq_factor, high_freq_factor: Llama 3's band edges (high > low).
        short_factor, long_factor: LongRoPE's per-frequency divisors (rotary_dim/2 each).
        mixed_b: ntk: the mixed-NTK exponent (absent: fixed NTK).
        partial_rotary_factor: proportional: the share of the head whose frequencies rotate.
    """

    rope_type: str
    factor: float | None = None
    original_max_position: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    mixed_b: float | None = None
    partial_rotary_factor: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rope_type, str) or self.rope_type not in PARAMETERS:
            raise ValueError(f"scaling.rope_type={self.rope_type!r}: must be one of {ROPE_TYPES}")
        required, optional = PARAMETERS[self.rope_type]
        for field in self._parameter_names():
            value = getattr(self, field)
            if value is not None and field not in required + optional:
                raise ValueError(f"scaling.{field}={value!r}: not a parameter of rope_type={self.rope_type!r} "
                                 f"(its parameters: {', '.join(required + optional) or 'none'})")
        for field, value in _DEFAULTS.get(self.rope_type, {}).items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, value)
        for field in required:
            if getattr(self, field) is None:
                raise ValueError(f"scaling.{field}=None: rope_type={self.rope_type!r} needs it (absent)")
        self._validate_values()

    def __repr__(self) -> str:
        shown = [f"{f}={getattr(self, f)!r}" for f in ("rope_type",) + self._parameter_names()
                 if getattr(self, f) is not None]
        return f"RopeScaling({', '.join(shown)})"

    @staticmethod
    def _parameter_names() -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(RopeScaling) if f.name != "rope_type")

    def _validate_values(self) -> None:
        for field in _POSITIVE + _NON_NEGATIVE:
            value = getattr(self, field)
            if value is None:
                continue
            if not _is_number(value) or (value <= 0 if field in _POSITIVE else value < 0):
                rule = "> 0" if field in _POSITIVE else ">= 0"
                raise ValueError(f"scaling.{field}={value!r}: must be a finite number {rule}")
            object.__setattr__(self, field, float(value))
        orig = self.original_max_position
        if orig is not None and (not isinstance(orig, int) or isinstance(orig, bool) or orig <= 0):
            raise ValueError(f"scaling.original_max_position={orig!r}: must be a positive int")
        if self.truncate is not None and not isinstance(self.truncate, bool):
            raise ValueError(f"scaling.truncate={self.truncate!r}: must be a bool")
        if self.beta_fast is not None and self.beta_fast < self.beta_slow:
            raise ValueError(f"scaling.beta_fast={self.beta_fast:g}: must be >= beta_slow={self.beta_slow:g} "
                             f"(beta_fast bounds the frequencies kept, beta_slow those interpolated: swapped?)")
        if self.high_freq_factor is not None and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"scaling.high_freq_factor={self.high_freq_factor:g}: must be > low_freq_factor="
                             f"{self.low_freq_factor:g}")
        p = self.partial_rotary_factor
        if p is not None and (not _is_number(p) or not 0 < p <= 1):
            raise ValueError(f"scaling.partial_rotary_factor={p!r}: must be a number in (0, 1]")
        if p is not None:
            object.__setattr__(self, "partial_rotary_factor", float(p))
        for field in ("short_factor", "long_factor"):
            self._validate_list(field)

    def _validate_list(self, field: str) -> None:
        value = getattr(self, field)
        if value is None:
            return
        if isinstance(value, (str, bytes, dict, set, frozenset)) or not hasattr(value, "__iter__"):
            raise ValueError(f"scaling.{field}={value!r}: must be a sequence of numbers")
        values = tuple(value)
        for i, x in enumerate(values):
            if not _is_number(x) or x <= 0:
                raise ValueError(f"scaling.{field}[{i}]={x!r}: must be a finite number > 0")
        object.__setattr__(self, field, tuple(float(x) for x in values))

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict:
        """The rope type and the parameters it uses (lists for LongRoPE's factors)."""
        out = {"rope_type": self.rope_type}
        for field in self._parameter_names():
            value = getattr(self, field)
            if value is not None:
                out[field] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, d) -> "RopeScaling":
        if isinstance(d, RopeScaling):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"scaling={d!r}: must be a RopeScaling, a mapping or None")
        unknown = set(d) - {"rope_type", *cls._parameter_names()}
        if unknown:
            raise ValueError(f"scaling: unknown fields {sorted(unknown)}")
        if "rope_type" not in d:
            raise ValueError("scaling.rope_type=<missing>: every scaling names its rope type")
        return cls(**d)


def admitted_length(scaling: RopeScaling | None, max_position_embeddings: int, *,
                    already_scaled: bool = False) -> int:
    """The positions an engine admits for a config (vLLM's rule, docs/spec.md §1), so a cos/sin
    cache of this many rows covers them: ``max_position_embeddings`` unscaled and for llama3,
    longrope and proportional without a factor; ``ceil(original_max_position x factor)`` for yarn
    and deepseek_yarn; ``ceil(max_position_embeddings x factor)`` for linear, dynamic, ntk and
    proportional.  ``already_scaled``: the config's max_position_embeddings is the scaled length
    already (vLLM's exception for Gemma 3): it is the answer, whatever the scaling."""
    if scaling is None or already_scaled or scaling.rope_type in ("default", "llama3", "longrope"):
        return max_position_embeddings
    if scaling.rope_type in ("yarn", "deepseek_yarn"):
        return math.ceil(scaling.original_max_position * scaling.factor)
    return math.ceil(max_position_embeddings * scaling.factor)
