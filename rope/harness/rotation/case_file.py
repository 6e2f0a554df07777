"""The rotation's kind of case file (registered with the envelope, rope.harness.case_files): its
record, its loader and its id.  The replay is rope.harness.rotation.replay.

Schema version 1 (every top-level key is required but ``kind``; ``hypothesis``
and ``test`` may be null)::

    schema_version     1
    kind               "rotation"
    id                 16 hex digits: sha256 of (implementation, device, case incl. spec)
    implementation     registered name or "package.module:callable" (what --impl takes)
    device             harness device name: cpu, cuda, rocm, xpu
    working_precision  the implementation's declared working precision ("float32" | "activation")
    spec               RopeSpec.to_dict()
    case               the rest of the RotationCase: num_tokens, num_q_heads, num_kv_heads, dtype,
                       positions_kind, packed_qkv, seed, nonfinite, view, cache_dtype, generator
                       (tensors regenerate from these, bit for bit; nonfinite may be absent: false;
                       view, how q and k lie in memory, one of rope.harness.rotation.cases.VIEWS but
                       packed-qkv, may be absent: contiguous; cache_dtype may be absent or null: the
                       activation dtype; generator, what makes the tensors from the seed, one of
                       rope.harness.rotation.cases.GENERATORS, may be absent: torch-cpu), and how the failing call was made: mode ("eager", "compile", "graph";
                       absent: eager) and, in graph mode, replay_tokens (the real tokens of each
                       replay after the capture)
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
    diagnosis          {"label", "sentence", "location"} (rope.harness.rotation.diagnosis)
    versions           python, torch, triton, transformers, hypothesis, rope-harness (null if absent),
                       plus device_name and TRITON_INTERPRET
    created            ISO 8601 UTC time of writing

The ``case`` record turns back into a ``rope.harness.rotation.cases.RotationCase``, which
regenerates the tensors.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from rope.devices import DEVICE_NAMES
from rope.harness import case_files
from rope.harness.case_files import LoadedCase, finite, is_int, read_fields, tensor_digest, versions
from rope.harness.rotation.cases import DTYPES, GENERATORS, POSITION_KINDS, VIEWS, RotationCase, RotationInputs
from rope.harness.rotation.diagnosis import Diagnosis, channel_location
from rope.implementation import WORKING_PRECISIONS
from rope.registry import get_implementation, working_precision
from rope.spec import RopeSpec

SCHEMA_VERSION = 1
KIND = case_files.register_kind("rotation", SCHEMA_VERSION)

FIELDS = ("schema_version", "id", "implementation", "device", "working_precision", "spec", "case", "strides",
          "inputs_sha256", "hypothesis", "test", "result", "diagnosis", "versions", "created")
NULLABLE = ("hypothesis", "test")
CASE_FIELDS = ("num_tokens", "num_q_heads", "num_kv_heads", "dtype", "positions_kind", "packed_qkv", "seed",
               "nonfinite", "view", "cache_dtype", "generator")
# Fields added after schema 1 was first written: a file without them gets the default.
CASE_FIELD_DEFAULTS = {"nonfinite": False, "view": "contiguous", "cache_dtype": None, "generator": "torch-cpu"}
# The views a case file records (a packed qkv tensor is packed_qkv: true, view "contiguous").
RECORDED_VIEWS = tuple(v for v in VIEWS if v != "packed-qkv")
# How the failing call was made, beside the case (a file without them: eagerly): "compile" under
# torch.compile; "graph" captured in a CUDA graph on the case's inputs, then replayed once per entry
# of replay_tokens with the inputs of seed + i and that many real tokens (padding rows after them).
MODES = ("eager", "compile", "graph")
MODE_FIELD_DEFAULTS = {"mode": "eager", "replay_tokens": []}
MAX_REPLAYS = 16
RESULT_FIELDS = ("num_elements", "num_mismatched", "worst_ratio", "problems", "worst")
DIAGNOSIS_FIELDS = ("label", "sentence", "location")
# Bounds on what a case file may ask a replay to build (a file from a stranger must not allocate
# without limit or run for minutes unannounced): tokens, heads, the seed torch's generator takes,
# and the elements of q, k and the cos/sin cache together (float64 copies of them are made).
MAX_TOKENS = 1 << 17
MAX_HEADS = 1024
MAX_SEED = (1 << 64) - 1
MAX_ELEMENTS = 1 << 28


def case_id(implementation: str, device: str, case: dict) -> str:
    """Stable id of a mismatch: the same implementation, device and case give the same id (a
    field added later, at its default, does not change the id of a case that predates it)."""
    defaults = {**CASE_FIELD_DEFAULTS, **MODE_FIELD_DEFAULTS}
    case = {k: v for k, v in case.items() if not (k in defaults and v == defaults[k])}
    key = json.dumps({"implementation": implementation, "device": device, "case": case},
                     sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def implementation_path(name: str, fn) -> str:
    """A string the rotation registry (``get_implementation``) resolves to ``fn`` (rope.harness.case_files'
    rule): what a replay of the case file runs."""
    return case_files.implementation_path(name, fn, resolve=get_implementation)


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
                test: str | None = None, mode: str = "eager", replay_tokens=()) -> dict:
    """The case file's contents.  ``case`` is ``RotationCase.to_dict()`` (spec included); ``mode`` and
    ``replay_tokens`` how the failing call was made (MODES)."""
    spec = RopeSpec.from_dict(case["spec"])
    case = {**case, "mode": mode, "replay_tokens": list(replay_tokens)}
    record = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "id": case_id(implementation, device, case),
        "implementation": implementation,
        "device": device,
        "working_precision": working_precision,
        "spec": case["spec"],
        "case": {k: case[k] for k in (*CASE_FIELDS, *MODE_FIELD_DEFAULTS)},
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
    return finite(record)


@dataclass(frozen=True)
class CaseFile(LoadedCase):
    """A loaded rotation case file.  ``case`` is a ``rope.harness.rotation.cases.RotationCase``."""
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

    @property
    def mode(self) -> str:
        """How the failing call was made: "eager", "compile" or "graph" (MODES)."""
        return self.record["case"]["mode"]

    @property
    def replay_tokens(self) -> list[int]:
        """In graph mode, the real tokens of each replay after the capture (MODES)."""
        return list(self.record["case"]["replay_tokens"])


def load_case(path: Path | str) -> CaseFile:
    """Read and validate a case file.  Any problem is a ``ValueError`` naming the file and the
    field: unreadable or corrupt JSON, a missing field, a wrong type or value, a schema version
    newer than this code understands."""
    path = Path(path)
    record, bad = read_fields(path, KIND, FIELDS, NULLABLE)
    if record["device"] not in DEVICE_NAMES:
        raise bad(f"device={record['device']!r}: must be one of {DEVICE_NAMES}")
    if record["working_precision"] not in WORKING_PRECISIONS:
        raise bad(f"working_precision={record['working_precision']!r}: must be one of {WORKING_PRECISIONS}")
    for name, fields in (("case", CASE_FIELDS), ("result", RESULT_FIELDS), ("diagnosis", DIAGNOSIS_FIELDS)):
        if not isinstance(record[name], dict):
            raise bad(f"{name}: must be a JSON object (got {type(record[name]).__name__})")
        if name == "case":
            record[name] = {**CASE_FIELD_DEFAULTS, **MODE_FIELD_DEFAULTS, **record[name]}
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

    c = record["case"]
    unknown = set(c) - set(CASE_FIELDS) - set(MODE_FIELD_DEFAULTS)
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
                           ("view", c["view"] in RECORDED_VIEWS and (c["view"] == "contiguous" or not c["packed_qkv"]),
                            f"one of {RECORDED_VIEWS}, and 'contiguous' with packed_qkv: true"),
                           ("cache_dtype", c["cache_dtype"] is None or c["cache_dtype"] in DTYPES,
                            f"null or one of {tuple(DTYPES)}"),
                           ("generator", c["generator"] in GENERATORS, f"one of {GENERATORS}"),
                           ("seed", is_int(c["seed"]) and 0 <= c["seed"] <= MAX_SEED, "an int in [0, 2**64 - 1]")):
        if not ok:
            value = repr(c[name]) if len(repr(c[name])) <= 40 else f"{repr(c[name])[:20]}...({len(repr(c[name]))} chars)"
            raise bad(f"case.{name}={value}: must be {rule}")
    gaps = 3 if c["view"] in ("row-gaps", "same-buffer") else 0       # a gap of head_size per row of q and k
    width = (c["num_q_heads"] + 2 * c["num_kv_heads"] + gaps) * spec.head_size
    elements = c["num_tokens"] * width + spec.max_position * spec.rotary_dim
    if elements > MAX_ELEMENTS:
        raise bad(f"case: num_tokens x (num_q_heads + 2 num_kv_heads) x head_size + spec.max_position x "
                  f"spec.rotary_dim = {elements} elements: must be at most {MAX_ELEMENTS}")
    _check_mode(c, bad)
    case = RotationCase(spec=spec, **{k: c[k] for k in CASE_FIELDS})
    return CaseFile(path, record, case)


def _check_mode(c: dict, bad) -> None:
    """The case's mode and graph replays (MODES), or a ValueError naming the field."""
    if c["mode"] not in MODES:
        raise bad(f"case.mode={c['mode']!r}: must be one of {MODES}")
    tokens = c["replay_tokens"]
    if not isinstance(tokens, list) or len(tokens) > MAX_REPLAYS or not all(
            is_int(n) and 1 <= n <= max(1, c["num_tokens"]) for n in tokens):
        shown = repr(tokens) if len(repr(tokens)) <= 40 else f"{repr(tokens)[:20]}...({len(repr(tokens))} chars)"
        raise bad(f"case.replay_tokens={shown}: must be a list of at most {MAX_REPLAYS} ints in "
                  f"[1, case.num_tokens]")
    if (c["mode"] == "graph") != bool(tokens):
        raise bad(f"case.replay_tokens={tokens!r}: a graph-mode case lists its replays, any other none "
                  f"(case.mode={c['mode']!r})")


def input_layout(inputs: RotationInputs) -> dict:
    """Shape, stride and storage offset of q and k as the implementation received them."""
    def layout(t):
        return None if t is None else {"shape": list(t.shape), "stride": list(t.stride()),
                                       "storage_offset": t.storage_offset()}
    return {"query": layout(inputs.query), "key": layout(inputs.key)}


def input_digests(inputs: RotationInputs) -> dict:
    """sha256 of the CPU inputs; for the cache, of the rows the positions select (what is read:
    model caches hold up to a million rows)."""
    rows = inputs.cache[torch.unique(inputs.positions.long())] if inputs.positions.numel() else inputs.cache[:0]
    return {"positions": tensor_digest(inputs.positions), "query": tensor_digest(inputs.query),
            "key": tensor_digest(inputs.key), "cos_sin_cache_rows": tensor_digest(rows)}


def write_case_file(implementation: str, fn, case: RotationCase, device: str, run,
                    diagnosis: Diagnosis, hypothesis: dict | None, *, mode: str = "eager",
                    replay_tokens=()) -> tuple[Path | None, str | None]:
    """Write the mismatch's case file (:func:`case_record`) to :func:`rope.harness.case_files.cases_dir`
    and set ``run.case_file`` (``run``: the check's rope.harness.rotation.check.CaseRun): returns (path, None), or (None, note) when case files are turned
    off or the file cannot be written (the note says why).  Building the record may raise."""
    record = case_record(
        implementation=implementation, device=device, working_precision=working_precision(fn),
        case=case.to_dict(), strides=input_layout(run.inputs), inputs_sha256=input_digests(run.ref_in),
        comparison=run.comparison, diagnosis=diagnosis, hypothesis=hypothesis,
        test=os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or None, mode=mode,
        replay_tokens=replay_tokens)
    directory = case_files.cases_dir()
    if directory is None:
        return None, f"not written ({case_files.CASES_DIR_ENV}={os.environ.get(case_files.CASES_DIR_ENV)!r})"
    try:
        path = case_files.write_case(record, directory)
    except Exception as exc:      # noqa: BLE001 - an unwritable directory is a line of the message
        return None, f"not written to {directory} ({type(exc).__name__}: {exc})"
    run.case_file = str(path)
    return path, None
