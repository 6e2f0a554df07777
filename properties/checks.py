"""The one check every rotation property ends in: run an implementation on a case and hold it
to the float64 reference with the per-element bound (rope.tolerance)."""

from __future__ import annotations

import pytest
import torch

import reference
from properties.strategies import DTYPES, RotationCase, build_rotation_inputs
from rope.devices import synchronize
from rope.registry import unsupported_reason, working_precision
from rope.tolerance import Comparison, compare_rotation


def skip_if_unsupported(impl_name: str, fn, spec, dtype: str, device: str) -> None:
    reason = unsupported_reason(impl_name, fn, spec, DTYPES[dtype], device)
    if reason:
        pytest.skip(reason)


def run_rotation(fn, case: RotationCase, device: str):
    """Regenerate the case on ``device``, run ``fn``; returns (inputs, q_out, k_out)."""
    inputs = build_rotation_inputs(case, device)
    q_out, k_out = fn(case.spec, inputs.positions, inputs.query, inputs.key, inputs.cache)
    synchronize(device)
    return inputs, q_out, k_out


def compare_case(impl_name: str, fn, case: RotationCase, device: str) -> Comparison:
    """Run ``fn`` on the case and compare with the reference computed from a fresh CPU copy."""
    inputs, q_out, k_out = run_rotation(fn, case, device)
    ref_in = build_rotation_inputs(case, "cpu")        # untouched inputs, regenerated bit-identically
    ref_q, ref_k = reference.rotate(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache)
    result = compare_rotation(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache,
                              q_out, k_out, ref_q, ref_k, working_precision(fn), device=inputs.query.device)
    # Only q and k may be written (in place); positions and the cache are read-only.
    if not torch.equal(inputs.positions.cpu(), ref_in.positions):
        result.problems.append("positions were modified by the implementation")
    if not torch.equal(inputs.cache.cpu(), ref_in.cache):
        result.problems.append("cos_sin_cache was modified by the implementation")
    if case.packed_qkv:
        # The value slice of a packed qkv tensor is not the implementation's to touch.
        width = (case.num_q_heads + case.num_kv_heads) * case.spec.head_size
        if not torch.equal(inputs.storage[:, width:].cpu(), ref_in.storage[:, width:]):
            result.problems.append("value slice of the packed qkv tensor was modified (write outside q/k)")
    return result


def assert_matches_reference(impl_name: str, fn, case: RotationCase, device: str) -> Comparison:
    result = compare_case(impl_name, fn, case, device)
    if not result.ok:
        header = f"{impl_name} on {device} does not match the reference\ncase: {case}"
        raise AssertionError(result.message(header))
    return result
