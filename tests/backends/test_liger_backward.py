"""Liger-Kernel's backwards against the float64 reference VJP (rope/harness/rotation/backward.py): chunked
M-RoPE through ``LigerQwen2VLMRopeFunction`` (``rope.backends.liger.rotate_liger``, ``"liger"``) and
1-D RoPE through ``LigerRopeFunction`` (``rotate_liger_1d``).  Liger's kernels are Triton: on the CPU
they run under the interpreter, in float32 and float16 (they compute in the activation dtype, which
the interpreter gets wrong for bf16); on a GPU in every dtype.

Pinned, asserted both ways: Liger's backward rotates the upstream gradient in its own storage
(``dq.transpose(1, 2).contiguous()`` is the gradient itself whenever its storage is
``[B, L, heads, head_dim]``-contiguous, as the gradient of every ``[T, heads * head_size]`` output is).
The gradients it returns are right; the tensor autograd handed it is overwritten, and autograd hands
one gradient tensor to several consumers (``y = rope(q) + s``: the gradient of y goes to both), so a
consumer whose backward runs after Liger's gets a rotated gradient.  Each case checks that the values
match and that nothing else fails; the models' rows and the consumer below check that it is written (an
upstream fix fails there, and the pin is then dropped).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import assume, given, strategies as st

from properties.strategies import DTYPE_SHORT, DTYPES, rotation_cases
from rope.implementation import Implementation
from rope import RopeSpec, cos_sin_cache
from rope.registry import get_implementation, known_defect, unsupported_reason
from properties.rotation.backward_cases import model_cases
from rope.harness.rotation.backward import check_rotation_backward, same_bits

LIGER_WRITES_UPSTREAM = (
    "known mismatch: Liger-Kernel 0.8.5 rotates the upstream gradient in place (LigerRopeFunction and "
    "LigerQwen2VLMRopeFunction backward: dq.transpose(1, 2).contiguous() is the gradient's own storage)")
# adapter -> (its function in rope.backends.liger, the kind of spec it runs, whether the whole head rotates)
ADAPTERS = {"liger": ("rotate_liger", "chunked3", True), "liger-1d": ("rotate_liger_1d", "1d", False)}


def _liger_or_skip(name: str):
    """The adapter, or a skip naming the install command (rope.backends raises ImportError with it)."""
    try:
        import rope.backends.liger as liger
    except ImportError as exc:
        pytest.skip(f"liger-kernel not installed: {exc}")
    return getattr(liger, ADAPTERS[name][0])


def _dtypes(name: str, fn, device: str) -> list[str]:
    """The dtypes the adapter runs on ``device`` (a probe spec of its kind); skip when none."""
    kind = ADAPTERS[name][1]
    probe = model_cases("float32", keys=["qwen2-vl-2b" if kind == "chunked3" else "qwen2-7b"])[0].spec
    dtypes = [d for d in DTYPES if unsupported_reason(name, fn, probe, DTYPES[d], device) is None]
    if not dtypes:
        pytest.skip(f"{name} runs no dtype on {device}: "
                    f"{unsupported_reason(name, fn, probe, torch.float32, device)}")
    return dtypes


def assert_liger_backward(name: str, fn, case, device: str, *, writes: bool | None = None) -> None:
    """The gradients match the reference, and nothing else fails but the pinned defect, the upstream
    gradient written.  ``writes``: whether it must be (a case where some angle is not 0 and every
    gradient finite writes it; where every position is 0 the rotation leaves every bit as it was)."""
    verdict = check_rotation_backward(name, fn, case, device)
    written = [p for p in verdict.problems if "wrote the upstream gradient" in p]
    assert verdict.forward.ok and verdict.backward.ok and verdict.problems == written, \
        verdict.message(f"{name} on {device}: {case.brief()}, seed {case.seed}")
    if writes is not None:        # held (the default run) or let through as declared (--rope-known-defects avoid)
        assert bool(written or verdict.avoided) == writes, \
            f"{name} no longer writes the upstream gradient: {LIGER_WRITES_UPSTREAM}"


@pytest.mark.parametrize("name", list(ADAPTERS))
@given(data=st.data())
def test_liger_backward_matches_reference_vjp(name, device, data):
    fn = _liger_or_skip(name)
    _, kind, whole_head = ADAPTERS[name]
    dtype = data.draw(st.sampled_from(_dtypes(name, fn, device)), label="dtype")
    case = data.draw(rotation_cases(kind=kind, dtype=dtype, is_neox_style=True, full_rotary_only=whole_head,
                                    max_tokens=8, nonfinite=True), label="case")
    case = dataclasses.replace(case, num_q_heads=min(case.num_q_heads, 4), num_kv_heads=min(case.num_kv_heads, 2))
    assume(unsupported_reason(name, fn, case.spec, DTYPES[dtype], device) is None)
    assume(known_defect(name, fn, case.spec, case.num_tokens, DTYPES[dtype], device, num_heads=case.num_q_heads,
                        num_kv_heads=case.num_kv_heads) is None)
    assert_liger_backward(name, fn, case, device)


# Every model of rope/models.yaml whose rotation Liger runs: Qwen2-VL / Qwen2.5-VL / Keye / PaddleOCR-VL's
# chunked NeoX sections (one spec), and Qwen2's 1-D RoPE.
MODEL_ROWS = [("liger", "qwen2-vl-2b"), ("liger-1d", "qwen2-7b")]


@pytest.mark.parametrize("name, model", MODEL_ROWS, ids=[model for _, model in MODEL_ROWS])
def test_liger_backward_on_the_models_it_runs(name, model, device):
    fn = _liger_or_skip(name)
    for dtype in _dtypes(name, fn, device):
        case = model_cases(dtype, keys=[model], num_q_heads=4, num_kv_heads=2)[0]
        assert_liger_backward(name, fn, case, device, writes=True)
    pytest.xfail(LIGER_WRITES_UPSTREAM + f" ({', '.join(DTYPE_SHORT[d] for d in _dtypes(name, fn, device))})")


def test_liger_adapters_declare_autograd():
    for name in ADAPTERS:
        fn = _liger_or_skip(name)
        assert Implementation.of(name, fn).autograd and Implementation.of(name, fn).working_precision == "activation"


@pytest.mark.parametrize("name", ["liger-1d", "triton-autograd"])
def test_another_consumer_of_the_gradient_gets_it_rotated_by_liger_only(name, device):
    # y = rope(q) + s with s = 2 w made before the rotation: autograd hands y's gradient to both
    # operands, and runs s's backward after the rotation's.  Liger's backward rotates that very
    # tensor, so w.grad comes out as 2 R(-θ) g instead of 2 g; the harness's op copies it first.
    spec = RopeSpec(16, 16, True, None, max_position=8)
    fn = _liger_or_skip(name) if name.startswith("liger") else get_implementation(name)
    # Both are Triton: on the CPU they run under the interpreter only (a GPU box's cpu run has none).
    reason = unsupported_reason(name, fn, spec, torch.float32, device)
    if reason is not None:
        pytest.skip(reason)
    gen = torch.Generator().manual_seed(0)
    positions = torch.arange(1, 4).to(device)
    w = torch.randn(3, 32, generator=gen).to(device).requires_grad_()
    query = torch.randn(3, 32, generator=gen).to(device).requires_grad_()
    upstream = torch.randn(3, 32, generator=gen).to(device)
    s = 2 * w
    q_out, _ = fn(spec, positions, query.clone(), None, cos_sin_cache(spec, dtype=torch.float32, device=device))
    ((q_out + s) * upstream).sum().backward()
    right = same_bits(w.grad, 2 * upstream)
    if name.startswith("liger"):
        assert not right, f"Liger's backward no longer writes the upstream gradient: {LIGER_WRITES_UPSTREAM}"
        pytest.xfail(LIGER_WRITES_UPSTREAM)
    assert right


@pytest.mark.parametrize("mode, held", [("check", True), ("avoid", False)])
def test_the_declared_write_is_held_unless_the_run_avoids_known_defects(mode, held, device, monkeypatch):
    # The adapters declare the write (backward_defect): a default run fails on it (an upstream fix shows),
    # a run avoiding known defects holds the gradients alone and says what it let through.
    name, model = MODEL_ROWS[1]
    fn = _liger_or_skip(name)
    assert Implementation.of(name, fn).backward_defect.startswith("known defect")
    monkeypatch.setenv("ROPE_KNOWN_DEFECTS", mode)
    case = model_cases(_dtypes(name, fn, device)[0], keys=[model], num_q_heads=4, num_kv_heads=2)[0]
    verdict = check_rotation_backward(name, fn, case, device)
    assert verdict.forward.ok and verdict.backward.ok
    assert (verdict.diagnosis().label == "upstream_gradient_written") is held
    assert verdict.ok is not held and (verdict.avoided is None) is held
    undeclared = lambda *args: fn(*args)                       # noqa: E731 - the same call, nothing declared
    undeclared.autograd, undeclared.working_precision = True, "activation"
    assert not check_rotation_backward("undeclared", undeclared, case, device).ok     # avoid needs the declaration
