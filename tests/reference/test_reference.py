"""The reference checked against an independent formulation and against the algebra of rotations."""

from __future__ import annotations

import math

import torch
from hypothesis import given, strategies as st

import reference
from properties.strategies import KINDS, RotationCase, build_rotation_inputs, rotation_cases
from properties.strategies import as_1d


def complex_rotation(spec, positions, x, cache):
    """Independent formulation: each pair is a complex number times e^{i theta}, theta read per
    frequency from the axis row the spec names; pairs gathered by explicit channel lists."""
    rows = positions.reshape(spec.num_dims, -1).tolist()
    half = spec.rotary_dim // 2
    out = x.to(torch.float64).clone()
    heads = x.shape[1] // spec.head_size
    axis = spec.axis_map()
    for t in range(x.shape[0]):
        for i in range(half):
            p = rows[axis[i]][t]
            w = complex(float(cache[p, i]), float(cache[p, half + i]))
            a_ch, b_ch = (i, i + half) if spec.is_neox_style else (2 * i, 2 * i + 1)
            for h in range(heads):
                base = h * spec.head_size
                z = complex(float(x[t, base + a_ch]), float(x[t, base + b_ch])) * w
                out[t, base + a_ch], out[t, base + b_ch] = z.real, z.imag
    return out


@given(case=st.sampled_from(KINDS).flatmap(lambda k: rotation_cases(kind=k, max_tokens=6, head_sizes=(8, 16, 32))))
def test_reference_equals_complex_formulation(case):
    x = build_rotation_inputs(case)
    q, k = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    expected = complex_rotation(case.spec, x.positions, x.query, x.cache)
    torch.testing.assert_close(q, expected, rtol=4 * 2.0 ** -53, atol=1e-300)   # both float64, <= 2 roundings
    assert (k is None) == (x.key is None)


@given(case=st.sampled_from(KINDS).flatmap(lambda k: rotation_cases(kind=k, min_tokens=1)))
def test_reference_preserves_pair_norms(case):
    # |R x|^2 = |x|^2 (cos^2 + sin^2) for every pair; pass-through channels are copied.
    x = build_rotation_inputs(case)
    q, _ = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    spec = case.spec
    q_in = x.query.to(torch.float64).reshape(case.num_tokens, -1, spec.head_size)
    q_out = q.reshape(q_in.shape)
    assert torch.equal(q_out[..., spec.rotary_dim:], q_in[..., spec.rotary_dim:])
    cos, sin = reference.rotation.select_cos_sin(spec, x.positions, x.cache)
    a, b = reference.rotation.pair_indices(spec)
    before = (q_in[..., a] ** 2 + q_in[..., b] ** 2) * (cos ** 2 + sin ** 2)[:, None, :]
    after = q_out[..., a] ** 2 + q_out[..., b] ** 2
    torch.testing.assert_close(after, before, rtol=1e-13, atol=1e-300)


@given(case=rotation_cases(kind="chunked3", min_tokens=1))
def test_reference_position_zero_is_identity(case):
    x = build_rotation_inputs(case)
    zeros = torch.zeros_like(x.positions)
    q, _ = reference.rotate(case.spec, zeros, x.query, x.key, x.cache)
    assert torch.equal(q, x.query.to(torch.float64))


def test_reference_worked_example_gptj_partial():
    from rope.spec import RopeSpec
    spec = RopeSpec(head_size=6, rotary_dim=4, is_neox_style=False, sections=(1, 1), base=10000.0, max_position=4)
    cache = torch.zeros(4, 4, dtype=torch.float64)
    cache[1] = torch.tensor([math.cos(0.5), math.cos(0.25), math.sin(0.5), math.sin(0.25)])
    cache[2] = torch.tensor([0.0, 1.0, 1.0, 0.0])      # row 2: freq 0 by 90 degrees, freq 1 identity
    q = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], dtype=torch.float64)
    pos = torch.tensor([[2], [1]])                     # freq 0 <- row 0 (pos 2), freq 1 <- row 1 (pos 1)
    out, _ = reference.rotate(spec, pos, q, None, cache)
    c1, s1 = math.cos(0.25), math.sin(0.25)
    expected = [1 * 0 - 2 * 1, 2 * 0 + 1 * 1, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1, 5.0, 6.0]
    torch.testing.assert_close(out[0], torch.tensor(expected, dtype=torch.float64))


def _neox_to_gptj_channels(spec):
    """Channel order that moves NeoX pair (i, i + rd/2) to GPT-J pair (2i, 2i + 1)."""
    half = spec.rotary_dim // 2
    order = []
    for i in range(half):
        order += [i, i + half]
    return order + list(range(spec.rotary_dim, spec.head_size))


@given(case=st.sampled_from(KINDS).flatmap(lambda k: rotation_cases(kind=k, is_neox_style=True)))
def test_reference_gptj_is_neox_under_channel_permutation(case):
    import dataclasses
    x = build_rotation_inputs(case)
    spec = case.spec
    gptj = dataclasses.replace(spec, is_neox_style=False)
    order = torch.tensor(_neox_to_gptj_channels(spec))

    def permute(t):
        return t.reshape(t.shape[0], t.shape[1] // spec.head_size, spec.head_size)[..., order].reshape(t.shape)
    q_neox, _ = reference.rotate(spec, x.positions, x.query, None, x.cache)
    q_gptj, _ = reference.rotate(gptj, x.positions, permute(x.query), None, x.cache)
    assert torch.equal(q_gptj, permute(q_neox))


@given(case=st.sampled_from(KINDS).flatmap(lambda k: rotation_cases(kind=k, min_tokens=1)))
def test_reference_negated_sin_rotates_back(case):
    # R(-theta) R(theta) x = (cos^2 + sin^2) x on rotated channels; the cache's cos^2 + sin^2 is
    # within a few ulps of 1, so scale by it exactly instead of assuming 1.
    x = build_rotation_inputs(case)
    spec = case.spec
    half = spec.rotary_dim // 2
    cache64 = x.cache.to(torch.float64)
    back_cache = torch.cat((cache64[:, :half], -cache64[:, half:]), dim=1)
    q1, _ = reference.rotate(spec, x.positions, x.query.to(torch.float64), None, cache64)
    q2, _ = reference.rotate(spec, x.positions, q1, None, back_cache)
    cos, sin = reference.rotation.select_cos_sin(spec, x.positions, cache64)
    a, b = reference.rotation.pair_indices(spec)
    scale = torch.ones(case.num_tokens, spec.head_size, dtype=torch.float64)
    scale[:, a] = scale[:, b] = cos ** 2 + sin ** 2
    expected = (x.query.to(torch.float64).reshape(case.num_tokens, -1, spec.head_size) * scale[:, None, :])
    torch.testing.assert_close(q2, expected.reshape(q2.shape), rtol=1e-13, atol=1e-13)


def _exact_cache(spec, length):
    """cos | sin of p * inv_freq evaluated in float64 (no float32 rounding of the angle)."""
    inv = spec.effective_base ** (-torch.arange(0, spec.rotary_dim, 2, dtype=torch.float64) / spec.rotary_dim)
    ang = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), dim=1)


@given(case=rotation_cases(kind="1d", min_tokens=1, max_tokens=8, max_positions=(4096,)),
       shift=st.integers(0, 3000))
def test_reference_1d_score_depends_only_on_position_difference(case, shift):
    # q.k after rotating q at m and k at n equals the same with m + d and n + d (per head).
    spec = case.spec
    x = build_rotation_inputs(case)
    cache = _exact_cache(spec, spec.max_position + shift)
    q = x.query.to(torch.float64)
    k = torch.flip(q, dims=(0,))                  # any key; one per token
    m = x.positions
    n = torch.flip(m, dims=(0,))

    def scores(pm, pn):
        rq, _ = reference.rotate(spec, pm, q, None, cache)
        rk, _ = reference.rotate(spec, pn, k, None, cache)
        return (rq.reshape(len(pm), -1, spec.head_size) * rk.reshape(len(pn), -1, spec.head_size)).sum(-1)
    mags = (q.abs().reshape(len(m), -1, spec.head_size) * k.abs().reshape(len(n), -1, spec.head_size)).sum(-1)
    diff = (scores(m, n) - scores(m + shift, n + shift)).abs()
    # angles p*theta up to ~7000 rad: float64 cos/sin of them are good to ~1e-12 relative
    assert torch.all(diff <= 1e-10 * mags), f"max relative change {(diff / mags).max():.3g}"


@given(case=rotation_cases(kind="interleaved", min_tokens=1))
def test_reference_text_tokens_reduce_to_1d(case):
    case = RotationCase(**{**case.__dict__, "positions_kind": "text"})
    x = build_rotation_inputs(case)
    q3, k3 = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    q1, k1 = reference.rotate(as_1d(case.spec), x.positions[0].contiguous(), x.query, x.key, x.cache)
    assert torch.equal(q3, q1)
