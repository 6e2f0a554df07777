"""The catalogue of real models (``models.yaml`` at the repository root, shipped inside the package:
``rope/models.yaml`` links to it in a checkout and is a copy in a built wheel).

``load_models()`` reads it into ``ModelConfig`` objects, each carrying the model's ``RopeSpec``;
``get_model("qwen2.5-vl-7b")`` returns one.  Every value in the file names its source, and a bad
entry raises ``ValueError`` prefixed with the model key: ``glm-ocr: sections=(16, 24, 23): must sum
to rotary_dim/2 = 64 (got 63)``.

The spec's ``max_position`` is the cos/sin cache length, not ``max_position_embeddings``: vLLM sizes
the M-RoPE cache at 4x (Qwen2.5-VL video temporal positions can exceed the sequence length, docs/spec.md §1);
XD-RoPE and 1-D RoPE use 1x; and never fewer rows than the positions the engine admits under the
entry's scaling (``rope.spec_scaling.admitted_length``: YaRN's original length x factor, ...).

An entry may give its rope config's ``scaling`` (a ``RopeScaling`` mapping: rope_type and its
parameters, docs/spec.md §1.1) and, for a model whose layer types rotate differently (Gemma 3 and 4),
the ``layer_type`` it describes: one entry per layer type, sharing the hf_id.
"""

from __future__ import annotations

import functools
import re
import types
from dataclasses import dataclass
from pathlib import Path

import yaml

from rope.spec import RopeSpec
from rope.spec_hf import ALREADY_SCALED_FAMILIES
from rope.spec_scaling import admitted_length

DEFAULT_PATH = Path(__file__).resolve().parent / "models.yaml"
ROPE_KINDS = ("mrope", "xdrope", "2d", "1d")   # 2d: two rows (y, x) over an image, HunyuanImage-3.0
MROPE_CACHE_FACTOR = 4

_SPEC_FIELDS = ("head_size", "rotary_dim", "is_neox_style", "sections", "layout", "base", "ntk_alpha")
_FIELDS = ("hf_id", "family", "rope_kind", "num_q_heads", "num_kv_heads", "max_position_embeddings") + _SPEC_FIELDS
_OPTIONAL = ("notes", "scaling", "layer_type")
_UNSOURCED = ("hf_id", "family", "rope_kind", "layer_type")  # names, not numbers
_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")


@dataclass(frozen=True)
class ModelConfig:
    """One catalogue entry: the model's RoPE spec plus what tensor parallelism needs."""

    key: str
    hf_id: str
    family: str
    num_q_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    rope_kind: str
    sources: types.MappingProxyType  # field -> where its value comes from
    spec: RopeSpec
    notes: str = ""
    layer_type: str | None = None    # the layer type of a per-layer rope config this entry describes

    def sharded(self, tp: int) -> tuple[int, int]:
        """Per-rank (q heads, kv heads) under tensor parallelism ``tp``, as vLLM splits them.

        Query heads must divide evenly.  KV heads are split when there are at least ``tp`` of
        them (and must divide evenly), otherwise replicated so every rank holds one (``tp`` must
        then be a multiple of them).
        """
        if not _is_int(tp) or tp <= 0:
            raise ValueError(f"{self.key}: tp={tp!r}: must be a positive int")
        q, kv = self.num_q_heads, self.num_kv_heads
        if q % tp:
            raise ValueError(f"{self.key}: tp={tp}: must divide num_q_heads={q} (remainder {q % tp})")
        if kv >= tp and kv % tp:
            raise ValueError(f"{self.key}: tp={tp}: must divide num_kv_heads={kv} (remainder {kv % tp})")
        if kv < tp and tp % kv:
            raise ValueError(f"{self.key}: tp={tp}: must be a multiple of num_kv_heads={kv} to replicate them "
                             f"(remainder {tp % kv})")
        return q // tp, max(1, kv // tp)


def load_models(path: str | Path | None = None) -> dict[str, ModelConfig]:
    """Read a catalogue (default: ``models.yaml`` at the repository root) into ``{key: ModelConfig}``."""
    if path is None:
        return dict(_load_default())
    return _load(Path(path))


def get_model(key: str) -> ModelConfig:
    """The catalogue entry ``key`` (e.g. ``"qwen2.5-vl-7b"``) from the default catalogue."""
    models = _load_default()
    if key not in models:
        raise KeyError(f"model={key!r}: not in {DEFAULT_PATH.name} (known: {', '.join(sorted(models))})")
    return models[key]


@functools.lru_cache(maxsize=1)
def _load_default() -> types.MappingProxyType:
    return types.MappingProxyType(_load(DEFAULT_PATH))


def _load(path: Path) -> dict[str, ModelConfig]:
    with open(path, encoding="utf-8") as f:
        raw = yaml.load(f, Loader=_UniqueKeyLoader)
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path.name}: top level must be a non-empty mapping of model key -> entry "
                         f"(got {type(raw).__name__})")
    return {key: _parse(key, entry) for key, entry in raw.items()}


def _parse(key, entry) -> ModelConfig:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"key={key!r}: must be a short lowercase id like 'qwen2.5-vl-7b'")

    def bad(field, value, rule, actual):
        return ValueError(f"{key}: {field}={value!r}: {rule} ({actual})")

    if not isinstance(entry, dict):
        raise bad("entry", entry, "must be a mapping of fields", f"got {type(entry).__name__}")
    for field in entry:
        if field not in _FIELDS + _OPTIONAL + ("sources",):
            raise bad(field, entry[field], "unknown field", f"known: {', '.join(_FIELDS + _OPTIONAL)}, sources")
    for field in _FIELDS + ("sources",):
        if field not in entry:
            raise ValueError(f"{key}: {field}=<missing>: every entry needs this field (absent)")

    for field in ("hf_id", "family"):
        if not isinstance(entry[field], str) or not entry[field]:
            raise bad(field, entry[field], "must be a non-empty string", f"got {type(entry[field]).__name__}")
    if "/" not in entry["hf_id"]:
        raise bad("hf_id", entry["hf_id"], "must be 'owner/name'", "no '/'")
    for field in ("num_q_heads", "num_kv_heads", "max_position_embeddings"):
        if not _is_int(entry[field]) or entry[field] <= 0:
            raise bad(field, entry[field], "must be a positive int", f"got {type(entry[field]).__name__}")
    q, kv = entry["num_q_heads"], entry["num_kv_heads"]
    if q % kv:
        raise bad("num_kv_heads", kv, f"must divide num_q_heads={q}", f"remainder {q % kv}")
    base = entry["base"]
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise bad("base", base, "must be a number (write 1000000.0, not 1e6: YAML reads that as a string)",
                  f"got {type(base).__name__}")

    kind, sections, alpha = entry["rope_kind"], entry["sections"], entry["ntk_alpha"]
    if kind not in ROPE_KINDS:
        raise bad("rope_kind", kind, f"must be one of {ROPE_KINDS}", f"got {kind!r}")
    if (kind == "1d") != (sections is None):
        raise bad("sections", sections, "must be null exactly when rope_kind is '1d'", f"rope_kind={kind!r}")
    if sections is not None and not isinstance(sections, list):
        raise bad("sections", sections, "must be a list of ints or null", f"got {type(sections).__name__}")
    if kind == "mrope" and len(sections) != 3:
        raise bad("sections", sections, "M-RoPE needs 3 rows (t, h, w)", f"got {len(sections)}")
    if kind == "xdrope" and len(sections) not in (3, 4):
        raise bad("sections", sections, "XD-RoPE needs 3 or 4 rows", f"got {len(sections)}")
    if kind == "2d" and len(sections) != 2:
        raise bad("sections", sections, "2-D RoPE needs 2 rows (y, x)", f"got {len(sections)}")
    if kind == "xdrope" and entry["layout"] != "chunked":
        raise bad("layout", entry["layout"], "XD-RoPE is chunked", f"rope_kind={kind!r}")
    if alpha is not None and kind != "xdrope":
        raise bad("ntk_alpha", alpha, "must be null unless rope_kind is 'xdrope'", f"rope_kind={kind!r}")

    sources = _parse_sources(key, entry)
    scaling, layer_type = entry.get("scaling"), entry.get("layer_type")
    if scaling is not None and not isinstance(scaling, dict):
        raise bad("scaling", scaling, "must be a mapping (rope_type and its parameters) or absent",
                  f"got {type(scaling).__name__}")
    if layer_type is not None and (not isinstance(layer_type, str) or not layer_type):
        raise bad("layer_type", layer_type, "must be a layer type's name or absent", f"got {type(layer_type).__name__}")
    try:
        spec = RopeSpec(head_size=entry["head_size"], rotary_dim=entry["rotary_dim"],
                        is_neox_style=entry["is_neox_style"],
                        sections=None if sections is None else tuple(sections),
                        layout=entry["layout"], base=float(base), max_position=1, ntk_alpha=alpha, scaling=scaling)
        spec = RopeSpec.from_dict(spec.to_dict() | {"max_position": cache_length(entry, kind, spec)})
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None
    notes = entry.get("notes", "")
    if not isinstance(notes, str):
        raise bad("notes", notes, "must be a string", f"got {type(notes).__name__}")
    return ModelConfig(key=key, hf_id=entry["hf_id"], family=entry["family"], num_q_heads=q, num_kv_heads=kv,
                       max_position_embeddings=entry["max_position_embeddings"], rope_kind=kind,
                       sources=sources, spec=spec, notes=notes, layer_type=layer_type)


def cache_length(entry: dict, kind: str, spec: RopeSpec) -> int:
    """An entry's cache rows: max_position_embeddings (x4 for M-RoPE), and at least the positions the
    engine admits under its scaling (docs/spec.md §1.1; Gemma 3's length is scaled already)."""
    mpe = entry["max_position_embeddings"]
    admitted = admitted_length(spec.scaling, mpe, already_scaled=entry["family"] in ALREADY_SCALED_FAMILIES)
    return max(mpe * (MROPE_CACHE_FACTOR if kind == "mrope" else 1), admitted)


def _parse_sources(key: str, entry: dict) -> types.MappingProxyType:
    """Every value (except names) needs a non-empty source; sources for absent fields are errors."""
    sources = entry["sources"]
    if not isinstance(sources, dict):
        raise ValueError(f"{key}: sources={sources!r}: must be a mapping field -> source "
                         f"(got {type(sources).__name__})")
    needed = [f for f in _FIELDS if f not in _UNSOURCED and entry[f] is not None]
    if entry["sections"] is None:
        needed.remove("layout")  # 1-D RoPE: the layout is a placeholder, not a claim
    if entry.get("scaling") is not None:
        needed.append("scaling")
    for field in sources:
        if field not in needed:
            raise ValueError(f"{key}: sources.{field}={sources[field]!r}: names no sourced field "
                             f"(sourced: {', '.join(needed)})")
    for field in needed:
        src = sources.get(field)
        if not isinstance(src, str) or not src.strip():
            raise ValueError(f"{key}: sources.{field}={src!r}: every value needs a source "
                             f"(value {field}={entry[field]!r})")
    return types.MappingProxyType(dict(sources))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a repeated mapping key (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ValueError(f"{key}=<repeated>: keys must be unique in a mapping "
                                 f"(second one at line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
