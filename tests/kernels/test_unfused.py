"""The unfused baselines (rope/triton/unfused.py): torch's norm and cache write around the rotation
kernel.  The RoPE + KV-cache sequence gives the fused kernel's bits (q, k, both caches, bf16 and FP8,
NHD and HND); the QK-norm sequence, which rounds the normalized value once more, is held to the
reference with that rounding in its bound."""

from __future__ import annotations

import pytest
import torch

import reference.fused as fused_reference
from rope.devices import triton_runs_on
from rope.triton.fused_qk_norm_rope import qk_norm_rope_triton
from rope.triton.rope_kv_cache import rope_kv_cache_triton
from rope.triton.unfused import qk_norm_rope_unfused, rope_kv_cache_unfused
from rope.harness.fused.bound import qk_norm_bound
from rope.harness.fused.cases import CacheCase, QKNormCase, build_cache_case, build_qk_norm_case, model_spec
from rope.harness.fused.check import bits, mismatches

QWEN2, GLM41V, QWEN3VL = model_spec("qwen2-7b"), model_spec("glm-4.1v-9b"), model_spec("qwen3-vl-8b")
CACHE_CASES = {
    f"{name}-{cache}-{layout}": CacheCase(spec=spec, num_tokens=11, num_q_heads=4, num_kv_heads=2, dtype="bfloat16",
                                          cache=cache, layout=layout, block_size=16, num_blocks=2, padding=0.25,
                                          short_slots=2, scale_as_tensor=cache == "float8_e5m2", k_scale=0.3,
                                          v_scale=2.5, packed=True, joint_cache=layout == "HND",
                                          positions_kind="grid", seed=7)
    for name, spec, cache, layout in (("qwen2", QWEN2, "activation", "NHD"), ("glm41v", GLM41V, "float8_e4m3fn", "HND"),
                                      ("qwen3vl", QWEN3VL, "float8_e5m2", "NHD"))
}


@pytest.mark.parametrize("name", list(CACHE_CASES))
def test_unfused_kv_cache_sequence_gives_the_fused_bits(device, name):
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    case = CACHE_CASES[name]
    results = []
    for fn in (rope_kv_cache_triton, rope_kv_cache_unfused):
        inputs = build_cache_case(case, device)
        fn(case.spec, inputs.positions, inputs.query, inputs.key, inputs.value, inputs.key_cache, inputs.value_cache,
           inputs.slot_mapping, inputs.cos_sin_cache, kv_layout=case.layout, k_scale=inputs.k_scale,
           v_scale=inputs.v_scale)
        results.append([bits(t.cpu()) for t in (inputs.query, inputs.key, inputs.key_cache, inputs.value_cache)])
    for label, fused, unfused in zip(("query", "key", "key_cache", "value_cache"), *results):
        assert torch.equal(fused, unfused), label


@pytest.mark.parametrize("spec", [QWEN3VL, GLM41V], ids=["qwen3-vl-8b", "glm-4.1v-9b"])
def test_unfused_qk_norm_sequence_matches_reference(device, spec):
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    case = QKNormCase(spec=spec, num_tokens=9, num_heads_q=4, num_heads_k=2, num_heads_v=2, dtype="bfloat16",
                      eps=1e-6, row_padding=8, positions_kind="grid", seed=11)
    inputs = build_qk_norm_case(case, device)
    before = inputs.qkv.clone()
    d = spec.head_size
    ref = fused_reference.qk_norm_rope(spec, inputs.positions, before, 4, 2, 2, inputs.q_weight, inputs.k_weight,
                                       case.eps, inputs.cos_sin_cache)
    out = qk_norm_rope_unfused(spec, inputs.positions, inputs.qkv, 4, 2, 2, inputs.q_weight, inputs.k_weight,
                               case.eps, inputs.cos_sin_cache)
    problems = []
    for name, lo, hi, weight in (("q", 0, 4 * d, inputs.q_weight), ("k", 4 * d, 6 * d, inputs.k_weight)):
        normed = fused_reference.rms_norm_heads(before[:, lo:hi], weight, case.eps, d)
        bound = qk_norm_bound(spec, inputs.positions, normed, ref[:, lo:hi], inputs.cos_sin_cache, before.dtype,
                              rounded_norm=True)
        problems += mismatches(name, out[:, lo:hi], ref[:, lo:hi], bound)
    assert not problems, problems
    assert torch.equal(bits(out[:, 6 * d:].cpu()), bits(before[:, 6 * d:].cpu()))
    # The fused kernel, which does not round the normalized value, differs from it somewhere.
    fused = qk_norm_rope_triton(spec, inputs.positions, before.clone(), 4, 2, 2, inputs.q_weight, inputs.k_weight,
                                case.eps, inputs.cos_sin_cache)
    assert not torch.equal(bits(fused.cpu()), bits(out.cpu()))
