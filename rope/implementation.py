"""One record for an implementation: its name, the checked thing it implements, the callable, and
every declaration it makes as a typed field with its default.

Users write plain functions and hang declarations on them as attributes (docs/implementations.md
has the one table of them); adapters declare them with ``rope.backends.declare``.  The registry
reads them once, here, into an :class:`Implementation`; everything that asks what an implementation
declares (the suite, the comparison, the bench, case files) reads the record's fields instead of
``getattr`` on a function.  A malformed declaration is a ValueError naming the implementation and
the field, when the record is built.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

__all__ = ["ANGLE_SOURCES", "CHECKED_THINGS", "DECLARATIONS", "FUSED_DRAWS", "FUSED_OPS", "Implementation", "MAX_SWITCH", "MODES",
           "WORKING_PRECISIONS"]

CHECKED_THINGS = ("rotation", "position_step", "position_ids", "table", "fused")
# The fused contracts (docs/spec.md §10): QK-norm + RoPE, RoPE + KV-cache write, DeepSeek's MLA.
FUSED_OPS = ("qk_norm_rope", "rope_kv_cache", "mla_rope_kv_cache")
WORKING_PRECISIONS = ("float32", "activation")
ANGLE_SOURCES = ("cache", "own-float32")     # the table it is handed, or angles it computes itself
MAX_SWITCH = 1 << 31
# How an engine calls it: eagerly, inside torch.compile, captured in a CUDA (HIP) graph and replayed.
MODES = ("eager", "compile", "graph")
# Narrowed fused-case draws an implementation may declare (``draws``): only 1-D positions, only FP8
# caches, one scale for k and v, head/rotary/latent widths that are multiples of 16, fp16/bf16 only,
# only caches in the activation dtype, only head sizes 64/128/256 (a kernel dispatched on them).
FUSED_DRAWS = ("1d", "fp8_cache", "one_kv_scale", "dims_of_16", "half_dtypes", "activation_cache", "append_heads")


@dataclass(frozen=True)
class Implementation:
    """An implementation and what it declares.  ``fn`` is what the harness calls; the record is
    itself callable (it calls ``fn``), so a record goes wherever a function did."""

    name: str
    thing: str
    fn: Callable
    # What every checked thing may declare.
    unsupported_reason: Callable | None = None   # rotation (spec, dtype, device); position ids (family, prompt);
    #                                              fused ops (case, device)
    version: str | None = None                   # recorded in case files
    # Rotation.
    working_precision: str = "float32"           # "float32" or "activation" (computes in the input dtype)
    supports: Callable | None = None             # (spec, dtype, device) -> bool; position step: (device) -> bool
    known_fault: Callable | None = None          # (spec, dtype, device) -> why it crashes there, or None
    known_defect: Callable | None = None         # (spec, num_tokens, dtype, device, *, num_heads, num_kv_heads)
    unchecked: Callable | None = None            # the hot path without validation (the bench times it)
    angles: str = "cache"                        # ANGLE_SOURCES
    modes: tuple[str, ...] = MODES               # how it may be called: eager, under torch.compile, in a CUDA graph
    fullgraph: bool = False                      # compiles in one graph (torch.compile(fullgraph=True))
    deterministic: bool = True                   # the same bits from the same inputs, call after call
    switch_tokens: tuple[int, ...] = ()          # token counts where a new code path starts
    switch_token_heads: tuple[int, ...] = ()     # tokens x (query + key heads) where a new code path starts
    separate_1d_kernel: bool = False             # one kernel for [rows, T] positions, another for [T]
    autograd: bool = False                       # torch.autograd differentiates its outputs w.r.t. query and key
    cache_grad: bool = False                     # ... and w.r.t. the cos/sin cache (with autograd)
    backward_defect: str | None = None           # a measured upstream defect of its backward (with autograd): why
    # Position ids.
    families: tuple[str, ...] | None = None      # the model families it implements (None: every one)
    batch: Callable | None = None                # (family, PromptBatch) -> one result per prompt
    known_deviations: Callable | None = None     # (family, PromptBatch) -> a pinned departure per prompt
    # Fused ops.
    fused_op: str | None = None                  # the contract it implements: one of FUSED_OPS
    rounds_normalized: bool = False              # QK-norm + RoPE: rounds the normalized q/k before rotating
    fp8_query: bool = False                      # cache writes: returns q (q_pe) as FP8 codes of q / the key's scale
    returns_live_key: bool = True                # cache writes: returns the live rotated k (False: second result None)
    skips_padding_tokens: bool = False           # cache writes: a token with no slot is skipped whole (q and k unwritten)
    scales_by_reciprocal: bool = False           # FP8 stores multiply by the scale's fp32 reciprocal (one more rounding)
    draws: tuple[str, ...] = ()                  # fused ops: the narrowed draws it takes (FUSED_DRAWS)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    @classmethod
    def of(cls, name: str, fn: Callable, thing: str = "rotation") -> "Implementation":
        """The record of ``fn`` (a record is returned as it is): each declaration read from its
        attribute, checked, or its default."""
        if isinstance(fn, Implementation):
            return fn
        if thing not in CHECKED_THINGS:
            raise ValueError(f"thing={thing!r}: must be one of {CHECKED_THINGS}")
        declared = {f.name: getattr(fn, f.name) for f in DECLARATIONS if hasattr(fn, f.name)}
        declared = {key: value for key, value in declared.items() if value is not None}
        where = f"{name}." if name else "implementation."
        precision = declared.get("working_precision", "float32")
        if precision not in WORKING_PRECISIONS:
            raise ValueError(f"{where}working_precision={precision!r}: must be one of {WORKING_PRECISIONS}")
        angles = declared.get("angles", "cache")
        if angles not in ANGLE_SOURCES:
            raise ValueError(f"{where}angles={angles!r}: must be one of {ANGLE_SOURCES}")
        for key in ("switch_tokens", "switch_token_heads"):
            if key in declared:
                declared[key] = _switches(where + key, declared[key],
                                          "token counts" if key == "switch_tokens" else "token x head products")
        if "families" in declared:
            value = declared["families"]
            if isinstance(value, str) or not all(isinstance(f, str) for f in _iterable(where + "families", value)):
                raise ValueError(f"{where}families={value!r}: must be a sequence of family names")
            declared["families"] = tuple(value)
        if "fused_op" in declared and declared["fused_op"] not in FUSED_OPS:
            raise ValueError(f"{where}fused_op={declared['fused_op']!r}: must be one of {FUSED_OPS} (the contract "
                             f"it implements, docs/implementations.md)")
        if "draws" in declared:
            value = declared["draws"]
            drawn = (value,) if isinstance(value, str) else tuple(_iterable(where + "draws", value))
            if not set(drawn) <= set(FUSED_DRAWS):
                raise ValueError(f"{where}draws={value!r}: must be a sequence of {FUSED_DRAWS}")
            declared["draws"] = drawn
        for key in ("separate_1d_kernel", "autograd", "cache_grad", "rounds_normalized", "fp8_query",
                    "returns_live_key", "skips_padding_tokens", "scales_by_reciprocal"):
            if key in declared and not isinstance(declared[key], bool):
                raise ValueError(f"{where}{key}={declared[key]!r}: must be True or False")
        for key in ("fullgraph", "deterministic"):
            if key in declared and not isinstance(declared[key], bool):
                raise ValueError(f"{where}{key}={declared[key]!r}: must be True or False")
        if "modes" in declared:
            value = declared["modes"]
            modes = (value,) if isinstance(value, str) else tuple(_iterable(where + "modes", value))
            if not modes or not set(modes) <= set(MODES):
                raise ValueError(f"{where}modes={value!r}: must be a non-empty sequence of {MODES}")
            declared["modes"] = modes
        for key in ("version", "backward_defect"):
            if key in declared and not isinstance(declared[key], str):
                raise ValueError(f"{where}{key}={declared[key]!r}: must be a string")
        for key in _CALLABLES:
            if key in declared and not callable(declared[key]):
                raise ValueError(f"{where}{key}={declared[key]!r}: must be callable")
        return cls(name=name, thing=thing, fn=fn, **declared)


DECLARATIONS = tuple(f for f in fields(Implementation) if f.name not in ("name", "thing", "fn"))
_CALLABLES = ("unsupported_reason", "supports", "known_fault", "known_defect", "unchecked", "batch",
              "known_deviations")


def _iterable(field: str, value) -> list:
    try:
        return list(value)
    except TypeError:
        raise ValueError(f"{field}={value!r}: must be a sequence") from None


def _switches(field: str, declared, what: str) -> tuple[int, ...]:
    """Declared switch points: ints in [1, 2**31], each the first of a new code path, sorted."""
    try:
        items = list(declared)
        values = tuple(sorted({int(v) for v in items if int(v) == v and not isinstance(v, bool)}))
        complete = len(values) == len(set(items))
    except (TypeError, ValueError):
        complete, values = False, ()
    if not complete or any(not 1 <= v <= MAX_SWITCH for v in values):
        raise ValueError(f"{field}={declared!r}: must be {what}, ints in [1, 2**31] "
                         f"(each the first of a new code path)")
    return values
