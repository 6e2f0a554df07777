"""The model catalogue (models.yaml, rope/models.py).

(a) every entry loads into a valid RopeSpec and every value names its source;
(b) entries agree with the installed transformers (weight-free: default-built configs and rotary
    modules, offline) wherever its defaults describe the model, and the rotary module transformers
    builds rotates with the catalogue's rotary_dim, pairing, axis map and inv_freq;
(c) tensor-parallel sharding of heads, as vLLM splits them;
(d) the loader rejects bad YAML with a message naming the model and the field;
(e) the entries with a scaled rope config (docs/spec.md §1.1): the family's transformers config built
    from the entry reads back into the entry's spec through RopeSpec.from_hf_config, and the rotary
    module transformers builds from it has rope.cache's frequencies bit for bit and its magnitude.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass

import pytest
import torch
import yaml

import reference
from rope.cache import attention_factor, inv_freq
from rope.models import DEFAULT_PATH, MROPE_CACHE_FACTOR, get_model, load_models
from rope.spec import RopeSpec
from rope.spec_hf import ALREADY_SCALED_FAMILIES
from rope.spec_scaling import admitted_length
from tests.reference.scaling_cases import hf_rope_parameters

MODELS = load_models()

# --------------------------------------------------------------------------------------------------
# (a) the catalogue itself

REQUIRED = {  # the models the catalogue promises (docs/spec.md §9)
    "qwen2-vl-2b", "qwen2-vl-7b", "qwen2-vl-72b", "qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen2.5-vl-72b",
    "qwen3-vl-2b", "qwen3-vl-4b", "qwen3-vl-8b", "qwen3-vl-30b-a3b", "qwen3-vl-235b-a22b",
    "glm-4.1v-9b", "glm-4.5v", "glm-ocr", "hunyuan-ocr", "paddleocr-vl", "qwen2.5-omni-7b",
    "glm-4.6v", "glm-4.6v-flash", "ernie-4.5-vl-28b-a3b", "ernie-4.5-vl-424b-a47b", "qwen3.5-9b",
    "hunyuan-image-3.0", "arc-hunyuan-video-7b", "qwen3-omni-30b-a3b",
}


def test_catalogue_covers_required_models():
    missing = REQUIRED - set(MODELS)
    assert not missing, f"models.yaml: missing entries {sorted(missing)}"
    assert len(MODELS) >= 15, f"models.yaml: {len(MODELS)} entries (want >= 15)"
    assert {m.rope_kind for m in MODELS.values()} == {"mrope", "xdrope", "2d", "1d"}
    assert {m.spec.layout for m in MODELS.values()} >= {"chunked", "interleaved", "ernie45", "two_row_interleaved"}


@pytest.mark.parametrize("key", sorted(MODELS))
def test_catalogue_entry_is_valid_and_sourced(key):
    m = MODELS[key]
    spec = m.spec
    assert m.key == key and get_model(key) == m
    factor = MROPE_CACHE_FACTOR if m.rope_kind == "mrope" else 1
    admitted = admitted_length(spec.scaling, m.max_position_embeddings,
                               already_scaled=m.family in ALREADY_SCALED_FAMILIES)
    assert spec.max_position == max(factor * m.max_position_embeddings, admitted), \
        f"{key}: max_position={spec.max_position}: must be {factor} x max_position_embeddings, or the {admitted} " \
        f"positions the engine admits"
    assert spec.num_dims in {"mrope": (3,), "xdrope": (3, 4), "2d": (2,), "1d": (1,)}[m.rope_kind]
    assert (spec.ntk_alpha is not None) == (m.rope_kind == "xdrope")
    assert m.num_q_heads % m.num_kv_heads == 0
    values = {"head_size": spec.head_size, "rotary_dim": spec.rotary_dim, "num_q_heads": m.num_q_heads,
              "num_kv_heads": m.num_kv_heads, "base": spec.base,
              "max_position_embeddings": m.max_position_embeddings, "is_neox_style": spec.is_neox_style,
              "sections": spec.sections, "layout": spec.layout if spec.sections else None,
              "ntk_alpha": spec.ntk_alpha, "scaling": spec.scaling}
    for field, value in values.items():
        if value is not None:
            src = m.sources.get(field, "")
            assert isinstance(src, str) and src.strip(), f"{key}: {field}={value!r}: has no source"
    assert set(m.sources) <= {f for f, v in values.items() if v is not None}


@pytest.mark.parametrize("key", sorted(MODELS))
def test_catalogue_memory_is_marked_unverified(key):
    """A value taken from memory must say so in the words the catalogue header defines."""
    for field, src in MODELS[key].sources.items():
        if "memory" in src or "guess" in src:
            assert "unverified" in src, f"{key}: sources.{field}={src!r}: memory must be marked 'unverified'"


def test_get_model_unknown_key():
    with pytest.raises(KeyError, match="model='qwen9-vl': not in models.yaml"):
        get_model("qwen9-vl")


# --------------------------------------------------------------------------------------------------
# (b) agreement with the installed transformers

@dataclass(frozen=True)
class Family:
    rotary: str            # the text rotary-embedding class in transformers.models.<family>.modeling_<family>
    heads_key: str | None  # the catalogue entry whose size the default config is (head counts compared)
    not_default: frozenset = frozenset()  # rope fields whose checkpoint values the defaults do not describe
    permuted_inv_freq: bool = False       # the module stores inv_freq permuted (its lanes put it back)
    layer_type: str | None = None         # rope_parameters keyed by layer type: the type the spec is of


ROPE_FIELDS = ("base", "head_size", "rotary_dim", "sections", "max_position_embeddings", "ntk_alpha")

# Which catalogue entry each default config is, read from the config classes (transformers 5.17, 5.24).
# A field in not_default must differ from the default (so the list stays minimal); all other rope
# fields of every entry of the family must equal it.
FAMILIES = {
    # Qwen2Config: 4096 hidden, 32/32 heads, theta 1e4 (docstring says Qwen2-7B; it is not its shape).
    "qwen2": Family("Qwen2RotaryEmbedding", None, frozenset({"base"})),
    # Qwen2VLTextConfig: hidden 8192, 80 layers, 64/8 heads = the 72B shape (docstring names 7B).
    "qwen2_vl": Family("Qwen2VLRotaryEmbedding", "qwen2-vl-72b"),
    # Qwen2_5_VLTextConfig: the 72B shape again; max_position_embeddings 32768, checkpoints 128000.
    "qwen2_5_vl": Family("Qwen2_5_VLRotaryEmbedding", "qwen2.5-vl-72b", frozenset({"max_position_embeddings"})),
    # Qwen2_5OmniTextConfig (thinker): documents and matches Qwen2.5-Omni-7B.
    "qwen2_5_omni": Family("Qwen2_5OmniRotaryEmbedding", "qwen2.5-omni-7b"),
    # Qwen3VLTextConfig: 32/32 heads, theta 5e5, 128000 positions: no released Qwen3-VL (5e6, 262144).
    "qwen3_vl": Family("Qwen3VLTextRotaryEmbedding", None, frozenset({"base", "max_position_embeddings"})),
    # Qwen3VLMoeTextConfig: 16/16 heads, 60 experts: no released Qwen3-VL MoE.
    "qwen3_vl_moe": Family("Qwen3VLMoeTextRotaryEmbedding", None, frozenset({"base", "max_position_embeddings"})),
    # Qwen3_5TextConfig: 16/4 heads, 32 layers (docstring names Qwen3.5-27B, which is 24/4 x 64 layers).
    "qwen3_5": Family("Qwen3_5TextRotaryEmbedding", None, frozenset({"base", "max_position_embeddings"})),
    # Qwen3_5MoeTextConfig: 16/2 heads, 40 layers, 256 experts = Qwen3.5-35B-A3B (as documented).
    "qwen3_5_moe": Family("Qwen3_5MoeTextRotaryEmbedding", "qwen3.5-35b-a3b",
                          frozenset({"base", "max_position_embeddings"})),
    # Glm4vTextConfig: GLM-4.1V-9B heads, but no partial_rotary_factor (checkpoint 0.5) and 32768 positions.
    "glm4v": Family("Glm4vTextRotaryEmbedding", "glm-4.1v-9b", frozenset({"rotary_dim", "max_position_embeddings"})),
    # Glm4vMoeTextConfig: GLM-4.5V heads, but no head_dim field: 4096 // 96 = 42 (checkpoint sets 128).
    "glm4v_moe": Family("Glm4vMoeTextRotaryEmbedding", "glm-4.5v", frozenset({"head_size", "rotary_dim"})),
    # GlmOcrTextConfig: GLM-OCR heads (hidden 1024 vs 1536), head_dim 1024 // 16 = 64 and the modeling
    # default mrope_section [8, 12, 12]; the checkpoint sets head_dim 128 and [16, 24, 24].
    "glm_ocr": Family("GlmOcrTextRotaryEmbedding", "glm-ocr", frozenset({"head_size", "rotary_dim", "sections"})),
    # PaddleOCRTextConfig: documents and matches PaddleOCR-VL.
    "paddleocr_vl": Family("PaddleOCRRotaryEmbedding", "paddleocr-vl"),
    # HunYuanVLTextConfig: a HunYuan-7B-like dense shape, no sections, no alpha, 2048 positions.
    "hunyuan_vl": Family("HunYuanVLRotaryEmbedding", None,
                         frozenset({"sections", "ntk_alpha", "max_position_embeddings"})),
    # Ernie4_5_VLMoeTextConfig: documents and matches ERNIE-4.5-VL-28B-A3B (the Ernie map, GPT-J pairs).
    "ernie4_5_vl_moe": Family("Ernie4_5_VLMoeTextRotaryEmbedding", "ernie-4.5-vl-28b-a3b", permuted_inv_freq=True),
    # Qwen3OmniMoeConfig's thinker text config: 28/4 heads, no head_dim (2048 // 28 = 73) and 32768
    # positions, not the released 30B-A3B's (head_dim 128, 65536).
    "qwen3_omni_moe": Family("Qwen3OmniMoeThinkerTextRotaryEmbedding", None,
                             frozenset({"head_size", "rotary_dim", "max_position_embeddings"})),
    # CohereCompassTextConfig: 64/64 heads at hidden 8192, every layer full attention with the default
    # rope: nothing of North-Micro-Vision, whose sliding-window layers carry the rope (per layer type).
    "cohere_compass": Family("CohereCompassRotaryEmbedding", None, frozenset({"base", "max_position_embeddings"}),
                             layer_type="sliding_attention"),
}

HUNYUAN_MISMATCH = ("known mismatch: transformers HunYuanVL (5.13+) splits the whole head into blocks of "
                    "2*s_i, so the two members of a NeoX pair take different rows; Tencent's code, vLLM and "
                    "mlx-vlm share the row (docs/spec.md §2)")
# Entries with a scaled rope config are held to transformers in (e), from their own values.
TABLED = sorted(k for k, m in MODELS.items() if m.family in FAMILIES and m.spec.scaling is None)


def _installed_transformers():
    """The installed transformers release (read from its metadata: no import at collection), or None."""
    from importlib.metadata import PackageNotFoundError, version
    from packaging.version import Version
    try:
        return Version(version("transformers"))
    except PackageNotFoundError:
        return None


# transformers 5.17.0 to 5.20.x built Cohere Compass's rotary with Ernie-4.5-VL's prerotation: the
# frequencies permuted (evens then odds over the first 44), the rows in contiguous H | W | T blocks,
# default sections [22, 22, 20].  5.16.0 and 5.21.0+ (and vLLM, SGLang) interleave in order.
COMPASS_PERMUTED = ("known mismatch: transformers 5.17.0-5.20.x CohereCompassRotaryEmbedding permutes the "
                    "frequencies and maps rows in contiguous H | W | T blocks (Ernie-4.5-VL's prerotation); "
                    "5.16 and 5.21+ and the engines interleave them in order (models.yaml north-micro-vision)")


def _tabled(keys):
    """TABLED as parameters, the entries a known transformers departure covers marked strict xfail."""
    installed = _installed_transformers()
    from packaging.version import Version
    permuted = installed is not None and Version("5.17.0") <= installed < Version("5.21.0")
    return [pytest.param(k, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=COMPASS_PERMUTED))
            if permuted and MODELS[k].family == "cohere_compass" else k for k in keys]
POSITIONS = (101, 211, 307, 401)  # one per row; sin(p * inv_freq) tells the rows apart for every entry


def _transformers():
    return pytest.importorskip("transformers", reason="transformers not installed (pip install .[oracle])")


def _text_config(family: str):
    """The family's default config (no arguments: weight-free, offline), its text part."""
    transformers = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    if family not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no config class for {family}")
    return CONFIG_MAPPING[family]().get_text_config()


def _rotary_class(family: str):
    transformers = _transformers()
    name = FAMILIES[family].rotary
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    if not hasattr(module, name):
        pytest.skip(f"transformers {transformers.__version__} has no {name} in modeling_{family}")
    return getattr(module, name)


def _layer_typed(family: str, cfg):
    """A per-layer-type config (Cohere Compass) made to hold the family's layer type alone, with the
    default rope parameters of whichever type the default config has (Compass's default config has
    none: the default rope type, no base); other configs as they are."""
    layer_type = FAMILIES[family].layer_type
    if layer_type is not None:
        default = next((p for p in cfg.rope_parameters.values() if p), {"rope_type": "default"})
        cfg.layer_types = [layer_type]
        cfg.rope_parameters = {layer_type: dict(default)}
    return cfg


def _rope_parameters(family: str, cfg) -> dict:
    layer_type = FAMILIES[family].layer_type
    return cfg.rope_parameters if layer_type is None else cfg.rope_parameters[layer_type]


def _defaults(family: str) -> dict:
    cfg = _layer_typed(family, _text_config(family))
    rope = _rope_parameters(family, cfg)
    base = float(rope["rope_theta"]) if "rope_theta" in rope else None
    rope.setdefault("rope_theta", 1.0)      # a placeholder the module builds with (its sections are read)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    sections = getattr(_rotary_class(family)(config=cfg), "mrope_section", None)  # the modeling default
    if isinstance(sections, dict):
        sections = sections[FAMILIES[family].layer_type]
    return {"base": base, "head_size": head,
            "rotary_dim": int(head * rope.get("partial_rotary_factor", 1.0)),
            "sections": tuple(sections) if sections else None,
            "max_position_embeddings": cfg.max_position_embeddings, "ntk_alpha": rope.get("alpha"),
            "num_q_heads": cfg.num_attention_heads, "num_kv_heads": cfg.num_key_value_heads}


def _catalogue(key: str) -> dict:
    m = MODELS[key]
    return {"base": m.spec.base, "head_size": m.spec.head_size, "rotary_dim": m.spec.rotary_dim,
            "sections": m.spec.sections, "max_position_embeddings": m.max_position_embeddings,
            "ntk_alpha": m.spec.ntk_alpha, "num_q_heads": m.num_q_heads, "num_kv_heads": m.num_kv_heads}


def _rotary(key: str):
    """transformers' rotary module for the model: the default config with the values the defaults do
    not describe (not_default) set from the catalogue."""
    m = MODELS[key]
    spec, wrong = m.spec, FAMILIES[m.family].not_default
    cfg = _layer_typed(m.family, _text_config(m.family))
    rope = _rope_parameters(m.family, cfg)
    cfg.head_dim = spec.head_size  # the default's own value unless listed; some modules read it directly
    if "base" in wrong:
        rope["rope_theta"] = spec.base
    if "rotary_dim" in wrong:
        rope["partial_rotary_factor"] = spec.rotary_dim / spec.head_size
    if "sections" in wrong:
        rope["mrope_section"] = list(spec.sections)
    if "ntk_alpha" in wrong:  # how transformers normalises HunyuanOCR's rope_scaling {type: xdrope, alpha}
        rope.update(rope_type="dynamic", alpha=spec.ntk_alpha, factor=1.0)
    rot = _rotary_class(m.family)(config=cfg)
    layer_type = FAMILIES[m.family].layer_type
    if layer_type is not None:                # the module keeps one buffer and takes the type per call
        rot.inv_freq = getattr(rot, f"{layer_type}_inv_freq")
        rot.layer_type = layer_type
    return rot


def _sin(rot, rows) -> torch.Tensor:
    """sin of the rotary module at one token whose position rows are ``rows``: [rotary_dim]."""
    positions = torch.tensor(rows)[:, None, None]  # [rows, batch, seq]
    if len(rows) == 1:
        positions = positions[0]  # 1-D modules take [batch, seq]
    typed = {"layer_type": rot.layer_type} if getattr(rot, "layer_type", None) else {}
    _, sin = rot(torch.zeros(1, dtype=torch.float32), positions, **typed)
    return sin.reshape(-1)


def _row(candidates: torch.Tensor, value: torch.Tensor) -> int:
    """Which row's sin(p * inv_freq[i]) ``value`` is: a unique near-exact match, else -1."""
    diff = (candidates - value).abs()
    best = diff.sort().values
    return int(diff.argmin()) if best[0] <= 1e-6 and (len(best) == 1 or best[1] > 1e-5) else -1


@pytest.mark.oracle
def test_transformers_families_are_tabled():
    """Every catalogue family that transformers knows has a row in FAMILIES (so (b) covers it)."""
    _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    untabled = sorted({m.family for m in MODELS.values() if m.family in CONFIG_MAPPING}
                      - set(FAMILIES) - set(SCALED_FAMILIES))
    assert not untabled, f"families with a transformers config class but no FAMILIES row: {untabled}"
    for family, row in FAMILIES.items():
        if row.heads_key is not None:
            assert MODELS[row.heads_key].family == family, f"FAMILIES[{family!r}].heads_key={row.heads_key!r}"


@pytest.mark.oracle
@pytest.mark.parametrize("key", _tabled(TABLED))
def test_transformers_defaults_match_catalogue(key):
    m = MODELS[key]
    row = FAMILIES[m.family]
    default, ours = _defaults(m.family), _catalogue(key)
    fields = ROPE_FIELDS + (("num_q_heads", "num_kv_heads") if row.heads_key == key else ())
    problems = []
    for field in fields:
        if field in row.not_default:
            if ours[field] == default[field]:
                problems.append(f"{field}={ours[field]!r}: listed in not_default but equals the default")
        elif ours[field] != default[field]:
            problems.append(f"{field}={ours[field]!r}: must equal the transformers default ({default[field]!r})")
    version = _transformers().__version__
    assert not problems, f"{key} vs transformers {version} {m.family} defaults: " + "; ".join(problems)


@pytest.mark.oracle
@pytest.mark.parametrize("key", [
    pytest.param(k, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=HUNYUAN_MISMATCH))
    if MODELS[k].family == "hunyuan_vl" else k for k in TABLED if MODELS[k].family != "cohere_compass"]
    + _tabled([k for k in TABLED if MODELS[k].family == "cohere_compass"]))
def test_transformers_rotary_matches_spec(key):
    """rotary_dim, pairing and the axis map of the module transformers builds equal the spec's."""
    spec = MODELS[key].spec
    rot = _rotary(key)
    rows = POSITIONS[:spec.num_dims]
    sin = _sin(rot, rows)
    assert sin.numel() == spec.rotary_dim, f"{key}: rotary_dim={spec.rotary_dim}: transformers rotates {sin.numel()}"
    h = spec.rotary_dim // 2
    first, second = (sin[:h], sin[h:]) if spec.is_neox_style else (sin[0::2], sin[1::2])
    assert torch.equal(first, second), \
        f"{key}: is_neox_style={spec.is_neox_style}: transformers pairs channels differently"
    # Frequency i is inv_freq[i] of the spec's cache (the module's own inv_freq may be permuted:
    # Ernie-4.5-VL's is, so that its H/W/T assembly puts inv_freq[i] back at lane i).
    freqs = inv_freq(spec)
    candidates = torch.stack([(torch.tensor(float(p)) * freqs).sin() for p in rows])
    axis = tuple(_row(candidates[:, i], first[i]) for i in range(h))
    assert axis == spec.axis_map(), \
        f"{key}: sections={spec.sections}, layout={spec.layout!r}: transformers axis map {axis}"


@pytest.mark.oracle
@pytest.mark.parametrize("key", _tabled(TABLED))
def test_transformers_inv_freq_matches_cache(key):
    """transformers' inv_freq (base, rotary_dim, NTK alpha) is bit-identical to rope.cache.inv_freq
    (as a set where the family permutes it: test_transformers_rotary_matches_spec checks each lane's)."""
    rot = _rotary(key)
    ours = inv_freq(MODELS[key].spec)
    theirs = rot.inv_freq.float()
    if FAMILIES[MODELS[key].family].permuted_inv_freq:
        theirs, ours = theirs.sort().values, ours.sort().values
    assert torch.equal(theirs, ours), \
        f"{key}: inv_freq: max difference {float((rot.inv_freq.float() - ours).abs().max()):.3g}"


@pytest.mark.oracle
@pytest.mark.parametrize("key", _tabled(TABLED))
def test_transformers_text_tokens_reduce_to_1d(key):
    """All rows equal (a text token): every layout, HunYuanVL's included, is plain 1-D RoPE."""
    spec = MODELS[key].spec
    rot = _rotary(key)
    sin = _sin(rot, (257,) * spec.num_dims)
    f = (torch.tensor(257.0) * inv_freq(spec)).sin()
    expected = torch.cat((f, f)) if spec.is_neox_style else f.repeat_interleave(2)
    torch.testing.assert_close(sin, expected, rtol=0, atol=1e-6, msg=lambda m: f"{key}: {m}")


@pytest.mark.oracle
def test_transformers_hunyuan_layout_is_the_known_mismatch():
    """Pin transformers' HunYuanVL map exactly: block j of 2*s_j channels of the whole head takes row j.
    If this fails, transformers changed; revisit HUNYUAN_MISMATCH and the strict xfail above."""
    spec = MODELS["hunyuan-ocr"].spec
    rot = _rotary("hunyuan-ocr")
    rows = POSITIONS[:spec.num_dims]
    sin = _sin(rot, rows)
    h = spec.rotary_dim // 2
    candidates = torch.stack([(torch.tensor(float(p)) * rot.inv_freq.float()).sin() for p in rows])
    got = tuple(_row(candidates[:, i % h], sin[i]) for i in range(spec.rotary_dim))
    expected = tuple(row for row, s in enumerate(spec.sections) for _ in range(2 * s))
    assert got == expected, f"hunyuan-ocr: transformers map {got}"
    assert got[:h] != spec.axis_map(), "transformers now matches the canonical layout"


# --------------------------------------------------------------------------------------------------
# (c) tensor parallelism

@pytest.mark.parametrize("key, tp, expected", [
    ("qwen2-vl-7b", 1, (28, 4)),
    ("qwen2-vl-7b", 2, (14, 2)),
    ("qwen2-vl-7b", 4, (7, 1)),
    ("qwen2.5-vl-72b", 8, (8, 1)),
    ("qwen3-vl-235b-a22b", 8, (8, 1)),      # 4 kv heads, replicated: one per rank
    ("glm-4.5v", 8, (12, 1)),
    ("glm-4.5v", 16, (6, 1)),
    ("hunyuan-ocr", 2, (8, 4)),
    ("qwen3.5-397b-a17b", 4, (8, 1)),
])
def test_sharded_heads(key, tp, expected):
    assert get_model(key).sharded(tp) == expected


@pytest.mark.parametrize("key, tp, message", [
    ("qwen2-vl-7b", 8, "qwen2-vl-7b: tp=8: must divide num_q_heads=28 (remainder 4)"),
    ("qwen2-vl-2b", 8, "qwen2-vl-2b: tp=8: must divide num_q_heads=12 (remainder 4)"),
    ("glm-4.5v", 6, "glm-4.5v: tp=6: must divide num_kv_heads=8 (remainder 2)"),
    ("qwen3.5-27b", 6, "qwen3.5-27b: tp=6: must be a multiple of num_kv_heads=4 to replicate them (remainder 2)"),
    ("qwen2-vl-7b", 0, "qwen2-vl-7b: tp=0: must be a positive int"),
    ("qwen2-vl-7b", True, "qwen2-vl-7b: tp=True: must be a positive int"),
])
def test_sharded_rejects(key, tp, message):
    with pytest.raises(ValueError) as e:
        get_model(key).sharded(tp)
    assert str(e.value) == message


# --------------------------------------------------------------------------------------------------
# (d) the loader's errors

KEY = "glm-4.1v-9b"


def _raw_entry() -> dict:
    with open(DEFAULT_PATH, encoding="utf-8") as f:
        return copy.deepcopy(yaml.safe_load(f)[KEY])


def _write(tmp_path, catalogue) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(catalogue if isinstance(catalogue, str) else yaml.safe_dump(catalogue), encoding="utf-8")
    return path


def test_loader_reads_a_copied_entry(tmp_path):
    """The bad-YAML cases below start from this entry; unchanged, it loads to the catalogue's value."""
    assert load_models(_write(tmp_path, {KEY: _raw_entry()})) == {KEY: MODELS[KEY]}


def _drop(field):
    return lambda e: e.pop(field)


def _set(field, value):
    return lambda e: e.__setitem__(field, value)


def _source(field, value):
    return lambda e: e["sources"].__setitem__(field, value)


def _both(*edits):
    return lambda e: [edit(e) for edit in edits]


BAD = [  # (edit of the entry, expected message start after "glm-4.1v-9b: ", a rule it must state)
    ("missing-field", _drop("num_kv_heads"), "num_kv_heads=<missing>", "every entry needs this field"),
    ("missing-sources", _drop("sources"), "sources=<missing>", "every entry needs this field"),
    ("unknown-field", _set("rope_theta", 10000.0), "rope_theta=10000.0", "unknown field"),
    ("no-source", lambda e: e["sources"].pop("base"), "sources.base=None", "every value needs a source"),
    ("blank-source", _source("sections", "  "), "sources.sections='  '", "every value needs a source"),
    ("source-for-nothing", _source("bias", "x"), "sources.bias='x'", "names no sourced field"),
    ("source-for-null", _source("ntk_alpha", "x"), "sources.ntk_alpha='x'", "names no sourced field"),
    ("sections-sum", _set("sections", [8, 12, 11]), "sections=(8, 12, 11)", "must sum to rotary_dim/2 = 32 (got 31)"),
    ("rotary-gt-head", _set("rotary_dim", 256), "rotary_dim=256", "must be <= head_size"),
    ("odd-rotary", _set("rotary_dim", 63), "rotary_dim=63", "must be even"),
    ("bad-layout", _set("layout", "zigzag"), "layout='zigzag'", "must be one of"),
    ("neox-not-bool", _set("is_neox_style", "no"), "is_neox_style='no'", "must be a bool"),
    ("base-string", _set("base", "1e4"), "base='1e4'", "must be a number"),
    ("base-too-small", _set("base", 1.0), "base=1.0", "must be a finite number > 1"),
    ("heads-zero", _set("num_q_heads", 0), "num_q_heads=0", "must be a positive int"),
    ("kv-not-dividing", _set("num_kv_heads", 3), "num_kv_heads=3", "must divide num_q_heads=32"),
    ("mpe-float", _set("max_position_embeddings", 65536.0), "max_position_embeddings=65536.0",
     "must be a positive int"),
    ("bad-kind", _set("rope_kind", "3d"), "rope_kind='3d'", "must be one of"),
    ("1d-with-sections", _set("rope_kind", "1d"), "sections=[8, 12, 12]", "must be null exactly when"),
    ("mrope-rows", _set("sections", [8, 12, 6, 6]), "sections=[8, 12, 6, 6]", "M-RoPE needs 3 rows"),
    ("alpha-on-mrope", _both(_set("ntk_alpha", 1000.0), _source("ntk_alpha", "x")), "ntk_alpha=1000.0",
     "must be null unless rope_kind is 'xdrope'"),
    ("hf-id", _set("hf_id", "GLM-4.1V"), "hf_id='GLM-4.1V'", "must be 'owner/name'"),
    ("scaling-not-mapping", _both(_set("scaling", "yarn"), _source("scaling", "x")), "scaling='yarn'",
     "must be a mapping"),
    ("scaling-bad-factor", _both(_set("scaling", {"rope_type": "linear", "factor": 0.0}), _source("scaling", "x")),
     "scaling.factor=0.0", "must be a finite number > 0"),
    ("scaling-unsourced", _set("scaling", {"rope_type": "linear", "factor": 2.0}), "sources.scaling=None",
     "every value needs a source"),
    ("layer-type-not-a-name", _set("layer_type", 3), "layer_type=3", "must be a layer type's name"),
    ("source-for-layer-type", _both(_set("layer_type", "full_attention"), _source("layer_type", "x")),
     "sources.layer_type='x'", "names no sourced field"),
]


@pytest.mark.parametrize("edit, start, rule", [pytest.param(*case[1:], id=case[0]) for case in BAD])
def test_loader_rejects_bad_entry(tmp_path, edit, start, rule):
    entry = _raw_entry()
    edit(entry)
    with pytest.raises(ValueError) as e:
        load_models(_write(tmp_path, {KEY: entry}))
    message = str(e.value)
    assert message.startswith(f"{KEY}: {start}"), message
    assert rule in message, message


@pytest.mark.parametrize("text, start", [
    pytest.param("- just\n- a list\n", "models.yaml: top level must be", id="not-a-mapping"),
    pytest.param("GLM 4.1V: {}\n", "key='GLM 4.1V'", id="bad-key"),
    pytest.param("glm-ocr: 3\n", "glm-ocr: entry=3: must be a mapping", id="entry-not-mapping"),
])
def test_loader_rejects_bad_file(tmp_path, text, start):
    with pytest.raises(ValueError) as e:
        load_models(_write(tmp_path, text))
    assert str(e.value).startswith(start), str(e.value)


def test_loader_rejects_repeated_key(tmp_path):
    entry = yaml.safe_dump({KEY: _raw_entry()})
    with pytest.raises(ValueError, match=rf"^{KEY}=<repeated>: keys must be unique"):
        load_models(_write(tmp_path, entry + entry))


# --------------------------------------------------------------------------------------------------
# (e) scaled rope configs against transformers

@dataclass(frozen=True)
class ScaledFamily:
    rotary: str                  # the rotary class in transformers.models.<family>.modeling_<family>
    multimodal: bool = False     # the config class takes the language model as text_config
    defaults: bool = False       # the class's default rope config is the catalogued model's


SCALED_FAMILIES = {
    "llama": ScaledFamily("LlamaRotaryEmbedding"),
    "phi3": ScaledFamily("Phi3RotaryEmbedding"),
    "gpt_oss": ScaledFamily("GptOssRotaryEmbedding", defaults=True),     # GptOssConfig documents GPT-OSS-120B
    "deepseek_v3": ScaledFamily("DeepseekV3RotaryEmbedding"),
    "gemma3": ScaledFamily("Gemma3RotaryEmbedding", multimodal=True),
    "gemma4": ScaledFamily("Gemma4TextRotaryEmbedding", multimodal=True, defaults=True),
    "qwen3_5": ScaledFamily("Qwen3_5TextRotaryEmbedding", multimodal=True),
}
SCALED = sorted(k for k, m in MODELS.items() if m.family in SCALED_FAMILIES
                and (m.spec.scaling is not None or m.layer_type is not None))
RECOMPUTED_PER_FORWARD = ("longrope", "dynamic")   # the module's init table is the short / unscaled one


def test_catalogue_covers_the_scaled_rope_types():
    types = {m.spec.scaling.rope_type for m in MODELS.values() if m.spec.scaling is not None}
    assert {"linear", "yarn", "deepseek_yarn", "llama3", "longrope", "proportional"} <= types
    assert any(m.spec.scaling is not None and m.spec.sections is not None for m in MODELS.values()), "YaRN M-RoPE"
    per_layer = {m.hf_id for m in MODELS.values() if m.layer_type == "full_attention"}
    assert per_layer == {m.hf_id for m in MODELS.values() if m.layer_type == "sliding_attention"} and per_layer


def _text_kwargs(key: str) -> dict:
    """The language model's config keywords the entry documents (its checkpoint's own siblings for a
    per-layer rope config: one rope dict per layer type)."""
    m = MODELS[key]
    spec = m.spec
    text = {"num_attention_heads": m.num_q_heads, "num_key_value_heads": m.num_kv_heads,
            "hidden_size": m.num_q_heads * spec.head_size, "max_position_embeddings": m.max_position_embeddings,
            "head_dim": spec.head_size}
    if m.layer_type is not None:
        siblings = {s.layer_type: s for s in MODELS.values() if s.hf_id == m.hf_id and s.layer_type}
        text["rope_parameters"] = {lt: hf_rope_parameters(s.spec) for lt, s in siblings.items()}
        text["layer_types"] = ["sliding_attention"] * 5 + ["full_attention"]
        text["num_hidden_layers"] = 6
        text["head_dim"] = siblings["sliding_attention"].spec.head_size
        text["num_key_value_heads"] = siblings["sliding_attention"].num_kv_heads
        if siblings["full_attention"].spec.head_size != text["head_dim"]:
            text["global_head_dim"] = siblings["full_attention"].spec.head_size
        return text
    params = hf_rope_parameters(spec)
    if spec.sections is not None:
        params.update(mrope_section=list(spec.sections), mrope_interleaved=spec.layout == "interleaved")
    text["rope_parameters"] = params
    if m.family == "deepseek_v3":       # MLA: the rotary part of the head
        text.update(qk_rope_head_dim=text.pop("head_dim"), rope_interleave=not spec.is_neox_style)
    if m.family == "phi3":              # Phi-3 keeps the pretraining length beside the rope parameters
        text["original_max_position_embeddings"] = spec.scaling.original_max_position
    return text


def _scaled_config(key: str):
    """The family's transformers config built from the entry (weight-free, offline)."""
    _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    family = MODELS[key].family
    if family not in CONFIG_MAPPING:
        pytest.skip(f"transformers {_transformers().__version__} has no config class for {family}")
    text = _text_kwargs(key)
    if SCALED_FAMILIES[family].multimodal:
        return CONFIG_MAPPING[family](text_config=text)
    return CONFIG_MAPPING[family](**text)


def _module_table(key: str, config) -> tuple[torch.Tensor, float]:
    """transformers' (inv_freq, attention scaling) for the entry's layers at the cache's length."""
    m = MODELS[key]
    text = config.get_text_config()
    rope_type = m.spec.scaling.rope_type if m.spec.scaling is not None else "default"
    if rope_type in RECOMPUTED_PER_FORWARD:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        return ROPE_INIT_FUNCTIONS[rope_type](text, "cpu", seq_len=m.spec.max_position)
    module = importlib.import_module(f"transformers.models.{m.family}.modeling_{m.family}")
    rot = getattr(module, SCALED_FAMILIES[m.family].rotary)(config=text)
    if m.layer_type is not None:
        return getattr(rot, f"{m.layer_type}_inv_freq"), getattr(rot, f"{m.layer_type}_attention_scaling")
    return rot.inv_freq, rot.attention_scaling


@pytest.mark.oracle
@pytest.mark.parametrize("key", SCALED)
def test_scaled_entry_reads_back_from_its_transformers_config(key):
    """transformers normalizes the config (Phi-3's original length, Gemma 3's rope_scaling on the full
    layers, DeepSeek's head_dim = qk_rope_head_dim, Gemma 4's per-layer head); from_hf_config reads
    the entry's spec back from it, cache length included."""
    m = MODELS[key]
    got = RopeSpec.from_hf_config(_scaled_config(key), m.layer_type,
                                  max_position=m.spec.max_position if m.rope_kind == "mrope" else None)
    assert got == m.spec, f"{key}: from_hf_config gives {got!r}"


@pytest.mark.oracle
@pytest.mark.parametrize("key", SCALED)
def test_scaled_entry_table_is_the_transformers_rotary(key):
    """The rotary module transformers builds for the entry: the frequencies rope.cache computes, bit for
    bit, and the magnitude the reference and the cache fold into cos and sin, exactly."""
    spec = MODELS[key].spec
    theirs, their_factor = _module_table(key, _scaled_config(key))
    assert torch.equal(theirs.float(), inv_freq(spec)), \
        f"{key}: inv_freq: max difference {float((theirs.float() - inv_freq(spec)).abs().max()):.3g}"
    assert their_factor == attention_factor(spec) == reference.attention_factor(spec), \
        f"{key}: attention factor transformers {their_factor!r}, cache {attention_factor(spec)!r}"


@pytest.mark.oracle
@pytest.mark.parametrize("key", [k for k in SCALED if SCALED_FAMILIES[MODELS[k].family].defaults])
def test_transformers_default_rope_config_is_the_entrys(key):
    """Where the class documents the catalogued model (gpt-oss-120b) or its family's rope config
    (Gemma 4), its default config reads into the entry's rope fields."""
    _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    m = MODELS[key]
    got = RopeSpec.from_hf_config(CONFIG_MAPPING[m.family](), m.layer_type, max_position=m.spec.max_position)
    assert got == m.spec, f"{key}: the transformers default gives {got!r}"
