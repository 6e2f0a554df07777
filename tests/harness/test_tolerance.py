"""The bound is tight: it rejects real precision bugs and never a correctly rounded result."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import reference
from properties.strategies import DTYPES, KINDS, build_rotation_inputs, rotation_cases
from rope.native import rotate_native
from rope.harness.rotation.bound import compare_rotation, rotation_bound, unit_roundoff


def _compare(case, q_out, k_out, precision):
    x = build_rotation_inputs(case)
    rq, rk = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    return compare_rotation(case.spec, x.positions, x.query, x.key, x.cache, q_out, k_out, rq, rk, precision)


def _bf16_compute(case):
    """Computes in bf16 whatever the input dtype (the bug: claims float32)."""
    x = build_rotation_inputs(case)
    bf = torch.bfloat16
    q, k = rotate_native(case.spec, x.positions, x.query.to(bf), None if x.key is None else x.key.to(bf), x.cache.to(bf))
    return q.to(x.query.dtype), None if k is None else k.to(x.query.dtype)


def _exact_then_rounded(case, truncate=False):
    """The float64 reference rounded once to the output dtype: nearest-even, or truncated."""
    x = build_rotation_inputs(case)
    rq, rk = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    dtype = x.query.dtype

    def store(t):
        if t is None:
            return None
        f32 = t.to(torch.float32)
        if truncate and dtype == torch.bfloat16:
            return (f32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
        return f32.to(dtype)
    return store(rq), store(rk)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@given(data=st.data())
def test_bf16_arithmetic_claiming_fp32_fails(dtype, data):
    case = data.draw(rotation_cases(dtype=dtype, kind=data.draw(st.sampled_from(KINDS)), min_tokens=1))
    assert not _compare(case, *_bf16_compute(case), "float32").ok


@given(data=st.data())
def test_truncating_bf16_store_fails(data):
    # The Triton interpreter's fp32->bf16 cast truncates; a kernel relying on it is 1 ulp off
    # on about half of the elements.  Needs enough elements that one rounds differently.
    case = data.draw(rotation_cases(dtype="bfloat16", kind=data.draw(st.sampled_from(KINDS)), min_tokens=4))
    truncated = _exact_then_rounded(case, truncate=True)
    nearest = _exact_then_rounded(case)
    if all(torch.equal(a, b) for a, b in zip(truncated, nearest) if a is not None):
        return  # every value happened to be exact or round down: nothing to distinguish
    assert not _compare(case, *truncated, "float32").ok


@pytest.mark.parametrize("dtype", list(DTYPES))
@given(data=st.data())
def test_correctly_rounded_result_passes(dtype, data):
    case = data.draw(rotation_cases(dtype=dtype, kind=data.draw(st.sampled_from(KINDS))))
    result = _compare(case, *_exact_then_rounded(case), "float32")
    assert result.ok, result.message()
    assert result.worst_ratio <= 1.0


def test_pass_through_bound_is_zero_and_rotated_bound_is_half_ulp():
    from rope.spec import RopeSpec
    spec = RopeSpec(8, 4, True)
    x = torch.ones(1, 8, dtype=torch.bfloat16)
    cos, sin = torch.ones(1, 2, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64)
    ref = x.to(torch.float64)
    bound = rotation_bound(spec, x, ref, cos, sin, torch.bfloat16, "float32")
    assert torch.all(bound[0, 4:] == 0)
    # half an ulp of 1.0 in bf16 (2^-8), plus float32 work (2 * 2^-24) and second-order terms
    assert torch.all((bound[0, :4] > 2 ** -8) & (bound[0, :4] < 2 ** -8 + 3 * 2 ** -24))
    assert unit_roundoff(torch.bfloat16) == 2 ** -8


def _nonfinite_inputs():
    from rope.cache import cos_sin_cache
    from rope.spec import RopeSpec
    spec = RopeSpec(8, 8, True, max_position=16)
    query = torch.arange(1.0, 17.0).reshape(2, 8)
    query[0, 0], query[1, 1] = float("nan"), float("inf")
    positions = torch.tensor([0, 3])
    cache = cos_sin_cache(spec, torch.float32, "cpu")
    ref_q, _ = reference.rotate(spec, positions, query, None, cache)
    return spec, positions, query, cache, ref_q


def test_nonfinite_values_must_match_exactly():
    # NaN where the reference has NaN, the same infinity where it has one, finite elsewhere: an
    # output that is finite where the reference is NaN once passed (NaN > bound is False).
    spec, positions, query, cache, ref_q = _nonfinite_inputs()
    assert torch.isnan(ref_q).any() and torch.isinf(ref_q).any()

    def compare(out):
        return compare_rotation(spec, positions, query, None, cache, out, None, ref_q, None, "float32")
    assert compare(ref_q.float()).ok
    finite_for_nan = ref_q.float().clone()
    finite_for_nan[torch.isnan(ref_q)] = 0.0
    assert not compare(finite_for_nan).ok
    flipped_inf = ref_q.float().clone()
    flipped_inf[torch.isinf(ref_q)] *= -1
    assert not compare(flipped_inf).ok
    nan_for_inf = ref_q.float().clone()
    nan_for_inf[torch.isinf(ref_q)] = float("nan")
    assert not compare(nan_for_inf).ok
    nan_for_finite = ref_q.float().clone()
    nan_for_finite[torch.isfinite(ref_q).nonzero()[0].tolist()[0], torch.isfinite(ref_q).nonzero()[0].tolist()[1]] = float("nan")
    assert not compare(nan_for_finite).ok


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("head_size, rotary_dim", [(128, 128), (128, 64), (64, 16), (80, 80), (32, 8)])
def test_the_bounds_pair_slices_are_the_references_pairs(neox, head_size, rotary_dim):
    # rotation_bound reads a pair's channels through slices (views) where the reference gathers them
    # by index: the same channels, in the same order.
    import dataclasses

    from reference.rotation import pair_indices
    from rope.harness.rotation.bound import pair_slices
    from rope.models import get_model
    spec = dataclasses.replace(get_model("qwen2-7b").spec, head_size=head_size, rotary_dim=rotary_dim,
                               is_neox_style=neox)
    channels = torch.arange(head_size)
    for sliced, indexed in zip(pair_slices(spec), pair_indices(spec)):
        assert torch.equal(channels[sliced], indexed)


@given(data=st.data())
def test_the_all_finite_shortcut_gives_the_masked_errors(data):
    # element_errors skips its non-finite masks on CPU tensors that are all finite: the error and the
    # bound are the masked path's, bit for bit (|got - exp|, the bound where finite, else 0).
    from reference.rotation import select_cos_sin
    from rope.harness.rotation.bound import element_errors
    case = data.draw(rotation_cases(max_tokens=8))
    inputs = build_rotation_inputs(case)
    exp, _ = reference.rotate(case.spec, inputs.positions, inputs.query.clone(), None, inputs.cache)
    got = exp + exp * 1e-6                        # above the reference where it is positive, below elsewhere
    cos, sin = select_cos_sin(case.spec, inputs.positions, inputs.cache)
    finite = torch.isfinite(exp) & torch.isfinite(got)
    bound = rotation_bound(case.spec, inputs.query, exp, cos, sin, inputs.query.dtype, "float32")
    same_nonfinite = (torch.isnan(exp) & torch.isnan(got)) | (torch.isinf(exp) & (got == exp))
    masked = (torch.where(finite, (got - exp).abs(), torch.where(same_nonfinite, 0.0, float("inf"))),
              torch.where(torch.isfinite(bound), bound, torch.zeros_like(bound)))
    for a, b in zip(element_errors(case.spec, inputs.query, got, exp, cos, sin, "float32"), masked):
        assert torch.equal(a.view(torch.int64), b.view(torch.int64))
