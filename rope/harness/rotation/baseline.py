"""The serving engines' own style of M-RoPE test, reproduced as a baseline to compare against
(docs/spec.md §8.7): NeoX pairing hard-coded for every model (GLM-4.1V included), bf16, positions
uniform in [0, max_position/4), one seed, and ``assert_close(impl, native, atol=1e-2, rtol=1.6e-2)``
against our native rotation, not the float64 reference.  ``rope-harness mutants`` runs it
(properties/baseline, ``--rope-baseline``) against every rotation mutant next to the harness's own
suite, to show what that style misses."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.harness.rotation.check import call_rotation
from rope.implementation import Implementation
from rope.models import get_model
from rope.native import rotate_native
from rope.registry import get_implementation

# The engines' tolerance pair for bf16 (their test's, not ours).
ENGINE_ATOL, ENGINE_RTOL = 1e-2, 1.6e-2


def assert_engine_style(impl_name: str, device: str, model: str, tp_size: int, num_tokens: int) -> None:
    """The engines' fixed-example test of ``impl_name`` on ``model``'s rope config at tensor-parallel
    size ``tp_size`` (heads per rank) and ``num_tokens`` tokens: raises AssertionError (assert_close's)
    when the output leaves their tolerance around our native rotation."""
    impl = get_implementation(impl_name)
    cfg = get_model(model)
    spec = dataclasses.replace(cfg.spec, is_neox_style=True)       # hard-coded, as upstream
    if impl_name == "triton" and device == "cpu" and not Implementation.of(impl_name, impl).supports(
            spec, torch.bfloat16, device):
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
    torch.testing.assert_close(out_q, ref_q, atol=ENGINE_ATOL, rtol=ENGINE_RTOL)
    torch.testing.assert_close(out_k, ref_k, atol=ENGINE_ATOL, rtol=ENGINE_RTOL)
