"""RopeSpec's scaling (rope/spec_scaling.py) and RopeSpec.from_hf_config (rope/spec_hf.py), without
transformers: validation messages naming the field, serialization, and real config.json files read
into the spec their model serves (docs/spec.md §1)."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import example, given, strategies as st

from rope.spec import RopeScaling, RopeSpec
from rope.spec_scaling import admitted_length
from tests.reference.scaling_cases import MODELLED_TYPES, scaled_specs

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position": 4096}

# (spec keyword arguments, message regex): every bad scaling is refused at construction, naming the field.
BAD_SCALINGS = [
    (dict(scaling={"rope_type": "yarn2"}), r"scaling.rope_type='yarn2': must be one of"),
    (dict(scaling={"rope_type": "linear"}), r"scaling.factor=None: rope_type='linear' needs it"),
    (dict(scaling={"rope_type": "linear", "factor": 0.0}), r"scaling.factor=0.0: must be a finite number > 0"),
    (dict(scaling={"rope_type": "linear", "factor": -2}), r"scaling.factor=-2: must be a finite number > 0"),
    (dict(scaling={"rope_type": "linear", "factor": float("inf")}), r"scaling.factor=inf"),
    (dict(scaling={"rope_type": "linear", "factor": True}), r"scaling.factor=True"),
    (dict(scaling={"rope_type": "linear", "factor": 2.0, "beta_fast": 32}),
     r"scaling.beta_fast=32: not a parameter of rope_type='linear'"),
    (dict(scaling=dict(YARN, beta_fast=1.0, beta_slow=32.0)),
     r"scaling.beta_fast=1: must be >= beta_slow=32 .*swapped"),
    (dict(scaling=dict(YARN, original_max_position=4096.0)),
     r"scaling.original_max_position=4096.0: must be a positive int"),
    (dict(scaling=dict(YARN, truncate="no")), r"scaling.truncate='no': must be a bool"),
    (dict(scaling=dict(YARN, mscale=-1.0)), r"scaling.mscale=-1.0: must be a finite number >= 0"),
    (dict(scaling=dict(YARN, attention_factor=0.0)), r"scaling.attention_factor=0.0: must be a finite number > 0"),
    (dict(scaling={"rope_type": "yarn", "factor": 4.0}), r"scaling.original_max_position=None: rope_type='yarn' needs"),
    (dict(scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                   "original_max_position": 8192}), r"scaling.high_freq_factor=1: must be > low_freq_factor=4"),
    (dict(scaling={"rope_type": "longrope", "factor": 32.0, "original_max_position": 4096,
                   "short_factor": [1.0] * 64, "long_factor": [1.0] * 63}),
     re.escape("scaling.long_factor: has 63 entries, must have rotary_dim/2 = 64")),
    (dict(scaling={"rope_type": "longrope", "factor": 32.0, "original_max_position": 4096,
                   "short_factor": [1.0] * 63 + [0.0], "long_factor": [1.0] * 64}),
     re.escape("scaling.short_factor[63]=0.0: must be a finite number > 0")),
    (dict(scaling={"rope_type": "longrope", "factor": 32.0, "original_max_position": 4096,
                   "short_factor": "1.0", "long_factor": [1.0] * 64}),
     r"scaling.short_factor='1.0': must be a sequence"),
    (dict(scaling={"rope_type": "proportional", "partial_rotary_factor": 1.5}),
     r"scaling.partial_rotary_factor=1.5: must be a number in \(0, 1\]"),
    (dict(head_size=256, rotary_dim=64, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25}),
     r"rotary_dim=64: proportional RoPE rotates the whole head"),
    (dict(head_size=4, rotary_dim=4, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25}),
     r"scaling.partial_rotary_factor=0.25: leaves no frequency"),
    (dict(head_size=2, rotary_dim=2, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position": 8}),
     r"rope_type='dynamic' needs rotary_dim > 2"),
    (dict(scaling={"rope_type": "dynamic", "factor": 1e30, "original_max_position": 1}, max_position=1 << 20),
     r"scaling.factor=1e\+30: makes dynamic NTK's base"),
    (dict(sections=(16, 24, 24), ntk_alpha=1000.0, scaling=YARN), r"scaling: rope_type='yarn' given with ntk_alpha"),
    (dict(scaling="yarn"), r"scaling='yarn': must be a RopeScaling, a mapping or None"),
    (dict(scaling={"factor": 2.0}), r"scaling.rope_type=<missing>"),
    (dict(scaling={"rope_type": "linear", "factor": 2.0, "scale": 2.0}), r"scaling: unknown fields \['scale'\]"),
]


@pytest.mark.parametrize("kwargs, message", BAD_SCALINGS, ids=[m[:40] for _, m in BAD_SCALINGS])
def test_scaling_rejects_bad_values_naming_the_field(kwargs, message):
    fields = dict(head_size=128, rotary_dim=128) | kwargs
    with pytest.raises(ValueError, match=message):
        RopeSpec(**fields)


@given(spec=scaled_specs())
@example(spec=RopeSpec(128, 128, scaling=YARN))
@example(spec=RopeSpec(256, 256, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25}))
def test_scaled_spec_round_trips_through_its_dictionary(spec):
    d = spec.to_dict()
    assert RopeSpec.from_dict(copy.deepcopy(d)) == spec
    assert RopeScaling.from_dict(d["scaling"]) == spec.scaling
    assert d["scaling"]["rope_type"] in MODELLED_TYPES


def test_plain_spec_is_unchanged_by_the_scaling_field():
    # A spec without scaling serializes, prints and compares as it always did (case files, test ids).
    spec = RopeSpec(128, 64, False, (8, 12, 12), max_position=1000)
    assert "scaling" not in spec.to_dict() and "scaling" not in repr(spec)
    assert RopeSpec(128, 64, False, (8, 12, 12), max_position=1000, scaling={"rope_type": "default"}) == spec
    assert RopeSpec(128, 64, False, (8, 12, 12), "chunked", 10000.0, 1000, None, None, None) == spec


def test_scaling_defaults_fill_in_so_equal_tables_compare_equal():
    assert RopeScaling("yarn", factor=4, original_max_position=4096) == RopeScaling(
        "yarn", factor=4.0, original_max_position=4096, beta_fast=32, beta_slow=1, truncate=True)
    deepseek = RopeScaling("deepseek_yarn", factor=40.0, original_max_position=4096)
    assert (deepseek.mscale, deepseek.mscale_all_dim) == (1.0, 0.0)
    # yarn's mscale pair stays absent: transformers tells it from zero
    assert RopeScaling("yarn", factor=4.0, original_max_position=4096).mscale is None


@pytest.mark.parametrize("scaling, mpe, expected", [
    (None, 32768, 32768),
    (RopeScaling("yarn", factor=4.0, original_max_position=262144), 262144, 1048576),     # Qwen3.5's card
    (RopeScaling("deepseek_yarn", factor=40.0, original_max_position=4096), 163840, 163840),
    (RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192),
     131072, 131072),
    (RopeScaling("dynamic", factor=2.0, original_max_position=2048), 2048, 4096),          # vllm#55910
    (RopeScaling("ntk", factor=3.0), 1000, 3000),
    (RopeScaling("linear", factor=8.0), 131072, 1048576),
])
def test_admitted_length_is_the_engines(scaling, mpe, expected):
    assert admitted_length(scaling, mpe) == expected


# ---------------------------------------------------------------------------------------- from_hf_config
# Real configs, as their config.json writes the rope keys (sources in models.yaml).
LLAMA_31_8B = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128,
               "max_position_embeddings": 131072, "rope_theta": 500000.0,
               "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "max_position_embeddings": 163840, "rope_theta": 10000,
               "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 4096, "type": "yarn"}}
GEMMA_3_27B = {"model_type": "gemma3", "text_config": {
    "model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "num_attention_heads": 32,
    "max_position_embeddings": 131072, "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window_pattern": 6}}
GEMMA_4_FULL = {"model_type": "gemma4", "text_config": {
    "model_type": "gemma4_text", "head_dim": 256, "global_head_dim": 512, "hidden_size": 2816,
    "num_attention_heads": 16, "max_position_embeddings": 262144,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                           "rope_type": "proportional"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}}
QWEN35_YARN = {"model_type": "qwen3_5", "text_config": {
    "model_type": "qwen3_5_text", "head_dim": 256, "max_position_embeddings": 262144,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "yarn",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25, "factor": 4.0,
                        "original_max_position_embeddings": 262144}}}
GPT_OSS = {"model_type": "gpt_oss", "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 150000,
           "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False}}
PHI_35_MINI = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
               "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
               "rope_scaling": {"long_factor": [2.0] * 48, "short_factor": [1.5] * 48, "type": "longrope"}}
QWEN2_VL_LEGACY = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1000000.0,
                   "max_position_embeddings": 32768, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}


@pytest.mark.parametrize("config, layer_type, expected", [
    pytest.param(LLAMA_31_8B, None, RopeSpec(128, 128, base=500000.0, max_position=131072, scaling=RopeScaling(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)), id="llama-3.1"),
    pytest.param(DEEPSEEK_V3, None, RopeSpec(64, 64, False, max_position=163840, scaling=RopeScaling(
        "deepseek_yarn", factor=40.0, original_max_position=4096, mscale=1.0, mscale_all_dim=1.0)), id="deepseek-v3"),
    pytest.param({**DEEPSEEK_V3, "rope_interleave": False}, None, RopeSpec(64, 64, True, max_position=163840,
                 scaling=RopeScaling("deepseek_yarn", factor=40.0, original_max_position=4096, mscale=1.0,
                                     mscale_all_dim=1.0)), id="deepseek-v3-halves"),
    pytest.param(GEMMA_3_27B, "sliding_attention", RopeSpec(128, 128, base=10000.0, max_position=131072),
                 id="gemma-3-sliding"),
    pytest.param(GEMMA_3_27B, "full_attention", RopeSpec(128, 128, base=1e6, max_position=131072,
                                                         scaling=RopeScaling("linear", factor=8.0)), id="gemma-3-full"),
    pytest.param(GEMMA_4_FULL, "full_attention", RopeSpec(512, 512, base=1e6, max_position=262144, scaling=RopeScaling(
        "proportional", partial_rotary_factor=0.25)), id="gemma-4-full"),
    pytest.param(GEMMA_4_FULL, "sliding_attention", RopeSpec(256, 256, base=1e4, max_position=262144),
                 id="gemma-4-sliding"),
    pytest.param(QWEN35_YARN, None, RopeSpec(256, 64, True, (11, 11, 10), "interleaved", 1e7, 1048576,
                                             scaling=RopeScaling("yarn", factor=4.0, original_max_position=262144)),
                 id="qwen3.5-yarn"),
    pytest.param(GPT_OSS, "sliding_attention", RopeSpec(64, 64, base=150000.0, max_position=131072, scaling=RopeScaling(
        "yarn", factor=32.0, original_max_position=4096, truncate=False)), id="gpt-oss"),
    pytest.param(PHI_35_MINI, None, RopeSpec(96, 96, max_position=131072, scaling=RopeScaling(
        "longrope", factor=32.0, original_max_position=4096, short_factor=[1.5] * 48, long_factor=[2.0] * 48)),
        id="phi-3.5-mini"),
    pytest.param(QWEN2_VL_LEGACY, None, RopeSpec(128, 128, sections=(16, 24, 24), base=1e6, max_position=32768),
                 id="qwen2-vl-legacy-mrope-type"),
])
def test_from_hf_config_reads_real_configs(config, layer_type, expected):
    assert RopeSpec.from_hf_config(copy.deepcopy(config), layer_type) == expected


@pytest.mark.parametrize("config, layer_type, message", [
    pytest.param(GEMMA_3_27B, None, r"layer_type=None: this config gives each layer type its own rope parameters "
                                    r"\(full_attention, sliding_attention\)", id="per-layer-without-layer-type"),
    pytest.param(GEMMA_4_FULL, "chunked_attention", r"layer_type='chunked_attention': not among", id="unknown-layer"),
    pytest.param({**GEMMA_4_FULL["text_config"], "rope_parameters": {"full_attention": None, "sliding_attention": {
        "rope_theta": 1e4}}}, "full_attention", r"layer_type='full_attention': takes no RoPE", id="nope-layer"),
    pytest.param({**LLAMA_31_8B, "rope_scaling": {"rope_type": "wobbly", "factor": 2.0}}, None,
                 r"rope_type='wobbly': not a rope type the harness models", id="unknown-type"),
    pytest.param({**LLAMA_31_8B, "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "attn_factor": 0.5}}, None,
                 r"attn_factor=0.5: changes the table and is not modelled", id="unmodelled-key"),
    pytest.param({k: v for k, v in LLAMA_31_8B.items() if k != "max_position_embeddings"}, None,
                 r"max_position_embeddings=None", id="no-length"),
    pytest.param({k: v for k, v in LLAMA_31_8B.items() if k != "rope_theta"}, None, r"rope_theta=None", id="no-base"),
    pytest.param({**LLAMA_31_8B, "partial_rotary_factor": 0.0}, None, r"partial_rotary_factor=0.0", id="partial-zero"),
    pytest.param({**GPT_OSS, "layer_types": ["full_attention"]}, "sliding_attention",
                 r"layer_type='sliding_attention': not among the config's layer_types", id="layer-not-in-config"),
    pytest.param(LLAMA_31_8B, 3, r"layer_type=3: must be a layer type's name", id="layer-type-not-a-name"),
])
def test_from_hf_config_rejects_naming_the_field(config, layer_type, message):
    with pytest.raises(ValueError, match=message):
        RopeSpec.from_hf_config(copy.deepcopy(config), layer_type)


@given(spec=scaled_specs(with_sections=False), neox=st.booleans())
def test_from_hf_config_reads_back_a_drawn_scaling(spec, neox):
    """A config written from a drawn spec (rope_parameters as transformers 5 writes them) reads back
    into that spec: every parameter of every modelled type goes through the reader."""
    s = spec.scaling
    params = {"rope_theta": spec.base, **{("original_max_position_embeddings" if k == "original_max_position" else k): v
                                            for k, v in s.to_dict().items()}}
    head = spec.head_size
    if s.rope_type != "proportional":
        params["partial_rotary_factor"] = spec.rotary_dim / head
    if s.rope_type == "dynamic":
        params.pop("original_max_position_embeddings")
    family = "deepseek_v3" if s.rope_type == "deepseek_yarn" else "llama"
    if family == "deepseek_v3":
        params["rope_type"] = "yarn"
    config = {"model_type": family, "head_dim": head, "max_position_embeddings": s.original_max_position or 4096,
              "rope_parameters": params}
    if int(head * (spec.rotary_dim / head)) != spec.rotary_dim:      # the float share rounds down (transformers too)
        return
    got = RopeSpec.from_hf_config(config, is_neox_style=neox, max_position=spec.max_position)
    assert got == RopeSpec(head, spec.rotary_dim, neox, base=spec.base, max_position=spec.max_position, scaling=s)
