"""The QK-norm + RoPE kernel (rope/triton/fused_qk_norm_rope.py) against the float64 reference
(reference/fused.py): every q and k element within the bound of an fp32 implementation (the norm's
own rounding carried through the rotation: rope/harness/fused/), v bit for bit untouched.
Drawn: every map the rotation kernel takes, NeoX and GPT-J, partial rotary, fp32/fp16/bf16, heads of
mixed magnitudes (some whose mean square is near eps), weights never uniform and different for q
and k, packed rows with padding past v, positions up to 2^17, sometimes past 2^15 token x head
products.  vLLM's argument order (``fused_qk_norm_rope``, ``fused_qk_norm_mrope``) gives the same
bits.  The broken variants at the end show the check fails a norm after the rotation, a dropped
eps, swapped weights and a normalized v."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings

import reference.fused as fused_reference
from properties.fused.fused_cases import GLM41V, QWEN35, QWEN3VL, qk_norm_case, qk_norm_cases
from rope.devices import triton_runs_on
from rope.triton.fused_qk_norm_rope import fused_qk_norm_mrope, fused_qk_norm_rope, qk_norm_rope_triton
from rope.harness.fused.cases import QKNormCase, build_qk_norm_case
from rope.harness.fused.check import bits, qk_norm_problems

def _kernel(case: QKNormCase):
    def run(inputs):
        return qk_norm_rope_triton(case.spec, inputs.positions, inputs.qkv, case.num_heads_q, case.num_heads_k,
                                   case.num_heads_v, inputs.q_weight, inputs.k_weight, case.eps, inputs.cos_sin_cache)
    return run


_case = qk_norm_case


@settings(deadline=None, max_examples=8)
@given(case=qk_norm_cases())
@example(case=_case(QWEN3VL, num_heads_q=8, num_heads_k=2, num_heads_v=2))          # Qwen3-VL-8B at tp 4
@example(case=_case(QWEN35, num_heads_q=4, num_heads_k=1, num_heads_v=1, positions_kind="last_row"))
@example(case=_case(GLM41V, num_heads_q=8, num_heads_k=1, num_heads_v=1, dtype="float16", row_padding=24))
def test_qk_norm_rope_matches_reference(device, case):
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    inputs = build_qk_norm_case(case, device)
    problems = qk_norm_problems(case, inputs, _kernel(case))
    assert not problems, "\n".join([repr(case)] + problems)


def test_vllm_argument_order_gives_the_same_bits(device):
    """``fused_qk_norm_rope`` (1-D) and ``fused_qk_norm_mrope`` (chunked and interleaved) in vLLM's
    argument order compute what the spec-first entry computes, bit for bit."""
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    import dataclasses
    qwen3 = dataclasses.replace(QWEN3VL, sections=None, layout="chunked")
    for spec, mrope in ((qwen3, None), (QWEN3VL, True), (dataclasses.replace(QWEN3VL, layout="chunked"), False)):
        spec = dataclasses.replace(spec, max_position=4096)
        case = _case(spec, num_heads_q=4, num_heads_k=2, num_heads_v=2, positions_kind="uniform")
        expected = build_qk_norm_case(case, device)
        _kernel(case)(expected)
        inputs = build_qk_norm_case(case, device)
        args = (inputs.qkv, 4, 2, 2, spec.head_size, case.eps, inputs.q_weight, inputs.k_weight,
                inputs.cos_sin_cache, spec.is_neox_style, inputs.positions)
        if mrope is None:
            fused_qk_norm_rope(*args)
        else:
            fused_qk_norm_mrope(*args, spec.sections[0], spec.sections[1], mrope)
        assert torch.equal(bits(inputs.qkv.cpu()), bits(expected.qkv.cpu())), spec


# ----------------------------------------------------------------------------- broken variants
BROKEN_CASE = _case(GLM41V, num_tokens=6, num_heads_q=2, num_heads_k=2, num_heads_v=2, dtype="bfloat16", seed=5)


def _broken(kind: str, case: QKNormCase):
    kernel = _kernel(case)
    d = case.spec.head_size

    def run(inputs):
        qkv = inputs.qkv
        if kind == "norm_after_rotation":        # rotate first, normalize the rotated heads
            q_end, k_end = case.num_heads_q * d, (case.num_heads_q + case.num_heads_k) * d
            q, k = fused_reference.rotate(case.spec, inputs.positions, qkv[:, :q_end], qkv[:, q_end:k_end],
                                          inputs.cos_sin_cache)
            qkv[:, :q_end] = fused_reference.rms_norm_heads(q, inputs.q_weight, case.eps, d).to(qkv.dtype)
            qkv[:, q_end:k_end] = fused_reference.rms_norm_heads(k, inputs.k_weight, case.eps, d).to(qkv.dtype)
            return qkv
        if kind == "eps_dropped":
            return qk_norm_rope_triton(case.spec, inputs.positions, qkv, case.num_heads_q, case.num_heads_k,
                                       case.num_heads_v, inputs.q_weight, inputs.k_weight, 0.0, inputs.cos_sin_cache)
        if kind == "weights_swapped":
            return qk_norm_rope_triton(case.spec, inputs.positions, qkv, case.num_heads_q, case.num_heads_k,
                                       case.num_heads_v, inputs.k_weight, inputs.q_weight, case.eps,
                                       inputs.cos_sin_cache)
        out = kernel(inputs)                     # "v_normalized": v heads normalized with k's weight
        k_end = (case.num_heads_q + case.num_heads_k) * d
        out[:, k_end:] = fused_reference.rms_norm_heads(out[:, k_end:], inputs.k_weight, case.eps, d).to(out.dtype)
        return out
    return run


@pytest.mark.parametrize("kind", ["norm_after_rotation", "eps_dropped", "weights_swapped", "v_normalized"])
def test_broken_variants_fail(device, kind):
    if not triton_runs_on(device) or device != "cpu":
        pytest.skip("the broken variants edit CPU tensors")
    case = BROKEN_CASE
    assert not qk_norm_problems(case, build_qk_norm_case(case, device), _kernel(case))
    assert qk_norm_problems(case, build_qk_norm_case(case, device), _broken(kind, case)), kind


def test_entry_refuses_bad_input_before_launching(device):
    """The kernel's entry raises the contract's ValueErrors (rope/fused.py, tested with the reference in
    tests/reference/test_fused_reference.py) and its own: a dtype it lacks, strided channels it would
    have to write through a copy."""
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    case = _case(GLM41V, num_heads_q=2, num_heads_k=1, num_heads_v=1)
    inputs = build_qk_norm_case(case, device)
    args = (inputs.positions, inputs.qkv, 2, 1, 1, inputs.q_weight, inputs.k_weight, 1e-6, inputs.cos_sin_cache)
    with pytest.raises(ValueError, match=r"qkv\.stride\(\)=\(1, 7\): channels must have stride 1"):
        strided = torch.empty(inputs.qkv.shape[1], inputs.qkv.shape[0], dtype=inputs.qkv.dtype, device=device).T
        qk_norm_rope_triton(case.spec, args[0], strided, *args[2:])
    with pytest.raises(ValueError, match=r"qkv\.shape=\(7, 512\): must be \[num_tokens, \(num_heads_q"):
        qk_norm_rope_triton(case.spec, args[0], args[1], 2, 1, 2, *args[5:])
    with pytest.raises(ValueError, match=r"sections=\(40, 20, -28\)"):
        fused_qk_norm_mrope(inputs.qkv, 2, 1, 1, 128, 1e-6, inputs.q_weight, inputs.k_weight, inputs.cos_sin_cache,
                            False, inputs.positions, 40, 20)
