"""The fused ops' kind of case file (registered with the envelope, rope.harness.case_files): its record
and its loader.  The replay is rope.harness.fused.replay.

Schema version 1 (every key required, ``hypothesis`` and ``test`` may be null)::

    schema_version  1
    kind            "fused"
    id              16 hex digits: sha256 of (implementation, op, case)
    implementation  registered name (triton, unfused) or "package.module:callable"
    op              "qk_norm_rope" | "rope_kv_cache" | "mla_rope_kv_cache" (the contract, docs/spec.md §10)
    case            the op's case as ``to_dict`` gives it (QKNormCase, CacheCase, MLACase: the spec as
                    RopeSpec.to_dict(), every other field an int, float, bool or one of its names;
                    ``generator``, what makes the tensors from the seed, may be absent: torch-cpu);
                    its tensors at most MAX_CASE_ELEMENTS elements
    device          where it ran ("cpu", "cuda", ...)
    problems        the check's findings: a list of at most case_files.MAX_PROBLEMS strings
    diagnosis       {"label", "sentence"}, label one of rope.harness.fused.diagnosis.LABELS
    hypothesis      {"version", "reproduce_blob", "decorator"} or null
    test            the pytest node id, or null
    versions        python, torch, triton, hypothesis, rope-harness, the implementation's
    created         ISO 8601 UTC

A case file is data from a stranger: every field is checked for its type and bounded before a
tensor is built (a count, a size or a seed outside its range is a ValueError naming the field), and
nothing in it is executed or imported (the replay resolves registered names only).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from rope.harness import case_files
from rope.harness.case_files import (LoadedCase, clipped_problems, is_int, read_device, read_diagnosis, read_fields,
                                     read_problems, versions)
from rope.harness.fused.cases import (BLOCK_SIZES, CACHE_KINDS, DTYPES, GENERATORS, POSITION_KINDS, Q_LAYOUTS,
                                      CacheCase, MLACase, QKNormCase)
from rope.harness.fused.diagnosis import LABELS
from rope.implementation import Implementation
from rope.spec import RopeSpec

__all__ = ["CASE_TYPES", "KIND", "MAX_CASE_ELEMENTS", "FusedCaseFile", "case_elements", "case_from_dict",
           "case_id", "case_record", "load_case"]

SCHEMA_VERSION = 1
KIND = case_files.register_kind("fused", SCHEMA_VERSION)
FIELDS = ("schema_version", "kind", "id", "implementation", "op", "case", "device", "problems", "diagnosis",
          "hypothesis", "test", "versions", "created")
NULLABLE = ("hypothesis", "test")
# Each op's case type.
CASE_TYPES = {"qk_norm_rope": QKNormCase, "rope_kv_cache": CacheCase, "mla_rope_kv_cache": MLACase}
MAX_CASE_ELEMENTS = 1 << 28        # what a replay may be asked to build, over all its tensors

# The bounds of each int and float field of the cases ([low, high], inclusive), and the names a
# string field may take.  A field none lists is refused.
_INTS = {"num_tokens": (1, 1 << 17), "num_q_heads": (1, 1024), "num_kv_heads": (1, 1024), "num_heads_q": (1, 1024),
         "num_heads_k": (1, 1024), "num_heads_v": (0, 1024), "num_heads": (1, 1024), "kv_lora_rank": (1, 8192),
         "nope_dim": (0, 8192), "block_size": (1, max(BLOCK_SIZES) * 64), "num_blocks": (1, 1 << 20),
         "short_slots": (0, 1 << 17), "row_padding": (0, 1 << 16), "seed": (0, (1 << 64) - 1)}
_FLOATS = {"padding": (0.0, 1.0), "k_scale": (1e-30, 1e30), "v_scale": (1e-30, 1e30), "scale": (1e-30, 1e30),
           "eps": (0.0, 1.0)}
_NAMES = {"dtype": tuple(DTYPES), "cache": CACHE_KINDS, "layout": ("NHD", "HND"), "q_layout": Q_LAYOUTS,
          "positions_kind": POSITION_KINDS, "generator": GENERATORS}


def _field(name: str, kind: str, value):
    """``value`` of the case field ``name`` (annotated ``kind``), checked; a ValueError naming it."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"case.{name}={value!r}: must be true or false")
    elif kind == "int":
        low, high = _INTS[name]
        if not is_int(value) or not low <= value <= high:
            raise ValueError(f"case.{name}={value!r}: must be an int in [{low}, {high}]")
    elif kind == "float":
        low, high = _FLOATS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= high:
            raise ValueError(f"case.{name}={value!r}: must be a finite number in [{low}, {high}]")
        value = float(value)
    elif kind == "str":
        if value not in _NAMES[name]:
            raise ValueError(f"case.{name}={value!r}: must be one of {_NAMES[name]}")
    elif kind == "RopeSpec":
        if not isinstance(value, dict):
            raise ValueError(f"case.spec={type(value).__name__}: must be an object (RopeSpec.to_dict())")
        try:
            value = RopeSpec.from_dict(value)
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"case.spec: {exc}") from None
    else:
        raise ValueError(f"case.{name}: a field of type {kind} is not read from a case file")
    return value


def case_elements(case) -> int:
    """An upper bound of the elements of every tensor ``case`` builds (activations, caches, the
    cos/sin table), before any is built."""
    spec, t = case.spec, case.num_tokens
    table = spec.max_position * spec.rotary_dim
    if isinstance(case, QKNormCase):
        return t * ((case.num_heads_q + case.num_heads_k + case.num_heads_v) * spec.head_size + case.row_padding) + table
    if isinstance(case, CacheCase):
        heads = case.num_q_heads + 4 * case.num_kv_heads           # q, k, v and the two caches' rows
        return t * heads * spec.head_size + 2 * case.num_blocks * case.block_size * case.num_kv_heads * \
            spec.head_size + table
    width = case.kv_lora_rank + spec.head_size
    return t * (case.num_heads * (case.nope_dim + spec.head_size) + width) + case.num_blocks * case.block_size * width \
        + table


def case_from_dict(op: str, raw) -> object:
    """The case of ``op`` a case file records, every field checked and the whole bounded."""
    cls = CASE_TYPES[op]
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    if isinstance(raw, dict) and "generator" not in raw:      # written before the field: drawn on the host
        raw = raw | {"generator": "torch-cpu"}
    if not isinstance(raw, dict) or set(raw) != set(fields):
        raise ValueError(f"case: must be an object with the fields {sorted(fields)} of {cls.__name__}")
    case = cls(**{name: _field(name, kind, raw[name]) for name, kind in fields.items()})
    elements = case_elements(case)
    if elements > MAX_CASE_ELEMENTS:
        raise ValueError(f"case: {elements} elements of tensors: must be at most {MAX_CASE_ELEMENTS}")
    if isinstance(case, (CacheCase, MLACase)):
        needed = case.num_tokens - case.short_slots
        if needed > case.num_blocks * case.block_size:
            raise ValueError(f"case.num_blocks={case.num_blocks}: {case.num_blocks * case.block_size} slots cannot "
                             f"hold {needed} tokens' rows")
    return case


def case_id(implementation: str, op: str, case) -> str:
    """Stable id of a mismatch (a case drawn on the host, the generator's default, keeps the id it had
    before cases recorded their generator)."""
    record = {k: v for k, v in case.to_dict().items() if not (k == "generator" and v == "torch-cpu")}
    key = json.dumps({"implementation": implementation, "op": op, "case": record}, sort_keys=True,
                     separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def case_record(*, implementation: str, fn: Callable, op: str, case, device: str, problems: list[str], label: str,
                sentence: str, hypothesis: dict | None) -> dict:
    """A fused case file's contents (the fused kind of the module's docstring)."""
    found = versions(device)
    try:
        found["implementation"] = Implementation.of("", fn).version
    except ValueError:          # a declaration the record cannot read: the file is written all the same
        found["implementation"] = None
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "id": case_id(implementation, op, case),
        "implementation": implementation, "op": op, "case": case.to_dict(), "device": device,
        "problems": clipped_problems(problems),
        "diagnosis": {"label": label, "sentence": sentence}, "hypothesis": hypothesis,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or None,
        "versions": found, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass(frozen=True)
class FusedCaseFile(LoadedCase):
    """A loaded fused case file: the op, the case it replays and the device it ran on."""
    op: str
    case: object
    device: str


def load_case(path: Path | str) -> FusedCaseFile:
    """Read and validate a fused case file; any problem is a ValueError naming file and field."""
    path = Path(path)
    record, bad = read_fields(path, KIND, FIELDS, NULLABLE)
    op = record["op"]
    if op not in CASE_TYPES:
        raise bad(f"op={op!r}: must be one of {tuple(CASE_TYPES)}")
    try:
        case = case_from_dict(op, record["case"])
    except (ValueError, TypeError) as exc:
        raise bad(str(exc)) from None
    device = read_device(record, bad)
    read_problems(record, bad)
    read_diagnosis(record, bad, LABELS)
    return FusedCaseFile(path, record, op, case, device)
