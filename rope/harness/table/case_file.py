"""The table's kind of case file (registered with the envelope, rope.harness.case_files): its record
and its loader.  The replay is rope.harness.table.replay.

Schema version 1 (every key required, ``hypothesis`` and ``test`` may be null)::

    schema_version  1
    kind            "table"
    id              16 hex digits: sha256 of (implementation, case)
    implementation  registered name (ours, transformers) or "package.module:callable"
    case            TableCase.to_dict(): {"spec": RopeSpec.to_dict(), "max_position": int, "dtype": "float32" |
                    "bfloat16" | "float16", "seed": int}; max_position x rotary_dim at most MAX_TABLE_ELEMENTS
    device          where it ran ("cpu", "cuda", ...)
    result          {"worst_ratio", "worst_row", "worst_column"} (null where the shape was wrong)
    diagnosis       {"label", "sentence"}
    hypothesis      {"version", "reproduce_blob", "decorator"} or null
    test            the pytest node id, or null
    versions        python, torch, transformers, hypothesis, rope-harness, the implementation's
    created         ISO 8601 UTC
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from rope.harness import case_files
from rope.harness.case_files import LoadedCase, read_device, read_diagnosis, read_fields, versions
from rope.harness.table.cases import TableCase
from rope.harness.table.diagnosis import LABELS, TableMismatch
from rope.implementation import Implementation

__all__ = ["KIND", "MAX_TABLE_ELEMENTS", "TableCaseFile", "case_id", "case_record", "load_case"]

SCHEMA_VERSION = 1
KIND = case_files.register_kind("table", SCHEMA_VERSION)
FIELDS = ("schema_version", "kind", "id", "implementation", "case", "device", "result", "diagnosis", "hypothesis",
          "test", "versions", "created")
NULLABLE = ("result", "hypothesis", "test")
MAX_TABLE_ELEMENTS = 1 << 28          # what a replay may be asked to build: 1 GiB of float32


def case_id(implementation: str, case: TableCase) -> str:
    key = json.dumps({"implementation": implementation, "case": case.to_dict()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def case_record(*, implementation: str, fn: Callable, case: TableCase, device: str, mismatch: TableMismatch,
                worst_ratio: float, hypothesis: dict | None) -> dict:
    """A table case file's contents (the table kind of the module's docstring)."""
    found = versions(device)
    found["implementation"] = Implementation.of("", fn, "table").version
    result = None if mismatch.worst_row is None else {
        "worst_ratio": case_files.finite(worst_ratio), "worst_row": mismatch.worst_row,
        "worst_column": mismatch.worst_column}
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "id": case_id(implementation, case),
        "implementation": implementation, "case": case.to_dict(), "device": device, "result": result,
        "diagnosis": {"label": mismatch.label, "sentence": mismatch.sentence}, "hypothesis": hypothesis,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or None,
        "versions": found, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass(frozen=True)
class TableCaseFile(LoadedCase):
    """A loaded table case file: the case it replays and the device it ran on."""
    case: TableCase
    device: str


def load_case(path: Path | str) -> TableCaseFile:
    """Read and validate a table case file; any problem is a ValueError naming file and field."""
    path = Path(path)
    record, bad = read_fields(path, KIND, FIELDS, NULLABLE)
    try:
        case = TableCase.from_dict(record["case"])
    except (ValueError, TypeError, KeyError) as exc:
        raise bad(f"case: {exc}") from None
    elements = case.max_position * case.spec.rotary_dim
    if elements > MAX_TABLE_ELEMENTS:
        raise bad(f"case: max_position x rotary_dim = {elements}: must be at most {MAX_TABLE_ELEMENTS}")
    device = read_device(record, bad)
    read_diagnosis(record, bad, LABELS)
    return TableCaseFile(path, record, case, device)
