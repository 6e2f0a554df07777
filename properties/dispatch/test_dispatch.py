"""Platform dispatch (docs/spec.md §6): every rope op, on every platform, in both modes, resolves to a
forward that accepts the op's positions and matches the float64 reference.

Platforms are simulated on the CPU (the op is told its platform); the real GPU platform, where
there is one, also runs with its tensors on it.  The working precision follows the kernel that
ran: native is "activation", Triton and the generic 1-D kernel "float32".
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import Phase, given, settings, strategies as st

from properties.mutants.dispatch import BROKEN_OPS
from properties.strategies import DTYPES, rotation_cases
from rope import dispatch
from rope.cache import cos_sin_cache
from rope.devices import available_devices, triton_runs_on
from rope.dispatch import (MODES, PLATFORMS, MRotaryEmbeddingOp, RotaryEmbeddingOp, XDRotaryEmbeddingOp,
                           rotary_embedding_1d)
from rope.harness.rotation.dispatch import dispatch_property, kernels_launched
from rope.spec import RopeSpec

pytestmark = pytest.mark.dispatch      # a checked thing: rope-harness check runs these (-m dispatch)

# Op kind (as in test ids) -> (op class, strategies kind).
OPS = {
    "1d": (RotaryEmbeddingOp, "1d"),
    "mrope-chunked": (MRotaryEmbeddingOp, "chunked3"),
    "mrope-interleaved": (MRotaryEmbeddingOp, "interleaved"),
    "xdrope3": (XDRotaryEmbeddingOp, "chunked3"),
    "xdrope4": (XDRotaryEmbeddingOp, "chunked4"),
}
# One small spec per op kind for the deterministic tests (real models' shapes, scaled down).
EXAMPLE_SPECS = {
    "1d": RopeSpec(16, 8, is_neox_style=False, max_position=64),
    "mrope-chunked": RopeSpec(32, 16, False, (2, 3, 3), max_position=64),                  # GLM-4.1V-like
    "mrope-interleaved": RopeSpec(32, 32, True, (6, 5, 5), "interleaved", max_position=64),  # Qwen3-VL-like
    "xdrope3": RopeSpec(24, 24, True, (4, 4, 4), max_position=64, ntk_alpha=1000.0),
    "xdrope4": RopeSpec(32, 32, True, (4, 4, 4, 4), max_position=64, ntk_alpha=1000.0),   # HunyuanOCR-like
}
PLATFORM_MODES = [pytest.param(p, m, id=f"{p}-{m}") for p in PLATFORMS for m in MODES]


def _example_inputs(spec: RopeSpec, seed: int, num_tokens: int = 5):
    g = torch.Generator().manual_seed(seed)
    shape = (num_tokens,) if spec.num_dims == 1 else (spec.num_dims, num_tokens)
    positions = torch.randint(0, spec.max_position, shape, generator=g)
    return (positions, torch.randn(num_tokens, 2 * spec.head_size, generator=g),
            torch.randn(num_tokens, spec.head_size, generator=g))


def _combos():
    """(op, platform, mode, tensor device): every platform simulated on the CPU, plus the real GPU."""
    real = set(available_devices()) - {"cpu"}
    out = []
    for op in OPS:
        for platform in PLATFORMS:
            for mode in MODES:
                out.append(pytest.param(op, platform, mode, "cpu", id=f"{op}-{platform}-{mode}"))
                if platform in real:
                    out.append(pytest.param(op, platform, mode, platform, id=f"{op}-{platform}-{mode}-on-{platform}"))
    return out


# Small cases: the property is about which path runs, not about size (the interpreter is slow).
SMALL_HEAD_SIZES = (64, 16, 8, 80)
SMALL_MAX_POSITIONS = (300, 1, 7, 48)


def dispatch_cases(op_kind: str):
    """Rotation cases for the op kind, any dtype, at most 6 tokens, 4 query and 2 kv heads (a key
    or none); shrinks like rotation_cases.  (Under the interpreter a call costs its programs, one
    token x a few heads each: 96 heads made one example of the ROCm path seconds.)"""
    kind = OPS[op_kind][1]
    return st.sampled_from(list(DTYPES)).flatmap(lambda dtype: rotation_cases(
        dtype=dtype, kind=kind, max_tokens=6, head_sizes=SMALL_HEAD_SIZES, max_positions=SMALL_MAX_POSITIONS)).map(
        lambda case: dataclasses.replace(case, num_q_heads=min(case.num_q_heads, 4),
                                         num_kv_heads=min(case.num_kv_heads, 2)))


@pytest.mark.parametrize("op_kind,platform,mode,tensor_device", _combos())
@given(data=st.data())
def test_dispatch_matches_reference(op_kind, platform, mode, tensor_device, data):
    # Rejects: a platform method that reaches the 1-D kernel with [3|4, T] positions (bug 4),
    # positions [3, 1, T] accepted (bug 6), cos/sin kept across calls (bug 7), a wrong rule.
    case = data.draw(dispatch_cases(op_kind), label="case")
    dispatch_property(OPS[op_kind][0], case, platform, mode, tensor_device)


# --------------------------------------------------------------------------- the generic kernel
@pytest.mark.fixed_cases
@pytest.mark.parametrize("num_tokens", [1, 3, 4, 7])
@pytest.mark.parametrize("rows", [3, 4])
def test_generic_kernel_rejects_multirow_positions(rows, num_tokens):
    spec = RopeSpec(16, 16, max_position=32)
    g = torch.Generator().manual_seed(rows * 10 + num_tokens)
    positions = torch.randint(0, 32, (rows, num_tokens), generator=g)
    query, key = torch.randn(num_tokens, 2 * 16, generator=g), torch.randn(num_tokens, 16, generator=g)
    snapshot = query.clone(), key.clone()
    message = "query, key and positions must have the same batch_size and seq_len"
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        rotary_embedding_1d(positions, query, key, 16, cos_sin_cache(spec), True)
    assert torch.equal(query, snapshot[0]) and torch.equal(key, snapshot[1])


@pytest.mark.fixed_cases
def test_generic_kernel_batch_seq_positions_agree_with_tokens():
    # [batch, seq_len] positions are the kernel's other accepted layout: same bits as [num_tokens].
    spec = RopeSpec(16, 8, is_neox_style=False, max_position=32)
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 32, (2, 3), generator=g)
    query, key = torch.randn(2, 3, 32, generator=g), torch.randn(2, 3, 16, generator=g)
    cache = cos_sin_cache(spec, torch.bfloat16)
    q2, k2 = rotary_embedding_1d(positions, query.bfloat16(), key.bfloat16(), 16, cache, False)
    q1, k1 = rotary_embedding_1d(positions.flatten(), query.bfloat16().flatten(0, 1), key.bfloat16().flatten(0, 1),
                                 16, cache, False)
    assert torch.equal(q2.flatten(0, 1), q1) and torch.equal(k2.flatten(0, 1), k1)


@pytest.mark.fixed_cases
@pytest.mark.parametrize("method", ["forward_cuda", "forward_hip", "forward_xpu", "forward_cpu"])
@pytest.mark.parametrize("op_kind", ["mrope-chunked", "xdrope4"])
def test_inherited_1d_platform_method_crashes_on_multirow_positions(op_kind, method):
    # Bug class 3.4, called directly: the 1-D op's platform methods are what a multi-row op
    # without its own overrides would run.
    op = OPS[op_kind][0](EXAMPLE_SPECS[op_kind], platform="cpu")
    positions, query, key = _example_inputs(op.spec, seed=1)
    with pytest.raises(RuntimeError, match="query, key and positions must have the same batch_size and seq_len"):
        getattr(RotaryEmbeddingOp, method)(op, positions, query, key)


# --------------------------------------------------------------------------- stale cache, dispatch once
@pytest.mark.fixed_cases
@pytest.mark.parametrize("platform,mode", PLATFORM_MODES)
@pytest.mark.parametrize("op_kind", list(OPS))
def test_later_call_uses_its_own_positions(op_kind, platform, mode):
    # Bug 7 (vllm-ascend#4668): the second call on an op must rotate by the second call's positions,
    # bit for bit what a fresh op gives.
    op_cls, spec = OPS[op_kind][0], EXAMPLE_SPECS[op_kind]
    make = lambda: op_cls(spec, platform=platform, custom_ops=MODES[mode])  # noqa: E731
    op = make()
    p1, q1, k1 = _example_inputs(spec, seed=1)
    p2, q2, k2 = _example_inputs(spec, seed=2)
    assert not torch.equal(p1, p2)
    op(p1, q1.clone(), k1.clone())
    got_q, got_k = op(p2, q2.clone(), k2.clone())
    fresh_q, fresh_k = make()(p2, q2.clone(), k2.clone())
    assert torch.equal(got_q, fresh_q) and torch.equal(got_k, fresh_k)


@pytest.mark.fixed_cases
@pytest.mark.parametrize("op_kind", list(OPS))
def test_method_chosen_once_at_construction(op_kind):
    op_cls, spec = OPS[op_kind][0], EXAMPLE_SPECS[op_kind]
    positions, query, key = _example_inputs(spec, seed=3)

    graph = op_cls(spec, platform="cpu", custom_ops=False)
    graph.platform, graph.custom_ops = "cuda", True
    assert graph.method == "forward_native"
    with kernels_launched() as launched:
        graph(positions, query.clone(), key.clone())
    assert launched == [dispatch.rotate_native]

    eager = op_cls(spec, platform="cuda", custom_ops=True)
    eager.platform, eager.custom_ops = "cpu", False
    assert eager.method == "forward_cuda"
    with kernels_launched() as launched:
        eager(positions, query.clone(), key.clone())
    if op_cls is RotaryEmbeddingOp:
        assert launched == [dispatch.rotary_embedding_1d]
    elif triton_runs_on("cpu"):
        assert launched == [dispatch.rotate_triton]


# --------------------------------------------------------------------------- the property can fail
# What the property reports for each broken op (properties/mutants/dispatch.py).
MUTANT_FAILURES = {
    "mrope_without_xpu_cpu_overrides": "query, key and positions must have the same batch_size and seq_len",
    "xdrope_without_xpu_override": "query, key and positions must have the same batch_size and seq_len",
    "mrope_cached_cos_sin": "does not match the reference",
    "mrope_accepts_batch_dim": "accepted positions of shape",
}


@pytest.mark.parametrize("broken", [pytest.param(name, marks=pytest.mark.mutant_search(f"dispatch:{name}"))
                                    for name in BROKEN_OPS])
def test_dispatch_property_rejects_broken_op(broken):
    replaced, broken_cls = BROKEN_OPS[broken]
    combos = [(op, p, m) for op, (cls, _) in OPS.items() if cls is replaced for m in MODES for p in PLATFORMS]

    # The property test_dispatch_matches_reference runs, over the broken op's combos at once.
    # Shrunk, not explained: the explain phase re-runs the failure dozens of times.
    @settings(max_examples=60, derandomize=True, database=None, deadline=None, print_blob=False,
              report_multiple_bugs=False, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
    @given(combo=st.sampled_from(combos), data=st.data())
    def dispatch_matches_reference(combo, data):
        op_kind, platform, mode = combo
        case = data.draw(dispatch_cases(op_kind), label="case")
        dispatch_property(broken_cls, case, platform, mode, "cpu")

    with pytest.raises(AssertionError, match=re.escape(MUTANT_FAILURES[broken])):
        dispatch_matches_reference()
