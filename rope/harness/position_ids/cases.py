"""Position-id mismatches: the check the suite runs, its case files, and their replay.

:func:`assert_matches` holds a position-id implementation to the expected ids of every prompt of a
:class:`PromptBatch`; on a mismatch it writes ``reports/cases/<id>.json`` (``ROPE_CASES_DIR`` as for
rotation cases) and fails with the first differing token, row and segment, the diagnosis and the
replay command.  ``rope-harness repro FILE`` and ``pytest --rope-repro FILE`` replay it.

Schema (``kind`` tells it from a rotation case file; every key required, ``hypothesis`` and ``test``
may be null)::

    schema_version  1
    kind            "position_ids"
    id              16 hex digits: sha256 of (implementation, family, batch)
    implementation  registered name (transformers, vllm, sglang) or "package.module:callable"
    family          one of reference.FAMILIES
    batch           {"prompts": [prompt, ...], "pads": [int, ...], "side": "left" | "right"}
                    prompt = {"spatial_merge_size": int, "segments": [{"text": n} |
                    {"image": [1, h, w]} | {"video": [t, h, w], "second_per_grid": x, "timestamp_tokens": n}]}
    prompt_index    which prompt of the batch differs
    result          PositionIdsMismatch.to_dict(): token, rows, segment, role, got, expected,
                    num_differing, got_delta, expected_delta
    known_deviation null, or the keys of the pinned upstream departures the expectation applied
    diagnosis       {"label", "sentence"}
    hypothesis      {"version", "reproduce_blob", "decorator"} or null
    test            the pytest node id, or null
    versions        python, torch, transformers, hypothesis, rope-harness, the implementation's
    created         ISO 8601 UTC

A case file is data from a stranger: every field is validated (bounded sizes, known names), and a
replay resolves only registered names; a module path stored in it is never imported.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from rope.prompts import FAMILIES, Image, Prompt, Text, Video
from rope import registry
from rope.harness import case_files
from rope.harness.position_ids import (
    ADAPTERS,
    ImplementationFailed,
    PromptBatch,
    expected,
    get_position_ids_implementation,
    run_batch,
    unsupported_reason,
)
from rope.harness.position_ids.diagnosis import LABELS, PositionIdsMismatch, compare

KIND = "position_ids"
SCHEMA_VERSION = case_files.KINDS[KIND]
FIELDS = ("schema_version", "kind", "id", "implementation", "family", "batch", "prompt_index", "result",
          "known_deviation", "diagnosis", "hypothesis", "test", "versions", "created")
NULLABLE = ("known_deviation", "hypothesis", "test")
# Bounds on what a case file may ask a replay to build: prompts, segments, grid sides, frames.
MAX_PROMPTS = 64
MAX_SEGMENTS = 256
MAX_TEXT = 1 << 16
MAX_SIDE = 1 << 10
MAX_FRAMES = 1 << 10
MAX_TOKENS = 1 << 20


# ------------------------------------------------------------------------------------------ record
def prompt_to_dict(prompt: Prompt) -> dict:
    segments = []
    for seg in prompt.segments:
        if isinstance(seg, Text):
            segments.append({"text": seg.length})
        elif isinstance(seg, Image):
            segments.append({"image": list(seg.grid_thw)})
        else:
            segments.append({"video": list(seg.grid_thw), "second_per_grid": seg.second_per_grid,
                             "timestamp_tokens": seg.timestamp_tokens})
    return {"spatial_merge_size": prompt.spatial_merge_size, "segments": segments}


def batch_to_dict(batch: PromptBatch) -> dict:
    return {"prompts": [prompt_to_dict(p) for p in batch.prompts], "pads": list(batch.pads), "side": batch.side}


def case_id(implementation: str, family: str, batch: PromptBatch) -> str:
    key = json.dumps({"implementation": implementation, "family": family, "batch": batch_to_dict(batch)},
                     sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def implementation_path(name: str, fn: Callable) -> str:
    """A string :func:`get_position_ids_implementation` resolves to ``fn`` (case_files' rule)."""
    return case_files.implementation_path(name, fn, resolve=get_position_ids_implementation)


def case_record(*, implementation: str, fn: Callable, family: str, batch: PromptBatch, index: int,
                mismatch: PositionIdsMismatch, deviation, hypothesis: dict | None) -> dict:
    versions = case_files.versions("cpu")
    versions["implementation"] = getattr(fn, "version", None)
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "id": case_id(implementation, family, batch),
        "implementation": implementation, "family": family, "batch": batch_to_dict(batch), "prompt_index": index,
        "result": mismatch.to_dict(), "known_deviation": list(deviation.keys) if deviation else None,
        "diagnosis": {"label": mismatch.label, "sentence": mismatch.sentence}, "hypothesis": hypothesis,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or None,
        "versions": versions, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def is_position_ids_case(path: Path | str) -> bool:
    """Whether ``path`` holds a position-id case file (its ``kind``, read by the case files' one
    header reader); False for anything unreadable (the rotation loader then says what is wrong)."""
    return case_files.case_kind(path) == KIND


# ------------------------------------------------------------------------------------------ check
@dataclass
class BatchCheck:
    """What :func:`check` found: per prompt, None or the mismatch (and the deviation applied)."""
    mismatches: list[tuple[int, PositionIdsMismatch, object]]
    deviations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches


def check(fn: Callable, family: str, batch: PromptBatch) -> BatchCheck:
    """Run ``fn`` on the batch and compare every prompt with its expected ids.  A wrong return
    value (not a pair, wrong shape or dtype) raises ValueError."""
    got = run_batch(fn, family, batch)
    want = expected(fn, family, batch)
    mismatches, keys = [], set()
    for i, (prompt, (pos, delta), (w_pos, w_delta, dev)) in enumerate(zip(batch.prompts, got, want)):
        if dev is not None:
            keys.update(dev.keys)
        m = compare(family, prompt, pos, delta, w_pos, w_delta)
        if m is not None:
            mismatches.append((i, m, dev))
    return BatchCheck(mismatches, tuple(sorted(keys)))


def assert_matches(name: str, fn: Callable, family: str, batch: PromptBatch) -> tuple[str, ...]:
    """Hold ``fn`` to the expected ids of every prompt of ``batch``; return the keys of the known
    deviations that applied.  On a mismatch, write the case file (once Hypothesis has shrunk) and
    raise AssertionError with the first difference, the diagnosis and the replay command."""
    from rope.harness.comparison import hypothesis_example
    try:
        result = check(fn, family, batch)
    except ImplementationFailed as exc:
        raise AssertionError(f"{name} on {family} raised {exc}\nbatch: {batch}") from None
    except ValueError as exc:
        raise AssertionError(f"{name} on {family}: wrong return value: {exc}\nbatch: {batch}") from None
    if result.ok:
        return result.deviations
    index, mismatch, deviation = result.mismatches[0]
    head = (f"{name} position ids for {family} do not match the "
            f"{'pinned upstream value' if deviation else 'reference'} (prompt {index} of {len(batch.prompts)}: "
            f"{batch.prompts[index]!r}; pads {list(batch.pads)} {batch.side})")
    message = f"{head}\n{mismatch.describe()}"
    if deviation is not None:
        message += f"\nexpected value pinned by: {deviation.reason}"
    final, hypothesis = hypothesis_example()
    if final:
        try:
            implementation = implementation_path(name, fn)
            record = case_record(implementation=implementation, fn=fn, family=family, batch=batch, index=index,
                                 mismatch=mismatch, deviation=deviation, hypothesis=hypothesis)
            directory = case_files.cases_dir()
            if directory is None:
                message += f"\ncase file: not written ({case_files.CASES_DIR_ENV} is off)"
            else:
                path = case_files.write_case(record, directory)
                shown = case_files.display_path(path)
                impl = "" if implementation in ADAPTERS else f" --impl {implementation}"
                message += f"\ncase file: {shown}\nreplay: rope-harness repro {shown}{impl}"
        except Exception as exc:     # noqa: BLE001 - the mismatch is reported all the same
            message += f"\n(case file not written: {type(exc).__name__}: {exc})"
    raise AssertionError(message)


# ------------------------------------------------------------------------------------------ load
def _segment(where: str, raw) -> Text | Image | Video:
    if not isinstance(raw, dict) or len(set(raw) & {"text", "image", "video"}) != 1:
        raise ValueError(f"{where}: must be an object with exactly one of 'text', 'image', 'video'")
    if "text" in raw:
        if set(raw) != {"text"} or not case_files.is_int(raw["text"]) or not 0 <= raw["text"] <= MAX_TEXT:
            raise ValueError(f"{where}.text={raw.get('text')!r}: must be an int in [0, {MAX_TEXT}] and alone")
        return Text(raw["text"])
    key = "image" if "image" in raw else "video"
    grid = raw[key]
    if not isinstance(grid, list) or len(grid) != 3 or not all(case_files.is_int(v) for v in grid):
        raise ValueError(f"{where}.{key}={grid!r}: must be a list [t, h, w] of ints")
    t, h, w = grid
    if not (1 <= t <= MAX_FRAMES and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
        raise ValueError(f"{where}.{key}={grid!r}: t must be in [1, {MAX_FRAMES}], h and w in [1, {MAX_SIDE}]")
    if key == "image":
        if set(raw) != {"image"}:
            raise ValueError(f"{where}: unknown fields {sorted(set(raw) - {'image'})}")
        return Image(tuple(grid))
    extra = set(raw) - {"video", "second_per_grid", "timestamp_tokens"}
    if extra:
        raise ValueError(f"{where}: unknown fields {sorted(extra)}")
    spg, ts = raw.get("second_per_grid", 1.0), raw.get("timestamp_tokens", 1)
    if isinstance(spg, bool) or not isinstance(spg, (int, float)) or not math.isfinite(spg) or not 0 < spg <= 1e6:
        raise ValueError(f"{where}.second_per_grid={spg!r}: must be a finite number in (0, 1e6]")
    if not case_files.is_int(ts) or not 0 <= ts <= 64:
        raise ValueError(f"{where}.timestamp_tokens={ts!r}: must be an int in [0, 64]")
    return Video(tuple(grid), second_per_grid=float(spg), timestamp_tokens=ts)


def prompt_from_dict(where: str, raw) -> Prompt:
    if not isinstance(raw, dict) or set(raw) != {"spatial_merge_size", "segments"}:
        raise ValueError(f"{where}: must be an object with 'spatial_merge_size' and 'segments'")
    merge, segments = raw["spatial_merge_size"], raw["segments"]
    if not case_files.is_int(merge) or not 1 <= merge <= 16:
        raise ValueError(f"{where}.spatial_merge_size={merge!r}: must be an int in [1, 16]")
    if not isinstance(segments, list) or not 1 <= len(segments) <= MAX_SEGMENTS:
        raise ValueError(f"{where}.segments: must be a list of 1 to {MAX_SEGMENTS} segments")
    try:
        return Prompt(tuple(_segment(f"{where}.segments[{i}]", s) for i, s in enumerate(segments)), merge)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _tokens(prompt: Prompt) -> int:
    """An upper bound of the prompt's tokens in any family's layout (checked before laying it out)."""
    total = 0
    for seg in prompt.segments:
        if isinstance(seg, Text):
            total += seg.length
        else:
            t, h, w = seg.grid_thw
            total += t * (h * w + h + 4 + getattr(seg, "timestamp_tokens", 0))
    return total


@dataclass(frozen=True)
class PositionIdsCase:
    path: Path
    record: dict
    family: str
    batch: PromptBatch

    @property
    def id(self) -> str:
        return self.record["id"]

    @property
    def implementation(self) -> str:
        return self.record["implementation"]


def load(path: Path | str) -> PositionIdsCase:
    """Read and validate a position-id case file; any problem is a ValueError naming file and field."""
    path = Path(path)

    def bad(problem: str) -> ValueError:
        return ValueError(f"case file {path}: {problem}")

    record, _ = case_files.read_header(path, KIND)
    for name in FIELDS:
        if name not in record:
            raise bad(f"missing field {name!r}")
        if record[name] is None and name not in NULLABLE:
            raise bad(f"{name}=null: must have a value")
    for name in ("id", "implementation", "created"):
        if not isinstance(record[name], str) or not record[name]:
            raise bad(f"{name}={record[name]!r}: must be a non-empty string")
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
        tokens = sum(_tokens(p) for p in prompts)
        if tokens > MAX_TOKENS:
            raise ValueError(f"batch: about {tokens} tokens: must be at most {MAX_TOKENS}")
        batch = PromptBatch(prompts, tuple(raw["pads"]), raw["side"])
    except ValueError as exc:
        raise bad(str(exc)) from None
    index = record["prompt_index"]
    if not case_files.is_int(index) or not 0 <= index < len(prompts):
        raise bad(f"prompt_index={index!r}: must be an int in [0, {len(prompts)})")
    diagnosis = record["diagnosis"]
    if not isinstance(diagnosis, dict) or diagnosis.get("label") not in LABELS:
        raise bad(f"diagnosis: must be an object whose label is one of {LABELS}")
    return PositionIdsCase(path, record, record["family"], batch)


# ------------------------------------------------------------------------------------------ replay
def resolve_recorded(name: str, source: str, trusted: tuple[str, ...] = ()) -> Callable:
    """A registered adapter only: a module path stored in a case file is never imported
    (``trusted`` packages excepted: the suite's own mutants, for its corpus)."""
    return registry.resolve_recorded(name, source=source, registered=ADAPTERS, get=get_position_ids_implementation,
                                     option="--rope-position-ids-impl", trusted=trusted)


def replay(path: Path | str, *, impl: str | None = None) -> tuple[PositionIdsCase, str, BatchCheck]:
    """Replay a position-id case file against its implementation (or ``impl``); ValueError when it
    cannot be replayed (bad file, unknown or unsupported implementation, a crash)."""
    case = load(path)
    name = impl or case.implementation
    fn = get_position_ids_implementation(impl) if impl else resolve_recorded(
        name, f"case file {case_files.display_path(case.path)}")
    reason = unsupported_reason(name, fn, case.family)
    if reason:
        raise ValueError(reason)
    from rope.harness.deadline import ImplementationHung
    try:
        result = check(fn, case.family, case.batch)
    except ImplementationHung:
        raise ValueError(f"{name} did not return on case {case.id} within the call deadline "
                         f"($ROPE_CALL_TIMEOUT, default 120 s)") from None
    except Exception as exc:    # noqa: BLE001 - a crash of the implementation or a wrong return value
        raise ValueError(f"{name} failed on case {case.id} ({type(exc).__name__}: {exc})") from exc
    return case, name, result


def run_repro(path: Path | str, impl: str | None) -> int:
    """The ``repro`` subcommand for a position-id case file: 0 fixed, 1 still differs, 2 cannot replay."""
    try:
        case, name, result = replay(path, impl=impl)
    except ValueError as exc:
        print(f"rope-harness repro: {exc}", file=sys.stderr)
        return 2
    rec = case.record
    print(f"replaying {case_files.display_path(case.path)}: position ids, case {case.id}, recorded {rec['implementation']} "
          f"({rec['created']}) on {case.family}: {rec['diagnosis']['label']}")
    if result.ok:
        print(f"{name} matches the expected position ids on every prompt of the batch: fixed", flush=True)
        return 0
    for index, mismatch, deviation in result.mismatches:
        print(f"{name} still differs on prompt {index} ({case.batch.prompts[index]!r}):\n{mismatch.describe()}")
        if deviation is not None:
            print(f"expected value pinned by: {deviation.reason}")
    return 1
