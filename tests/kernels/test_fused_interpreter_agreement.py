"""On a GPU box: the RoPE + KV-cache kernel gives the same bits on the GPU as under the interpreter
(fp32 arithmetic without FMA contraction, the division correctly rounded, the bf16 rounding and the
FP8 code computed the same way on both: docs/spec.md §10.2), for q, k and both caches, bf16 and FP8,
and in its MLA form for q (q_nope untouched), k_pe and the latent cache.
(The QK-norm kernel is held to the reference on the GPU by test_fused_qk_norm_rope.py: its square
sum's reduction order is the compiler's, so its bits may differ from the interpreter's within the
bound.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rope.devices import gpu_backend, is_interpreter
from rope.triton.rope_kv_cache import mla_rope_kv_cache_triton, rope_kv_cache_triton
from rope.harness.fused.cases import CacheCase, MLACase, build_cache_case, build_mla_case, model_spec

CASES = {
    f"{model}-{cache}-{layout}": CacheCase(spec=model_spec(model), num_tokens=37, num_q_heads=6, num_kv_heads=2,
                                           dtype=dtype, cache=cache, layout=layout, block_size=16, num_blocks=4,
                                           padding=0.25, short_slots=3, scale_as_tensor=True, k_scale=0.3,
                                           v_scale=2.5, packed=True, joint_cache=layout == "HND",
                                           positions_kind="uniform", seed=i)
    for i, (model, dtype, cache, layout) in enumerate((
        ("qwen2-7b", "bfloat16", "activation", "NHD"), ("glm-4.1v-9b", "bfloat16", "float8_e4m3fn", "HND"),
        ("qwen3-vl-8b", "float16", "float8_e5m2", "NHD"), ("ernie-4.5-vl-28b-a3b", "bfloat16", "activation", "HND")))
}


# The kernel's MLA form: DeepSeek's shapes, q token- and heads-major (aiter#3841), bf16 and FP8 latent caches.
CASES.update({
    f"mla-{model}-{cache}-{layout}": MLACase(spec=model_spec(model), num_tokens=37, num_heads=16, kv_lora_rank=512,
                                             nope_dim=128, q_layout=layout, packed_kv=True, k_pe_3d=False,
                                             dtype="bfloat16", cache=cache, block_size=16, num_blocks=4,
                                             padding=0.25, short_slots=3, scale_as_tensor=True, scale=0.3,
                                             positions_kind="uniform", seed=10 + i)
    for i, (model, cache, layout) in enumerate((("deepseek-v3", "activation", "heads_major"),
                                                ("kimi-k2-instruct-0905", "float8_e4m3fn", "token_major")))
})


def run_case(case, device: str) -> dict[str, torch.Tensor]:
    """The bytes of every tensor the call writes, by name."""
    if isinstance(case, MLACase):
        inputs = build_mla_case(case, device)
        mla_rope_kv_cache_triton(case.spec, inputs.positions, inputs.q_pe, inputs.k_pe, inputs.kv_c, inputs.kv_cache,
                                 inputs.slot_mapping, inputs.cos_sin_cache, scale=inputs.scale)
        written = {"q": inputs.q, "k_pe": inputs.k_pe, "kv_cache": inputs.kv_cache}
    else:
        inputs = build_cache_case(case, device)
        rope_kv_cache_triton(case.spec, inputs.positions, inputs.query, inputs.key, inputs.value, inputs.key_cache,
                             inputs.value_cache, inputs.slot_mapping, inputs.cos_sin_cache, kv_layout=case.layout,
                             k_scale=inputs.k_scale, v_scale=inputs.v_scale)
        written = {"query": inputs.query, "key": inputs.key, "key_cache": inputs.key_cache,
                   "value_cache": inputs.value_cache}
    return {name: t.cpu().contiguous().view(torch.uint8) for name, t in written.items()}


_INTERPRETER_SCRIPT = """
import sys, torch
import rope
from tests.kernels.test_fused_interpreter_agreement import CASES, run_case
torch.save({name: run_case(case, "cpu") for name, case in CASES.items()}, sys.argv[1])
"""


@pytest.mark.gpu
@pytest.mark.skipif(gpu_backend() is None or is_interpreter(), reason="needs a GPU running compiled Triton")
def test_gpu_and_interpreter_agree_bit_for_bit(tmp_path):
    path = tmp_path / "interpreter.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT, str(path)], check=True, cwd=root, env=env, timeout=600)
    expected = torch.load(path)
    differing = [f"{name}: {label}" for name, case in CASES.items()
                 for label, got in run_case(case, gpu_backend()).items() if not torch.equal(got, expected[name][label])]
    assert not differing, differing
