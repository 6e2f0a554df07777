"""The serving engines' own style of M-RoPE test, reproduced as a baseline to compare against.

Modelled on the fixed-example kernel test serving engines ship (docs/spec.md §8.7): their
model list, NeoX pairing hard-coded for every model (GLM-4.1V included), bf16, num_tokens
{11, 8192}, tp {1, 2}, positions uniform in [0, max_position/4), one seed, and
``assert_close(impl, native, atol=1e-2, rtol=1.6e-2)``.  Only runs with ``--rope-baseline``;
``rope-harness mutants`` runs it against every mutant next to this harness's own suite.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.models import get_model
from rope.native import rotate_native
from rope.harness.comparison import call_rotation
from rope.registry import get_implementation

pytestmark = [pytest.mark.baseline, pytest.mark.harness_stage]     # with --rope-baseline only

MODELS_TO_TEST = ["glm-4.1v-9b", "qwen2-vl-7b", "qwen2-vl-72b", "qwen2.5-vl-72b", "qwen3-vl-4b", "qwen3-vl-30b-a3b"]


@pytest.mark.parametrize("num_tokens", [11, 8192])
@pytest.mark.parametrize("tp_size", [1, 2])
@pytest.mark.parametrize("model", MODELS_TO_TEST)
def test_mrope_engine_style(impl_name, device, model, tp_size, num_tokens):
    impl = get_implementation(impl_name)
    cfg = get_model(model)
    spec = dataclasses.replace(cfg.spec, is_neox_style=True)       # hard-coded, as upstream
    if impl_name == "triton" and device == "cpu" and not getattr(impl, "supports")(spec, torch.bfloat16, device):
        pytest.skip("triton does not run on this cpu")
    num_q, num_kv = max(1, cfg.num_q_heads // tp_size), max(1, cfg.num_kv_heads // tp_size)
    dev = torch_device(device)
    torch.manual_seed(42)
    positions = torch.randint(0, cfg.max_position_embeddings // 4, (3, num_tokens)).to(dev)
    query = torch.randn(num_tokens, num_q * spec.head_size, dtype=torch.bfloat16).to(dev)
    key = torch.randn(num_tokens, num_kv * spec.head_size, dtype=torch.bfloat16).to(dev)
    cache = cos_sin_cache(spec, torch.bfloat16, dev)
    ref_q, ref_k = rotate_native(spec, positions, query.clone(), key.clone(), cache)
    out_q, out_k = call_rotation(impl, spec, positions, query.clone(), key.clone(), cache)
    torch.testing.assert_close(out_q, ref_q, atol=1e-2, rtol=1.6e-2)
    torch.testing.assert_close(out_k, ref_k, atol=1e-2, rtol=1.6e-2)
