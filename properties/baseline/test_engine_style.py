"""The serving engines' own style of M-RoPE test, reproduced as a baseline to compare against.

Modelled on the fixed-example kernel test serving engines ship (docs/spec.md §8.7): their
model list, NeoX pairing hard-coded for every model (GLM-4.1V included), bf16, num_tokens
{11, 8192}, tp {1, 2}, positions uniform in [0, max_position/4), one seed, and
``assert_close(impl, native, atol=1e-2, rtol=1.6e-2)`` (rope.harness.rotation.baseline).  Only runs with
``--rope-baseline``; ``rope-harness mutants`` runs it against every mutant next to this harness's own suite.
"""

from __future__ import annotations

import pytest

from rope.harness.rotation.baseline import assert_engine_style

pytestmark = [pytest.mark.baseline, pytest.mark.harness_stage]     # with --rope-baseline only

MODELS_TO_TEST = ["glm-4.1v-9b", "qwen2-vl-7b", "qwen2-vl-72b", "qwen2.5-vl-72b", "qwen3-vl-4b", "qwen3-vl-30b-a3b"]


@pytest.mark.parametrize("num_tokens", [11, 8192])
@pytest.mark.parametrize("tp_size", [1, 2])
@pytest.mark.parametrize("model", MODELS_TO_TEST)
def test_mrope_engine_style(impl_name, device, model, tp_size, num_tokens):
    assert_engine_style(impl_name, device, model, tp_size, num_tokens)
