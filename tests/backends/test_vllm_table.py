"""vLLM's cos/sin table adapter (rope/backends/vllm/table.py): how a spec becomes get_rope's call (no
vLLM needed: its modules are stubbed), and, where vLLM imports, its tables held to the reference:
the catalogued models' match, vllm#55910's NTK and dynamic NTK tables are too short for the
positions vLLM admits, and its dynamic NTK keeps the base unscaled for a decoder's config."""

from __future__ import annotations

import importlib
import os
import sys
import types

import pytest
import torch

from rope.harness.table.cases import TableCase
from rope.harness.table.check import check
from rope.models import load_models
from rope.spec import RopeSpec

MODELS = load_models()
SCALED = sorted(k for k, m in MODELS.items() if m.spec.scaling is not None)


@pytest.fixture
def stubbed(monkeypatch):
    """The adapter imported with vLLM's modules stubbed (it binds them at import only)."""
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers",
                 "vllm.model_executor.layers.rotary_embedding", "vllm.config"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    monkeypatch.delitem(sys.modules, "rope.backends.vllm.table", raising=False)
    module = importlib.import_module("rope.backends.vllm.table")
    del sys.modules["rope.backends.vllm.table"]
    return module


def test_a_spec_becomes_the_call_a_decoder_makes(stubbed):
    call = stubbed.vllm_rope_call
    assert call(MODELS["gpt-oss-120b"].spec) == (131072, {
        "rope_theta": 150000.0, "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})
    # Linear, dynamic and NTK: vLLM admits max_position_embeddings x factor, so the config held the quotient.
    assert call(MODELS["gemma-3-27b-full"].spec)[0] == 131072 // 8
    ntk = RopeSpec(128, 128, max_position=16384, scaling={"rope_type": "ntk", "factor": 4.0})
    assert call(ntk) == (4096, {"rope_theta": 10000.0, "rope_type": "ntk", "factor": 4.0})
    dynamic = RopeSpec(128, 96, max_position=8192, scaling={"rope_type": "dynamic", "factor": 2.0,
                                                            "original_max_position": 4096})
    assert call(dynamic) == (4096, {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0, "rope_dim": 96})
    # M-RoPE with YaRN (Qwen3.5's) goes to MRotaryEmbedding, its map named as vLLM's config names it.
    length, params = call(MODELS["qwen3.5-27b-yarn"].spec)
    assert params["mrope_section"] == list(MODELS["qwen3.5-27b-yarn"].spec.sections)
    assert params["mrope_interleaved"] is True and params["rope_type"] == "yarn" and params["rope_dim"] == 64
    # Proportional (Gemma 4): the rotating fraction as partial_rotary_factor, the whole head as the table.
    length, params = call(MODELS["gemma-4-26b-a4b-full"].spec)
    assert params["rope_type"] == "proportional" and params["partial_rotary_factor"] == 0.25
    assert "factor" not in params and "rope_dim" not in params


def test_what_get_rope_cannot_build_is_unsupported_with_the_reason(stubbed):
    reason = stubbed.cos_sin_table_vllm.unsupported_reason
    odd = RopeSpec(128, 128, max_position=10001, scaling={"rope_type": "linear", "factor": 4.0})
    assert "no max_position_embeddings gives 10001" in reason(odd, torch.float32, "cpu")
    gptj_longrope = RopeSpec(8, 8, False, max_position=8192, scaling={
        "rope_type": "longrope", "factor": 2.0, "original_max_position": 4096,
        "short_factor": [1.0] * 4, "long_factor": [2.0] * 4})
    assert "NeoX" in reason(gptj_longrope, torch.float32, "cpu")
    assert reason(MODELS["deepseek-v3"].spec, torch.bfloat16, "cpu") is None
    with pytest.raises(ValueError, match="unsupported by vLLM's get_rope"):
        stubbed.cos_sin_table_vllm(odd, 16, torch.float32)


def _vllm_table():
    pytest.importorskip("vllm.model_executor.layers.rotary_embedding",
                        reason="vLLM is not installed: pip install vllm, or PYTHONPATH=SITE after "
                               "scripts/vllm_cpu_site.sh SITE on a CPU box")
    from rope.registry import get_table_implementation
    return get_table_implementation("vllm")


@pytest.mark.parametrize("key", SCALED)
def test_vllm_tables_of_catalogued_models_match(key):
    fn = _vllm_table()
    spec = MODELS[key].spec
    if fn.unsupported_reason(spec, torch.float32, "cpu") is not None:
        pytest.skip(fn.unsupported_reason(spec, torch.float32, "cpu"))
    result = check(fn, TableCase(spec, spec.max_position, torch.float32), "cpu")
    assert result.ok, result


@pytest.mark.parametrize("rope_type", ["ntk", "dynamic"])
def test_vllm_55910_ntk_tables_are_too_short_for_what_vllm_admits(rope_type):
    fn = _vllm_table()
    fields = {"rope_type": rope_type, "factor": 4.0}
    if rope_type == "dynamic":
        fields["original_max_position"] = 4096
    spec = RopeSpec(128, 128, max_position=16384, scaling=fields)
    result = check(fn, TableCase(spec, 16384, torch.float32), "cpu")
    assert not result.ok and result.mismatch.label == "table_too_short", result
    assert "4096 rows where positions up to 16383 are admitted" in result.mismatch.sentence


def test_vllm_dynamic_ntk_keeps_the_base_unscaled_for_a_decoders_config():
    """A decoder's config gives no max_trained_positions, so vLLM takes max_position_embeddings for it
    and the base factor s * L / L_trained - (s - 1) is 1: the rows vLLM builds (the unscaled length,
    vllm#55910) are the plain table's, where transformers grows the base at the admitted length."""
    fn = _vllm_table()
    from rope.registry import get_table_implementation
    spec = RopeSpec(128, 128, max_position=8192, scaling={"rope_type": "dynamic", "factor": 2.0,
                                                          "original_max_position": 4096})
    case = TableCase(spec, 4096, torch.float32)         # the rows vLLM builds: the base alone differs
    assert check(get_table_implementation("ours"), case, "cpu").ok
    result = check(fn, case, "cpu")
    assert not result.ok and result.mismatch.label == "frequencies_wrong", result
    table = fn(spec, 4096, torch.float32)
    plain = RopeSpec(128, 128, max_position=4096)
    assert check(lambda *_: table, TableCase(plain, 4096, torch.float32), "cpu").ok
