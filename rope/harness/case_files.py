"""Case files: a mismatch, recorded well enough to replay it on any machine.

Every case file is a JSON object with ``schema_version`` and ``kind``: ``"rotation"`` (this module's
records; a file without ``kind`` is read as one) or ``"position_ids"``
(rope.harness.position_ids.cases).  :func:`read_header` is the one reader of both: the JSON, the
schema version and the kind, each a ValueError naming the file and the field.

When the suite's check (``rope.harness.comparison``) finds a mismatch it writes
``reports/cases/<id>.json`` (or ``$ROPE_CASES_DIR/<id>.json``); ``rope-harness repro FILE`` and
``pytest --rope-repro FILE`` replay it.  Promoting a case to the regression corpus is copying
the file into ``properties/regressions/``.

The rotation kind, schema version 1 (every top-level key is required but ``kind``; ``hypothesis``
and ``test`` may be null)::

    schema_version     1
    kind               "rotation"
    id                 16 hex digits: sha256 of (implementation, device, case incl. spec)
    implementation     registered name or "package.module:callable" (what --impl takes)
    device             harness device name: cpu, cuda, rocm, xpu
    working_precision  the implementation's declared working precision ("float32" | "activation")
    spec               RopeSpec.to_dict()
    case               the rest of the RotationCase: num_tokens, num_q_heads, num_kv_heads, dtype,
                       positions_kind, packed_qkv, seed, nonfinite (tensors regenerate from these, bit
                       for bit; nonfinite may be absent: false)
    strides            {"query": {shape, stride, storage_offset}, "key": {...} | null}, as the
                       implementation received them on the device
    inputs_sha256      sha256 of the regenerated CPU inputs (positions, query, key, and the
                       cos_sin_cache rows the positions select): a replay checks it regenerated
                       the very same bits
    hypothesis         {"version", "reproduce_blob", "decorator"} of the failing example, or null
                       outside Hypothesis
    test               the pytest node id that failed, or null
    result             {"num_elements", "num_mismatched", "worst_ratio", "problems", "worst": [
                        {tensor, token, head, channel, freq, member, row | pass_through, got,
                         expected, error, bound, ratio}, ...]}
    diagnosis          {"label", "sentence", "location"} (rope.harness.diagnosis)
    versions           python, torch, triton, transformers, hypothesis, rope-harness (null if absent),
                       plus device_name and TRITON_INTERPRET
    created            ISO 8601 UTC time of writing

Non-finite floats (an infinite error/bound ratio, a NaN output) are written as the strings
"inf", "-inf", "nan", so files are strict JSON.

Writing is atomic (temporary file in the same directory, fsync, ``os.replace``): safe with
pytest-xdist workers and concurrent runs; the same mismatch (same id) overwrites its own file.
``ROPE_CASES_DIR`` picks the directory; ``ROPE_CASES_DIR=off`` (or ``0``, ``none``, empty) turns
case files off.

The ``case`` record turns back into a ``rope.harness.inputs.RotationCase``, which regenerates
the tensors.

The position_ids kind, schema version 1 (every key required, ``hypothesis`` and ``test`` may be
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

import contextlib
import hashlib
import json
import math
import os
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable

from rope.harness.atomic import atomic_write
from rope.harness.causes import LINE_WIDTH
from rope.devices import DEVICE_NAMES
from rope.harness.diagnosis import Diagnosis, channel_location
from rope.implementation import WORKING_PRECISIONS, Implementation
from rope.registry import get_implementation
from rope.spec import RopeSpec
from rope.prompts import FAMILIES, Audio, Image, Prompt, PromptBatch, Text, Video
from rope.harness.position_ids.diagnosis import LABELS, PositionIdsMismatch

SCHEMA_VERSION = 1
KIND = "rotation"
# Each kind of case file and the newest schema version this code reads of it.
KINDS = {"rotation": SCHEMA_VERSION, "position_ids": 1}
CASES_DIR_ENV = "ROPE_CASES_DIR"
_OFF = ("", "0", "off", "none", "false", "no")

FIELDS = ("schema_version", "id", "implementation", "device", "working_precision", "spec", "case", "strides",
          "inputs_sha256", "hypothesis", "test", "result", "diagnosis", "versions", "created")
NULLABLE = ("hypothesis", "test")
CASE_FIELDS = ("num_tokens", "num_q_heads", "num_kv_heads", "dtype", "positions_kind", "packed_qkv", "seed",
               "nonfinite")
# Fields added after schema 1 was first written: a file without them gets the default.
CASE_FIELD_DEFAULTS = {"nonfinite": False}
RESULT_FIELDS = ("num_elements", "num_mismatched", "worst_ratio", "problems", "worst")
DIAGNOSIS_FIELDS = ("label", "sentence", "location")
# Bounds on what a case file may ask a replay to build (a file from a stranger must not allocate
# without limit or run for minutes unannounced): tokens, heads, the seed torch's generator takes,
# and the elements of q, k and the cos/sin cache together (float64 copies of them are made).
MAX_TOKENS = 1 << 17
MAX_HEADS = 1024
MAX_SEED = (1 << 64) - 1
MAX_ELEMENTS = 1 << 28


# --------------------------------------------------------------------------- where and who
def cases_dir() -> Path | None:
    """Where case files go: $ROPE_CASES_DIR, else ``cases/`` of the reports directory
    (``./reports/cases``, rope.harness.output_dir.reports_dir); None when turned off."""
    value = os.environ.get(CASES_DIR_ENV)
    if value is None:
        from rope.harness.output_dir import reports_dir
        return reports_dir() / "cases"
    if value.strip().lower() in _OFF:
        return None
    return Path(value)


def case_id(implementation: str, device: str, case: dict) -> str:
    """Stable id of a mismatch: the same implementation, device and case give the same id (a
    field added later, at its default, does not change the id of a case that predates it)."""
    case = {k: v for k, v in case.items() if not (k in CASE_FIELD_DEFAULTS and v == CASE_FIELD_DEFAULTS[k])}
    key = json.dumps({"implementation": implementation, "device": device, "case": case},
                     sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def implementation_path(name: str, fn, resolve=get_implementation) -> str:
    """A string ``resolve`` (default ``get_implementation``) resolves to ``fn``: ``name`` when it
    does, else ``module:qualname`` when that does, else ``name`` (a replay then needs ``--impl``)."""
    candidates = [name]
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if module and qualname and module != "__main__" and "<locals>" not in qualname:
        candidates.append(f"{module}:{qualname}")
    for candidate in candidates:
        try:
            if resolve(candidate) is fn:
                return candidate
        except ValueError:
            continue
    return name


def tensor_digest(t) -> str | None:
    """sha256 of a tensor's values (dtype, shape and bytes in row-major order)."""
    if t is None:
        return None
    import torch
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def versions(device: str) -> dict:
    """Versions of what produced the numbers, and the device's name."""
    out = {"python": platform.python_version()}
    for dist in ("torch", "triton", "transformers", "hypothesis", "rope-harness"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    import torch
    out["torch"] = torch.__version__
    name = platform.processor() or platform.machine()
    with contextlib.suppress(Exception):
        if device in ("cuda", "rocm"):
            name = torch.cuda.get_device_name()
        elif device == "xpu":
            name = torch.xpu.get_device_name()
    out["device_name"] = name
    out["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    return out


# --------------------------------------------------------------------------- record
def _finite(value):
    """Non-finite floats as strings, recursively (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def worst_record(spec: RopeSpec, comparison) -> list[dict]:
    out = []
    for m in comparison.worst:
        d = m.to_dict()
        d.update(channel_location(spec, m.channel))
        d["ratio"] = m.ratio
        out.append(d)
    return out


def case_record(*, implementation: str, device: str, working_precision: str, case: dict, strides: dict,
                inputs_sha256: dict, comparison, diagnosis: Diagnosis, hypothesis: dict | None = None,
                test: str | None = None) -> dict:
    """The case file's contents.  ``case`` is ``RotationCase.to_dict()`` (spec included)."""
    spec = RopeSpec.from_dict(case["spec"])
    record = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "id": case_id(implementation, device, case),
        "implementation": implementation,
        "device": device,
        "working_precision": working_precision,
        "spec": case["spec"],
        "case": {k: case[k] for k in CASE_FIELDS},
        "strides": strides,
        "inputs_sha256": inputs_sha256,
        "hypothesis": hypothesis,
        "test": test,
        "result": {
            "num_elements": comparison.num_elements,
            "num_mismatched": comparison.num_mismatched,
            "worst_ratio": comparison.worst_ratio,
            "problems": list(comparison.problems),
            "worst": worst_record(spec, comparison),
        },
        "diagnosis": diagnosis.to_dict(),
        "versions": versions(device),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return _finite(record)


# The case files this process created (not those it wrote over), in order: a test that ends as an
# expected failure takes back the ones it created (rope.harness.plugin, :func:`remove_created_since`).
_CREATED: list[Path] = []


def write_case(record: dict, directory: Path | str | None = None) -> Path:
    """Write ``record`` to ``<directory>/<id>.json`` atomically; returns the path.

    The text goes to a temporary file in the same directory, is flushed and fsynced, then
    ``os.replace``d over the target: a reader (or a concurrent writer of the same id) only ever
    sees a complete file.
    """
    directory = Path(directory) if directory is not None else cases_dir()
    if directory is None:
        raise ValueError(f"{CASES_DIR_ENV}={os.environ.get(CASES_DIR_ENV)!r}: case files are turned off")
    text = json.dumps(_finite(record), indent=2, allow_nan=False) + "\n"
    target = directory / f"{record['id']}.json"
    existed = target.exists()
    path = atomic_write(target, text.encode("utf-8"))
    if not existed:
        _CREATED.append(path)
    return path


def created_count() -> int:
    """How many case files this process has created: the mark :func:`remove_created_since` takes."""
    return len(_CREATED)


def remove_created_since(mark: int) -> list[Path]:
    """Remove the case files this process created after ``mark`` (a test whose mismatch turned out
    expected: ``pytest.xfail`` called in its body); returns them."""
    removed, _CREATED[mark:] = _CREATED[mark:], []
    for path in removed:
        with contextlib.suppress(OSError):
            path.unlink()
    return removed


# --------------------------------------------------------------------------- load
@dataclass(frozen=True)
class LoadedCase:
    """What every kind of loaded, validated case file has: its path, its record, id and implementation."""
    path: Path
    record: dict

    @property
    def id(self) -> str:
        return self.record["id"]

    @property
    def implementation(self) -> str:
        return self.record["implementation"]


@dataclass(frozen=True)
class CaseFile(LoadedCase):
    """A loaded rotation case file.  ``case`` is a ``rope.harness.inputs.RotationCase``."""
    case: object

    @property
    def device(self) -> str:
        return self.record["device"]

    @property
    def working_precision(self) -> str:
        return self.record["working_precision"]

    @property
    def diagnosis(self) -> Diagnosis:
        return Diagnosis.from_dict(self.record["diagnosis"])


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_record(path: Path) -> dict:
    """A case file's JSON object; any problem is a ValueError naming the file: unreadable, corrupt
    or truncated JSON, something other than an object."""
    def bad(problem: str) -> ValueError:
        return ValueError(f"case file {path}: {problem}")

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bad(f"cannot read it ({exc})") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                  f"the file is corrupt or truncated") from None
    except ValueError as exc:     # e.g. an integer of more digits than Python converts
        raise bad(f"not readable as JSON ({exc})") from None
    if not isinstance(record, dict):
        raise bad(f"must hold a JSON object (got {type(record).__name__})")
    return record


def read_header(path: Path | str, kind: str | None = None) -> tuple[dict, str]:
    """A case file's record and kind, whatever the kind: the JSON object (read_record), a
    ``schema_version`` this code reads for the file's ``kind`` (absent: ``"rotation"``), and, where
    ``kind`` is given, that kind.  Any problem is a ValueError naming the file and the field."""
    path = Path(path)

    def bad(problem: str) -> ValueError:
        return ValueError(f"case file {path}: {problem}")

    record = read_record(path)
    found = record.get("kind", KIND)
    if found not in KINDS:
        raise bad(f"kind={found!r}: must be one of {tuple(KINDS)}")
    if kind is not None and found != kind:
        raise bad(f"kind={found!r}: must be {kind!r} here")
    if "schema_version" not in record:
        raise bad("missing field 'schema_version'")
    version = record["schema_version"]
    if not is_int(version) or version < 1:
        raise bad(f"schema_version={version!r}: must be an int >= 1")
    if version > KINDS[found]:
        raise bad(f"schema_version={version}: newer than this rope-harness understands ({KINDS[found]}); "
                  f"upgrade rope-harness to replay it")
    return record, found


def case_kind(path: Path | str) -> str | None:
    """The kind of the case file at ``path``, or None for anything unreadable (the loader of the
    kind asked for then says what is wrong with it)."""
    try:
        return read_header(path)[1]
    except ValueError:
        return None


def _read_fields(path: Path, kind: str, fields: tuple[str, ...], nullable: tuple[str, ...]):
    """The header (read_header), then what every kind's record holds: each of ``fields`` present,
    non-null unless ``nullable``, and ``id``, ``implementation``, ``created`` non-empty strings.
    Returns the record and the kind loader's ``bad(problem) -> ValueError`` naming the file."""
    def bad(problem: str) -> ValueError:
        return ValueError(f"case file {path}: {problem}")

    record, _ = read_header(path, kind)
    for name in fields:
        if name not in record:
            raise bad(f"missing field {name!r}")
        if record[name] is None and name not in nullable:
            raise bad(f"{name}=null: must have a value")
    for name in ("id", "implementation", "created"):
        if not isinstance(record[name], str) or not record[name]:
            raise bad(f"{name}={record[name]!r}: must be a non-empty string")
    return record, bad


def load_case(path: Path | str) -> CaseFile:
    """Read and validate a case file.  Any problem is a ``ValueError`` naming the file and the
    field: unreadable or corrupt JSON, a missing field, a wrong type or value, a schema version
    newer than this code understands."""
    path = Path(path)
    record, bad = _read_fields(path, KIND, FIELDS, NULLABLE)
    if record["device"] not in DEVICE_NAMES:
        raise bad(f"device={record['device']!r}: must be one of {DEVICE_NAMES}")
    if record["working_precision"] not in WORKING_PRECISIONS:
        raise bad(f"working_precision={record['working_precision']!r}: must be one of {WORKING_PRECISIONS}")
    for name, fields in (("case", CASE_FIELDS), ("result", RESULT_FIELDS), ("diagnosis", DIAGNOSIS_FIELDS)):
        if not isinstance(record[name], dict):
            raise bad(f"{name}: must be a JSON object (got {type(record[name]).__name__})")
        if name == "case":
            record[name] = {**CASE_FIELD_DEFAULTS, **record[name]}
        for sub in fields:
            if sub not in record[name]:
                raise bad(f"missing field '{name}.{sub}'")
    for name in ("spec", "strides", "inputs_sha256", "versions"):
        if not isinstance(record[name], dict):
            raise bad(f"{name}: must be a JSON object (got {type(record[name]).__name__})")
    try:
        spec = RopeSpec.from_dict(record["spec"])
    except (ValueError, TypeError) as exc:
        raise bad(f"spec: {exc}") from None

    from rope.harness.inputs import DTYPES, POSITION_KINDS, RotationCase

    c = record["case"]
    unknown = set(c) - set(CASE_FIELDS)
    if unknown:
        raise bad(f"case: unknown fields {sorted(unknown)}")
    for name, ok, rule in (("num_tokens", is_int(c["num_tokens"]) and 0 <= c["num_tokens"] <= MAX_TOKENS,
                            f"an int in [0, {MAX_TOKENS}]"),
                           ("num_q_heads", is_int(c["num_q_heads"]) and 1 <= c["num_q_heads"] <= MAX_HEADS,
                            f"an int in [1, {MAX_HEADS}]"),
                           ("num_kv_heads", is_int(c["num_kv_heads"]) and 0 <= c["num_kv_heads"] <= MAX_HEADS,
                            f"an int in [0, {MAX_HEADS}]"),
                           ("dtype", c["dtype"] in DTYPES, f"one of {tuple(DTYPES)}"),
                           ("positions_kind", c["positions_kind"] in POSITION_KINDS, f"one of {POSITION_KINDS}"),
                           ("packed_qkv", isinstance(c["packed_qkv"], bool), "true or false"),
                           ("nonfinite", isinstance(c["nonfinite"], bool), "true or false"),
                           ("seed", is_int(c["seed"]) and 0 <= c["seed"] <= MAX_SEED, "an int in [0, 2**64 - 1]")):
        if not ok:
            value = repr(c[name]) if len(repr(c[name])) <= 40 else f"{repr(c[name])[:20]}...({len(repr(c[name]))} chars)"
            raise bad(f"case.{name}={value}: must be {rule}")
    width = (c["num_q_heads"] + 2 * c["num_kv_heads"]) * spec.head_size
    elements = c["num_tokens"] * width + spec.max_position * spec.rotary_dim
    if elements > MAX_ELEMENTS:
        raise bad(f"case: num_tokens x (num_q_heads + 2 num_kv_heads) x head_size + spec.max_position x "
                  f"spec.rotary_dim = {elements} elements: must be at most {MAX_ELEMENTS}")
    case = RotationCase(spec=spec, **{k: c[k] for k in CASE_FIELDS})
    return CaseFile(path, record, case)


# --------------------------------------------------------------------------- message
def display_path(path: Path | str) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def replay_command(shown: str, implementation: str | None = None) -> str:
    """The command that replays the case file at ``shown``, as it must be typed: a replay runs a
    registered name it reads from the file, never a module path stored there, so an implementation
    named by import path (``package.module:callable``) is named again with ``--impl``.  Without
    ``implementation`` the file's own record says it (nothing where it cannot be read)."""
    if implementation is None:
        try:
            implementation = read_record(Path(shown)).get("implementation")
        except ValueError:
            implementation = None
    extra = f" --impl {implementation}" if isinstance(implementation, str) and ":" in implementation else ""
    return f"rope-harness repro {shown}{extra}"


def format_mismatch(*, header: str, diagnosis: Diagnosis, comparison, case, case_path=None,
                    note: str | None = None, implementation: str | None = None) -> str:
    """The mismatch report: header (implementation, device, case id), diagnosis, counts and
    worst elements, the case, then the case file and the command that replays it."""
    # A problem the diagnosis already states (what the implementation raised) is said once.
    said = diagnosis.sentence.split("; ")
    shown_problems = [p for p in comparison.problems if p not in said]
    lines = [header] + [piece for line in [*diagnosis.lines(), *comparison.message(problems=shown_problems).splitlines(),
                                           *describe_case(case)] for piece in wrap(line)]
    if case_path is not None:          # never wrapped: copied as they are
        shown = display_path(case_path)
        lines += [f"case file: {shown}", f"replay: {replay_command(shown, implementation)}"]
    elif note:
        lines.append(f"case file: {note}")
    return "\n".join(lines)


def describe_case(case) -> list[str]:
    """A rotation case in two short lines (the case file holds it whole)."""
    spec = case.spec
    fields = [f"head_size={spec.head_size}", f"rotary_dim={spec.rotary_dim}",
              f"is_neox_style={spec.is_neox_style}", f"sections={spec.sections}", f"layout={spec.layout}",
              f"base={spec.base:g}", f"max_position={spec.max_position}"]
    if spec.ntk_alpha is not None:
        fields.append(f"ntk_alpha={spec.ntk_alpha:g}")
    if spec.freq_rows is not None:
        fields.append(f"freq_rows={''.join(map(str, spec.freq_rows))}")
    extra = [f"positions {case.positions_kind}", f"seed {case.seed}"] + (["NaN/inf planted"] if case.nonfinite else [])
    return [f"case: {case.brief()}; {', '.join(extra)}", f"spec: {', '.join(fields)}"]


def wrap(line: str, width: int = LINE_WIDTH) -> list[str]:
    """A long line of a message as lines of at most ``width`` (continuations indented); a word
    longer than that (a path) stays whole."""
    import textwrap
    if len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


# ======================================================================== the position_ids kind
# Its schema: the module's docstring; the check and the replay: rope/harness/position_ids/cases.py.
POSITION_IDS_KIND = "position_ids"
POSITION_IDS_SCHEMA_VERSION = KINDS[POSITION_IDS_KIND]
POSITION_IDS_FIELDS = ("schema_version", "kind", "id", "implementation", "family", "batch", "prompt_index", "result",
          "known_deviation", "diagnosis", "hypothesis", "test", "versions", "created")
POSITION_IDS_NULLABLE = ("known_deviation", "hypothesis", "test")
# Bounds on what a case file may ask a replay to build: prompts, segments, grid sides, frames.
MAX_PROMPTS = 64
MAX_SEGMENTS = 256
MAX_TEXT = 1 << 16
MAX_SIDE = 1 << 10
MAX_FRAMES = 1 << 10
MAX_PROMPT_TOKENS = 1 << 20
MAX_AUDIO_FRAMES = 1 << 16


def prompt_to_dict(prompt: Prompt) -> dict:
    segments = []
    for seg in prompt.segments:
        if isinstance(seg, Text):
            segments.append({"text": seg.length})
        elif isinstance(seg, Image):
            segments.append({"image": list(seg.grid_thw)})
        elif isinstance(seg, Audio):
            segments.append({"audio": seg.frames})
        else:
            video = {"video": list(seg.grid_thw), "second_per_grid": seg.second_per_grid,
                     "timestamp_tokens": seg.timestamp_tokens}
            if seg.audio_frames is not None:
                video["audio_frames"] = seg.audio_frames
            segments.append(video)
    return {"spatial_merge_size": prompt.spatial_merge_size, "segments": segments}


def batch_to_dict(batch: PromptBatch) -> dict:
    return {"prompts": [prompt_to_dict(p) for p in batch.prompts], "pads": list(batch.pads), "side": batch.side}


def position_ids_case_id(implementation: str, family: str, batch: PromptBatch) -> str:
    key = json.dumps({"implementation": implementation, "family": family, "batch": batch_to_dict(batch)},
                     sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def position_ids_case_record(*, implementation: str, fn: Callable, family: str, batch: PromptBatch, index: int,
                             mismatch: PositionIdsMismatch, deviation, hypothesis: dict | None) -> dict:
    """A position-id case file's contents (the position_ids kind of the module's docstring)."""
    found = versions("cpu")
    found["implementation"] = Implementation.of("", fn, "position_ids").version
    return {
        "schema_version": POSITION_IDS_SCHEMA_VERSION, "kind": POSITION_IDS_KIND,
        "id": position_ids_case_id(implementation, family, batch),
        "implementation": implementation, "family": family, "batch": batch_to_dict(batch), "prompt_index": index,
        "result": mismatch.to_dict(), "known_deviation": list(deviation.keys) if deviation else None,
        "diagnosis": {"label": mismatch.label, "sentence": mismatch.sentence}, "hypothesis": hypothesis,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or None,
        "versions": found, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _audio_frames(where: str, frames) -> int:
    if not is_int(frames) or not 1 <= frames <= MAX_AUDIO_FRAMES:
        raise ValueError(f"{where}={frames!r}: must be an int in [1, {MAX_AUDIO_FRAMES}]")
    return frames


def _segment(where: str, raw) -> Text | Image | Video | Audio:
    if not isinstance(raw, dict) or len(set(raw) & {"text", "image", "video", "audio"}) != 1:
        raise ValueError(f"{where}: must be an object with exactly one of 'text', 'image', 'video', 'audio'")
    if "audio" in raw:
        if set(raw) != {"audio"}:
            raise ValueError(f"{where}: unknown fields {sorted(set(raw) - {'audio'})}")
        return Audio(_audio_frames(f"{where}.audio", raw["audio"]))
    if "text" in raw:
        if set(raw) != {"text"} or not is_int(raw["text"]) or not 0 <= raw["text"] <= MAX_TEXT:
            raise ValueError(f"{where}.text={raw.get('text')!r}: must be an int in [0, {MAX_TEXT}] and alone")
        return Text(raw["text"])
    key = "image" if "image" in raw else "video"
    grid = raw[key]
    if not isinstance(grid, list) or len(grid) != 3 or not all(is_int(v) for v in grid):
        raise ValueError(f"{where}.{key}={grid!r}: must be a list [t, h, w] of ints")
    t, h, w = grid
    if not (1 <= t <= MAX_FRAMES and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
        raise ValueError(f"{where}.{key}={grid!r}: t must be in [1, {MAX_FRAMES}], h and w in [1, {MAX_SIDE}]")
    if key == "image":
        if set(raw) != {"image"}:
            raise ValueError(f"{where}: unknown fields {sorted(set(raw) - {'image'})}")
        return Image(tuple(grid))
    extra = set(raw) - {"video", "second_per_grid", "timestamp_tokens", "audio_frames"}
    if extra:
        raise ValueError(f"{where}: unknown fields {sorted(extra)}")
    spg, ts = raw.get("second_per_grid", 1.0), raw.get("timestamp_tokens", 1)
    if isinstance(spg, bool) or not isinstance(spg, (int, float)) or not math.isfinite(spg) or not 0 < spg <= 1e6:
        raise ValueError(f"{where}.second_per_grid={spg!r}: must be a finite number in (0, 1e6]")
    if not is_int(ts) or not 0 <= ts <= 64:
        raise ValueError(f"{where}.timestamp_tokens={ts!r}: must be an int in [0, 64]")
    audio = raw.get("audio_frames")
    if audio is not None:
        _audio_frames(f"{where}.audio_frames", audio)
    return Video(tuple(grid), second_per_grid=float(spg), timestamp_tokens=ts, audio_frames=audio)


def prompt_from_dict(where: str, raw) -> Prompt:
    if not isinstance(raw, dict) or set(raw) != {"spatial_merge_size", "segments"}:
        raise ValueError(f"{where}: must be an object with 'spatial_merge_size' and 'segments'")
    merge, segments = raw["spatial_merge_size"], raw["segments"]
    if not is_int(merge) or not 1 <= merge <= 16:
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
        elif isinstance(seg, Audio):
            total += seg.frames + 2
        else:
            t, h, w = seg.grid_thw
            total += t * (h * w + h + 4 + getattr(seg, "timestamp_tokens", 0)) \
                + (getattr(seg, "audio_frames", None) or 0) + 2
    return total


@dataclass(frozen=True)
class PositionIdsCase(LoadedCase):
    """A loaded position-id case file: the family and the batch of prompts it replays."""
    family: str
    batch: PromptBatch


def load_position_ids_case(path: Path | str) -> PositionIdsCase:
    """Read and validate a position-id case file; any problem is a ValueError naming file and field."""
    path = Path(path)
    record, bad = _read_fields(path, POSITION_IDS_KIND, POSITION_IDS_FIELDS, POSITION_IDS_NULLABLE)
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
        if tokens > MAX_PROMPT_TOKENS:
            raise ValueError(f"batch: about {tokens} tokens: must be at most {MAX_PROMPT_TOKENS}")
        batch = PromptBatch(prompts, tuple(raw["pads"]), raw["side"])
    except ValueError as exc:
        raise bad(str(exc)) from None
    index = record["prompt_index"]
    if not is_int(index) or not 0 <= index < len(prompts):
        raise bad(f"prompt_index={index!r}: must be an int in [0, {len(prompts)})")
    diagnosis = record["diagnosis"]
    if not isinstance(diagnosis, dict) or diagnosis.get("label") not in LABELS:
        raise bad(f"diagnosis: must be an object whose label is one of {LABELS}")
    return PositionIdsCase(path, record, record["family"], batch)
