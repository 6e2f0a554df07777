"""The position step's kind of case file (registered with the envelope, rope.harness.case_files): its
record, its loader and its writer for a step sequence.  The case's own JSON form is RaggedBatch.to_dict /
from_dict (rope.harness.position_step.cases); the replay is rope.harness.position_step.replay.

Schema version 1, one step on fresh tensors (every key required, ``hypothesis`` and ``test`` may be null)::

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

Schema version 2, a sequence of steps on one set of buffers refilled in place (a step right alone and
stale after the earlier ones: rope.harness.position_step.modes), is version 1's keys and two more::

    mode            "eager" (a call per step) or "graph" (captured after warm-ups on the first step,
                    a replay per step; a GPU replays it)
    steps           the whole sequence, in order: 1 to MAX_STEPS RaggedBatch.to_dict(), every one the
                    shapes of one set of buffers (cases.buffer_shape), at most MAX_STEP_ELEMENTS
                    positions together; ``batch`` is the first step that went stale, one of them
    id              sha256 of (implementation, mode, steps)
    diagnosis       label: also the mode's stale label, STALE_LABELS (cases.STALE_LABELS)

A one-step case is still written as version 1, and a version-1 file reads as it always did; a reader
of version 1 only refuses a sequence rather than replay one step of it (which passes alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from rope.harness import case_files
from rope.harness.case_files import (LoadedCase, clipped_problems, read_device, read_diagnosis, read_fields,
                                     read_problems, versions)
from rope.harness.position_step.cases import MAX_STEP_ELEMENTS, STALE_LABELS, STEP_MODES, RaggedBatch, buffer_shape
from rope.harness.position_step.diagnosis import LABELS
from rope.implementation import Implementation

__all__ = ["KIND", "MAX_STEPS", "MODES", "STALE_LABELS", "PositionStepCaseFile", "case_id", "case_record", "load_case",
           "write_sequence_case", "write_step_case"]

SCHEMA_VERSION = 2
ONE_STEP_VERSION = 1        # what a one-step case is written as: readable by every version
KIND = case_files.register_kind("position_step", SCHEMA_VERSION)
FIELDS = ("schema_version", "kind", "id", "implementation", "batch", "device", "problems", "diagnosis",
          "hypothesis", "test", "versions", "created")
SEQUENCE_FIELDS = ("mode", "steps")
NULLABLE = ("hypothesis", "test")
# The steps a sequence file may ask a replay to run (the properties draw 2 to 4).
MAX_STEPS = 16
# How a sequence ran and the causes it was grouped under (rope.harness.position_step.cases).
MODES = STEP_MODES


def case_id(implementation: str, batch: RaggedBatch, steps=None, mode: str | None = None) -> str:
    """Stable id: (implementation, batch) of one step; (implementation, mode, steps) of a sequence."""
    if steps is None:
        content = {"implementation": implementation, "batch": batch.to_dict()}
    else:
        content = {"implementation": implementation, "mode": mode, "steps": [s.to_dict() for s in steps]}
    key = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def case_record(*, implementation: str, fn: Callable, batch: RaggedBatch, device: str, problems: list[str],
                label: str, hypothesis: dict | None, steps=None, mode: str | None = None) -> dict:
    """A position-step case file's contents (the module's docstring): one step (version 1), or with
    ``steps`` and ``mode`` the sequence ``batch`` went stale in (version 2)."""
    found = versions(device)
    found["implementation"] = Implementation.of("", fn, "position_step").version
    record = {
        "schema_version": ONE_STEP_VERSION, "kind": KIND, "id": case_id(implementation, batch, steps, mode),
        "implementation": implementation, "batch": batch.to_dict(), "device": device, "problems": clipped_problems(problems),
        "diagnosis": {"label": label, "sentence": problems[0] if problems else ""}, "hypothesis": hypothesis,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or None,
        "versions": found, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if steps is not None:
        record.update(schema_version=SCHEMA_VERSION, mode=mode, steps=[s.to_dict() for s in steps])
    return record


@dataclass(frozen=True)
class PositionStepCaseFile(LoadedCase):
    """A loaded position-step case file: the step it replays and the device it ran on; for a
    sequence, every step in order and the mode they ran in (``steps`` empty, ``mode`` None: one step
    on fresh tensors)."""
    batch: RaggedBatch
    device: str
    steps: tuple = ()
    mode: str | None = None


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
    steps, mode = _read_sequence(record, batch, bad)
    read_diagnosis(record, bad, (*LABELS, STALE_LABELS[mode]) if steps else LABELS)
    return PositionStepCaseFile(path, record, batch, device, steps, mode)


def _read_sequence(record: dict, batch: RaggedBatch, bad) -> tuple[tuple, str | None]:
    """A version-2 record's ``steps`` and ``mode`` (none: a one-step file), each field validated."""
    present = [name for name in SEQUENCE_FIELDS if name in record]
    if not present:
        return (), None
    if record["schema_version"] < SCHEMA_VERSION:
        raise bad(f"{', '.join(present)}: a step sequence needs schema_version {SCHEMA_VERSION} "
                  f"(got {record['schema_version']})")
    if len(present) < len(SEQUENCE_FIELDS):
        raise bad(f"mode, steps: a step sequence records both (got only {present[0]!r})")
    mode, raw = record["mode"], record["steps"]
    if mode not in MODES:
        raise bad(f"mode={mode!r}: must be one of {MODES}")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_STEPS:
        count = len(raw) if isinstance(raw, list) else type(raw).__name__
        raise bad(f"steps: must be a list of 1 to {MAX_STEPS} steps (got {count})")
    steps, elements = [], 0
    for i, step in enumerate(raw):
        try:
            steps.append(RaggedBatch.from_dict(step))
        except (ValueError, TypeError) as exc:      # its messages name batch.<field>: here steps[i].<field>
            raise bad(re.sub(r"\bbatch\b", f"steps[{i}]", str(exc))) from None
        elements += len(steps[-1].prefill_positions) + steps[-1].num_tokens
        if elements > MAX_STEP_ELEMENTS:
            raise bad(f"steps: more than {MAX_STEP_ELEMENTS} positions to build together")
    shapes = [buffer_shape(s) for s in steps]
    for i, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise bad(f"steps[{i}]: {shape}: every step on one set of buffers has the same shapes (num_dims, "
                      f"slots, table size, requests, out columns) as steps[0] {shapes[0]}")
    if batch not in steps:
        raise bad("batch: must be one of steps (the step that went stale)")
    return tuple(steps), mode


def write_step_case(name: str, fn: Callable, batch: RaggedBatch, device: str, problems: list[str], failure: dict,
                    hypothesis: dict | None, *, steps=None, mode: str | None = None) -> list[str]:
    """Write the case file of a step that failed (with ``steps`` and ``mode``: the sequence it went stale
    in), its path and replay command into ``failure`` (the run's failure block shows them); the lines
    to add to the message: none once written, else why not (never raising: the failure is reported
    all the same)."""
    from rope.registry import get_positions_implementation
    try:
        implementation = case_files.implementation_path(name, fn, resolve=get_positions_implementation)
        directory = case_files.cases_dir()
        if directory is None:
            return [f"case file: not written ({case_files.CASES_DIR_ENV} is off)"]
        record = case_record(implementation=implementation, fn=fn, batch=batch, device=device, problems=problems,
                             label=failure["cause"], hypothesis=hypothesis,
                             steps=None if steps is None else list(steps), mode=mode)
        shown = case_files.display_path(case_files.write_case(record, directory))
        failure.update(case_file=shown, replay=case_files.replay_command(shown, implementation))
        return []
    except Exception as exc:     # noqa: BLE001 - the failure is reported all the same
        return [f"(case file not written: {type(exc).__name__}: {exc})"]


def write_sequence_case(name: str, fn: Callable, steps, batch: RaggedBatch, device: str, mode: str,
                        problems: list[str], failure: dict) -> list[str]:
    """:func:`write_step_case` for a step right alone and stale in the sequence ``steps`` run in
    ``mode``, written in Hypothesis' final example (or outside Hypothesis), not while it searches."""
    from rope.harness.draws import hypothesis_example
    final, hypothesis = hypothesis_example()
    if not final:
        return []
    return write_step_case(name, fn, batch, device, problems, failure, hypothesis, steps=steps, mode=mode)
