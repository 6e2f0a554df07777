"""The check of the platform dispatch (docs/spec.md §6): a rope op of rope.dispatch, built for a platform
and a mode, dispatches by the CustomOp rule, rejects positions with an extra batch dim before any
launch, and matches the float64 reference on two calls with different positions (no stale cos/sin),
held to the rotation's bound at the precision of the kernel that ran.  The properties are
properties/dispatch/."""

from __future__ import annotations

import contextlib
import dataclasses
from unittest import mock

import torch

import reference
from rope import dispatch
from rope.devices import synchronize
from rope.dispatch import MODES, PLATFORM_METHODS, PLATFORMS
from rope.harness.rotation.bound import compare_rotation
from rope.harness.rotation.cases import DTYPES, RotationCase, build_rotation_inputs
from rope.native import rotate_native

# The CustomOp rule: graph mode runs forward_native; eager mode the platform's method.
EXPECTED_METHOD = {(p, m): PLATFORM_METHODS[p] if on else "forward_native"
                   for p in PLATFORMS for m, on in MODES.items()}


@contextlib.contextmanager
def kernels_launched():
    """Records the kernels rope.dispatch launches (rotate_native, rotate_triton, rotary_embedding_1d)."""
    launched = []

    def spy(fn):
        def wrapper(*args, **kwargs):
            launched.append(fn)
            return fn(*args, **kwargs)
        return wrapper
    with contextlib.ExitStack() as stack:
        for name in ("rotate_native", "rotate_triton", "rotary_embedding_1d"):
            stack.enter_context(mock.patch.object(dispatch, name, spy(getattr(dispatch, name))))
        yield launched


def dispatch_property(op_cls, case: RotationCase, platform: str, mode: str, device: str) -> None:
    """Build the op for (platform, mode) with tensors on ``device``; then
    (1) it dispatched by the CustomOp rule;
    (2) positions with an extra batch dim are a ValueError naming positions, raised before any launch;
    (3) two calls with different positions each match the reference (no stale cos/sin)."""
    label = f"{op_cls.__name__} platform={platform} mode={mode} on {device}"
    op = op_cls(case.spec, DTYPES[case.dtype], platform=platform, custom_ops=MODES[mode], device=device)
    expected = EXPECTED_METHOD[platform, mode]
    assert op.method == expected, f"{label}: dispatched to {op.method}, expected {expected}"
    _check_rejects_batch_dim(op, case, device, label)
    first = dataclasses.replace(case, seed=(case.seed + 1) % 2 ** 32)
    for call in (first, case):
        _check_call(op, call, device, label)


def _check_rejects_batch_dim(op, case: RotationCase, device: str, label: str) -> None:
    x = build_rotation_inputs(case, device)
    bad = x.positions.unsqueeze(-2)          # [D, 1, T] ([1, T] for 1-D RoPE): sglang#15983
    snapshot = [t.clone() for t in (x.query, x.key) if t is not None]
    shape = tuple(bad.shape)
    try:
        op(bad, x.query, x.key)
    except ValueError as exc:
        if not str(exc).startswith("positions.shape="):
            raise AssertionError(f"{label}: positions of shape {shape} rejected without naming positions: {exc}")
    except Exception as exc:
        raise AssertionError(f"{label}: positions of shape {shape} must raise ValueError naming positions, "
                             f"got {type(exc).__name__}: {exc}") from exc
    else:
        raise AssertionError(f"{label}: {op.method} accepted positions of shape {shape} "
                             f"(must raise ValueError naming positions)")
    after = [t for t in (x.query, x.key) if t is not None]
    assert all(torch.equal(a, b) for a, b in zip(after, snapshot)), \
        f"{label}: query/key modified before positions of shape {shape} were rejected"


def _check_call(op, case: RotationCase, device: str, label: str) -> None:
    x = build_rotation_inputs(case, device)
    with kernels_launched() as launched:
        try:
            q_out, k_out = op(x.positions, x.query, x.key)
        except Exception as exc:
            raise AssertionError(f"{label}: {op.method} failed on positions of shape {tuple(x.positions.shape)}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    synchronize(device)
    # Precision of the kernel that ran; an op that computes by itself is judged like native.
    precision = launched[-1].working_precision if launched else rotate_native.working_precision
    ran = launched[-1].__name__ if launched else "no rope.dispatch kernel"
    # Untouched inputs and the canonical cache, regenerated bit-identically: an op that built its
    # cache by another recipe fails here too.
    ref_in = build_rotation_inputs(case, "cpu")
    ref_q, ref_k = reference.rotate(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache)
    result = compare_rotation(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache, q_out, k_out,
                              ref_q, ref_k, precision, device=x.query.device)
    if not torch.equal(x.positions.cpu(), ref_in.positions):
        result.problems.append("positions were modified by the op")
    if not result.ok:
        raise AssertionError(result.message(
            f"{label}: {op.method} ({ran}) does not match the reference\ncase: {case}"))
