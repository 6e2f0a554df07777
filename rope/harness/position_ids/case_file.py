"""The position ids' kind of case file (registered with the envelope, rope.harness.case_files): its
record and its loader.  The case's own record form (a prompt batch as JSON, and back) is
rope.harness.position_ids.cases; the replay is rope.harness.position_ids.replay.

Schema version 1 (every key required, ``hypothesis`` and ``test`` may be
null)::

    schema_version  1
    kind            "position_ids"
    id              16 hex digits: sha256 of (implementation, family, batch)
    implementation  registered name (transformers, vllm, sglang) or "package.module:callable"
    family          one of reference.FAMILIES
    batch           {"prompts": [prompt, ...], "pads": [int, ...], "side": "left" | "right"}
                    prompt = {"spatial_merge_size": int, "segments": [{"text": n} |
                    {"image": [1, h, w]} | {"video": [t, h, w], "second_per_grid": x, "timestamp_tokens": n,
                                            "audio_frames": n (Omni families, optional)}
                    | {"audio": frames}]}
    prompt_index    which prompt of the batch differs
    result          PositionIdsMismatch.to_dict(): token, rows, segment, role, got, expected,
                    num_differing, got_delta, expected_delta
    known_deviation null, or the keys of the pinned upstream departures the expectation applied
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
from rope.harness.case_files import LoadedCase, is_int, read_diagnosis, read_fields, versions
from rope.harness.position_ids.cases import MAX_PROMPTS, MAX_PROMPT_TOKENS, batch_to_dict, prompt_from_dict, prompt_tokens
from rope.harness.position_ids.diagnosis import LABELS, PositionIdsMismatch
from rope.implementation import Implementation
from rope.prompts import FAMILIES, PromptBatch

SCHEMA_VERSION = 1
KIND = case_files.register_kind("position_ids", SCHEMA_VERSION)
FIELDS = ("schema_version", "kind", "id", "implementation", "family", "batch", "prompt_index", "result",
          "known_deviation", "diagnosis", "hypothesis", "test", "versions", "created")
NULLABLE = ("known_deviation", "hypothesis", "test")

def case_id(implementation: str, family: str, batch: PromptBatch) -> str:
    key = json.dumps({"implementation": implementation, "family": family, "batch": batch_to_dict(batch)},
                     sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def case_record(*, implementation: str, fn: Callable, family: str, batch: PromptBatch, index: int,
                             mismatch: PositionIdsMismatch, deviation, hypothesis: dict | None) -> dict:
    """A position-id case file's contents (the position_ids kind of the module's docstring)."""
    found = versions("cpu")
    found["implementation"] = Implementation.of("", fn, "position_ids").version
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND,
        "id": case_id(implementation, family, batch),
        "implementation": implementation, "family": family, "batch": batch_to_dict(batch), "prompt_index": index,
        "result": mismatch.to_dict(), "known_deviation": list(deviation.keys) if deviation else None,
        "diagnosis": {"label": mismatch.label, "sentence": mismatch.sentence}, "hypothesis": hypothesis,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or None,
        "versions": found, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass(frozen=True)
class PositionIdsCase(LoadedCase):
    """A loaded position-id case file: the family and the batch of prompts it replays."""
    family: str
    batch: PromptBatch


def load_case(path: Path | str) -> PositionIdsCase:
    """Read and validate a position-id case file; any problem is a ValueError naming file and field."""
    path = Path(path)
    record, bad = read_fields(path, KIND, FIELDS, NULLABLE)
    if record["family"] not in FAMILIES:
        raise bad(f"family={record['family']!r}: must be one of {FAMILIES}")
    raw = record["batch"]
    if not isinstance(raw, dict) or set(raw) != {"prompts", "pads", "side"}:
        raise bad("batch: must be an object with 'prompts', 'pads' and 'side'")
    if not isinstance(raw["prompts"], list) or not 1 <= len(raw["prompts"]) <= MAX_PROMPTS:
        raise bad(f"batch.prompts: must be a list of 1 to {MAX_PROMPTS} prompts")
    if not isinstance(raw["pads"], list):
        raise bad("batch.pads: must be a list of ints")
    try:
        prompts = tuple(prompt_from_dict(f"batch.prompts[{i}]", p) for i, p in enumerate(raw["prompts"]))
        tokens = sum(prompt_tokens(p) for p in prompts)
        if tokens > MAX_PROMPT_TOKENS:
            raise ValueError(f"batch: about {tokens} tokens: must be at most {MAX_PROMPT_TOKENS}")
        batch = PromptBatch(prompts, tuple(raw["pads"]), raw["side"])
    except ValueError as exc:
        raise bad(str(exc)) from None
    index = record["prompt_index"]
    if not is_int(index) or not 0 <= index < len(prompts):
        raise bad(f"prompt_index={index!r}: must be an int in [0, {len(prompts)})")
    read_diagnosis(record, bad, LABELS)
    return PositionIdsCase(path, record, record["family"], batch)
