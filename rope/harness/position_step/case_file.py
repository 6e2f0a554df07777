"""The position step's kind of case file (registered with the envelope, rope.harness.case_files): its
record and its loader.  The case's own JSON form is RaggedBatch.to_dict / from_dict
(rope.harness.position_step.cases); the replay is rope.harness.position_step.replay.

Schema version 1 (every key required, ``hypothesis`` and ``test`` may be null)::

    schema_version  1
    kind            "position_step"
    id              16 hex digits: sha256 of (implementation, batch)
    implementation  registered name (native, triton, vllm) or "package.module:callable"
    batch           RaggedBatch.to_dict(): {"num_dims", "prefill_positions" (flat, [slots x num_dims]
                    rows of one length), "prefill_delta", "prefill_lens", "num_computed_tokens",
                    "idx_mapping", "query_lens", "padding"}; at most MAX_STEP_ELEMENTS positions
    device          where it ran ("cpu", "cuda", ...)
    problems        what differed, as the failure said it (at most case_files.MAX_PROBLEMS strings)
    diagnosis       {"label", "sentence"}: label one of rope.harness.position_step.diagnosis.LABELS
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
from rope.harness.case_files import (LoadedCase, clipped_problems, read_device, read_diagnosis, read_fields,
                                     read_problems, versions)
from rope.harness.position_step.cases import RaggedBatch
from rope.harness.position_step.diagnosis import LABELS
from rope.implementation import Implementation

__all__ = ["KIND", "PositionStepCaseFile", "case_id", "case_record", "load_case"]

SCHEMA_VERSION = 1
KIND = case_files.register_kind("position_step", SCHEMA_VERSION)
FIELDS = ("schema_version", "kind", "id", "implementation", "batch", "device", "problems", "diagnosis",
          "hypothesis", "test", "versions", "created")
NULLABLE = ("hypothesis", "test")


def case_id(implementation: str, batch: RaggedBatch) -> str:
    key = json.dumps({"implementation": implementation, "batch": batch.to_dict()}, sort_keys=True,
                     separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def case_record(*, implementation: str, fn: Callable, batch: RaggedBatch, device: str, problems: list[str],
                label: str, hypothesis: dict | None) -> dict:
    """A position-step case file's contents (the position_step kind of the module's docstring)."""
    found = versions(device)
    found["implementation"] = Implementation.of("", fn, "position_step").version
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "id": case_id(implementation, batch),
        "implementation": implementation, "batch": batch.to_dict(), "device": device, "problems": clipped_problems(problems),
        "diagnosis": {"label": label, "sentence": problems[0] if problems else ""}, "hypothesis": hypothesis,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or None,
        "versions": found, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass(frozen=True)
class PositionStepCaseFile(LoadedCase):
    """A loaded position-step case file: the step it replays and the device it ran on."""
    batch: RaggedBatch
    device: str


def load_case(path: Path | str) -> PositionStepCaseFile:
    """Read and validate a position-step case file; any problem is a ValueError naming file and field."""
    path = Path(path)
    record, bad = read_fields(path, KIND, FIELDS, NULLABLE)
    try:
        batch = RaggedBatch.from_dict(record["batch"])
    except (ValueError, TypeError) as exc:
        raise bad(str(exc)) from None
    device = read_device(record, bad)
    read_problems(record, bad)
    read_diagnosis(record, bad, LABELS)
    return PositionStepCaseFile(path, record, batch, device)
