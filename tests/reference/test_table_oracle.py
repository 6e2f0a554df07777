"""The float64 table (reference/table.py) held to transformers' ROPE_INIT_FUNCTIONS, the code every
transformers model builds its rotary module from, for each rope type transformers has (linear,
dynamic, yarn, llama3, longrope, proportional; docs/spec.md §1): its float32 inverse frequencies
within float32 rounding of the reference's (tests/reference/scaling_cases.float32_bound), its
attention factor equal to the reference's exactly, and rope.cache's float32 frequencies equal to
transformers' bit for bit (the cache computes them in transformers' order).  Drawn configs, and the
catalogue's scaled models as explicit examples.

deepseek_yarn is transformers' "yarn" for the frequencies; its attention factor is vLLM's DeepSeek
formula, which reads a lone mscale that transformers' yarn ignores (pinned below).  vLLM's fixed
NTK ("ntk") has no transformers counterpart.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, strategies as st

import reference
from rope.cache import inv_freq as cache_inv_freq
from rope.spec import RopeScaling, RopeSpec
from tests.reference.scaling_cases import HF_TYPES, SCALED_MODELS, float32_bound, hf_rope_parameters, scaled_specs

pytestmark = pytest.mark.oracle


def _init_functions():
    pytest.importorskip("transformers", reason="transformers not installed (pip install .[oracle])")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    return ROPE_INIT_FUNCTIONS


def _transformers(spec: RopeSpec, seq_len: int) -> tuple[torch.Tensor, float]:
    """transformers' (inv_freq, attention_scaling) for the spec's rope parameters at ``seq_len``."""
    functions = _init_functions()
    from transformers import LlamaConfig, logging
    logging.set_verbosity_error()          # its validation warns about factors < 1; the formulas still apply
    params = hf_rope_parameters(spec)
    s = spec.scaling
    mpe = s.original_max_position or 4096
    config = LlamaConfig(hidden_size=spec.head_size * 2, num_attention_heads=2, head_dim=spec.head_size,
                         max_position_embeddings=mpe, rope_parameters=params)
    return functions[params["rope_type"]](config, "cpu", seq_len=seq_len)


# The catalogue's scaled models of a transformers type, and configs that expose a known table bug
# the catalogue's would not (YaRN's mscale pair unequal: a ratio inverted or squared shows).
ROWS = {key: m.spec for key, m in SCALED_MODELS.items() if m.spec.scaling.rope_type in HF_TYPES + ("deepseek_yarn",)}
ROWS["yarn-unequal-mscales"] = RopeSpec(64, 64, False, max_position=163840, scaling={
    "rope_type": "yarn", "factor": 40.0, "original_max_position": 4096, "mscale": 1.0, "mscale_all_dim": 0.707})


def check_against_transformers(spec: RopeSpec, seq_len: int) -> None:
    s = spec.scaling
    theirs, their_factor = _transformers(spec, seq_len)
    ref = reference.inv_freq(spec, seq_len)
    assert theirs.dtype == torch.float32 and theirs.shape == ref.shape
    bound = torch.tensor(float32_bound(spec, ref.tolist(), seq_len), dtype=torch.float64)
    excess = (theirs.double() - ref).abs() - bound
    worst = int(excess.argmax())
    assert float(excess[worst]) <= 0, (f"{s.rope_type}: inv_freq[{worst}]: transformers {float(theirs[worst])!r}, "
                                       f"reference {float(ref[worst])!r}, bound {float(bound[worst]):.3g}")
    if seq_len == spec.max_position:        # the cache is the table at its own length
        assert torch.equal(cache_inv_freq(spec), theirs), f"{s.rope_type}: rope.cache's float32 recipe departs"
    ours = reference.attention_factor(spec, seq_len)
    if s.rope_type == "deepseek_yarn" and not (s.mscale and s.mscale_all_dim) and s.factor > 1 and s.mscale != 1:
        assert their_factor == 0.1 * math.log(s.factor) + 1.0 != ours    # the lone mscale: pinned below
        return
    assert their_factor == ours, f"{s.rope_type}: attention factor transformers {their_factor!r}, reference {ours!r}"


@pytest.mark.parametrize("rope_type", HF_TYPES + ("deepseek_yarn",))
@given(data=st.data(), longer=st.booleans())
def test_reference_table_is_transformers_rope_init(rope_type, data, longer):
    spec = data.draw(scaled_specs(rope_types=(rope_type,), with_sections=False), label="spec")
    assume(spec.rotary_dim == spec.head_size or int(spec.head_size * (spec.rotary_dim / spec.head_size))
           == spec.rotary_dim)
    check_against_transformers(spec, spec.max_position + (spec.scaling.original_max_position or 0) * longer)


@pytest.mark.parametrize("key", ROWS)
def test_reference_table_of_catalogued_models_is_transformers(key):
    check_against_transformers(ROWS[key], ROWS[key].max_position)


def test_lone_mscale_is_read_by_deepseek_yarn_and_ignored_by_transformers_yarn():
    """Where a config gives mscale without mscale_all_dim, transformers' yarn takes 0.1 ln s + 1 and
    vLLM's DeepSeek YaRN 0.1 mscale ln s + 1 (no released DeepSeek config does: they give both, equal)."""
    spec = RopeSpec(64, 64, False, max_position=163840, scaling=RopeScaling(
        "deepseek_yarn", factor=40.0, original_max_position=4096, mscale=0.707))
    _, theirs = _transformers(spec, spec.max_position)
    assert theirs == 0.1 * math.log(40.0) + 1.0
    assert reference.attention_factor(spec) == 0.1 * 0.707 * math.log(40.0) + 1.0


def test_transformers_reads_truncate_from_the_top_level_parameters():
    """transformers' yarn takes ``truncate`` from config.rope_parameters, not from the layer type's
    dict: a per-layer config's truncate=False (gpt-oss style on one layer type) is not read there."""
    functions = _init_functions()
    from transformers import LlamaConfig, logging
    logging.set_verbosity_error()
    layer = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "truncate": False,
             "rope_theta": 150000.0}
    try:
        config = LlamaConfig(hidden_size=128, num_attention_heads=2, head_dim=64, max_position_embeddings=131072,
                             num_hidden_layers=2,
                             layer_types=["full_attention", "sliding_attention"],
                             rope_parameters={"full_attention": dict(layer), "sliding_attention": dict(layer)})
        theirs, _ = functions["yarn"](config, "cpu", layer_type="full_attention")
    except Exception as exc:     # noqa: BLE001 - a transformers that no longer accepts this layout
        # transformers 5.17 (the stack vLLM pins) builds no per-layer rope parameters on a Llama config.
        pytest.skip(f"transformers refuses a per-layer yarn on a Llama config: {exc!r}")
    spec = RopeSpec(64, 64, base=150000.0, max_position=131072,
                    scaling=RopeScaling("yarn", factor=32.0, original_max_position=4096, truncate=False))
    truncated = RopeSpec.from_dict(spec.to_dict() | {"scaling": spec.scaling.to_dict() | {"truncate": True}})
    assert torch.equal(theirs, cache_inv_freq(truncated)) and not torch.equal(theirs, cache_inv_freq(spec))
