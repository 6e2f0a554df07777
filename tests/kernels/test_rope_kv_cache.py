"""The RoPE + KV-cache write kernel (rope/triton/rope_kv_cache.py) against the float64 reference
(reference/fused.py): q and k (the live k too, whatever its slot) within the rotation's bound; a
cache of the activations' dtype holding the live k's and v's very bits at each slot; an FP8 cache
holding value / scale within half an FP8 spacing (plus what the value's own rounding may move it);
every row no slot names keeping its stale contents bit for bit; v untouched.  Drawn: every map the
rotation kernel takes, NeoX and GPT-J, partial rotary, NHD and HND, block sizes 16-256, padding slots
and short slot mappings, scales other than 1 (as floats and as tensors), packed and separate
q/k/v, joint key/value cache buffers, positions up to 2^17, sometimes past 2^15 token x head
products.  The broken variants show each check can fail.  Its MLA form (contract C, the kernel's
LATENT switch) is held to the reference by properties/fused; here, its tiles and its entry's refusals."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import example, given, settings, strategies as st

import reference.fused as fused_reference
from properties.fused.fused_cases import DEEPSEEK_V3, GLM41V, QWEN2, QWEN3VL, cache_case, cache_cases, mla_case, mla_cases
from rope.devices import triton_runs_on
from rope.spec import VALUE_CHECKS_ENV
from rope.triton.fused_tiles import fp8_code
from rope.triton.rope_kv_cache import (launch_mla_rope_kv_cache, launch_rope_kv_cache, mla_rope_kv_cache_triton,
                                       rope_kv_cache_triton)
from rope.harness.fused.cases import CacheCase, build_cache_case, build_mla_case
from rope.harness.fused.check import bits, cache_write_problems

def _kernel(case: CacheCase):
    def run(inputs):
        return rope_kv_cache_triton(case.spec, inputs.positions, inputs.query, inputs.key, inputs.value,
                                    inputs.key_cache, inputs.value_cache, inputs.slot_mapping, inputs.cos_sin_cache,
                                    kv_layout=case.layout, k_scale=inputs.k_scale, v_scale=inputs.v_scale)
    return run


_case = cache_case


@settings(deadline=None, max_examples=8)
@given(case=cache_cases())
@example(case=_case(QWEN2, num_q_heads=7, num_kv_heads=1, num_tokens=5, padding=0.25, short_slots=2))
@example(case=_case(GLM41V, num_q_heads=16, num_kv_heads=1, cache="float8_e4m3fn", layout="HND", block_size=64,
                    num_blocks=1, k_scale=0.05, positions_kind="last_row", joint_cache=True))
@example(case=_case(QWEN3VL, num_q_heads=8, num_kv_heads=2, cache="float8_e5m2", block_size=256, num_blocks=1,
                    scale_as_tensor=True, k_scale=7.0, v_scale=0.3, positions_kind="grid", packed=False))
def test_rope_kv_cache_matches_reference(device, case):
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    inputs = build_cache_case(case, device)
    problems = cache_write_problems(case, inputs, _kernel(case))
    assert not problems, "\n".join([repr(case)] + problems)


@settings(deadline=None, max_examples=4)
@given(case=cache_cases(kinds=("1d", "interleaved", "mapped"), big=False, max_tokens=12),
       block_t=st.sampled_from([1, 2, 4, 8]), block_h=st.sampled_from([1, 2, 4]))
def test_tiles_change_no_bits(device, case, block_t, block_h):
    """Any tile gives the default launch's bits: a tile past the batch, the heads or the slot
    mapping writes nothing it should not."""
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    results = []
    for tile in ({}, {"block_t": block_t, "block_h": block_h}):
        inputs = build_cache_case(case, device)
        launch_rope_kv_cache(case.spec, inputs.positions, inputs.query, inputs.key, inputs.value, inputs.key_cache,
                             inputs.value_cache, inputs.slot_mapping, inputs.cos_sin_cache, kv_layout=case.layout,
                             k_scale=inputs.k_scale, v_scale=inputs.v_scale, **tile)
        results.append([bits(t.cpu()) for t in (inputs.query, inputs.key, inputs.key_cache, inputs.value_cache)])
    assert all(torch.equal(a, b) for a, b in zip(*results))


@triton.jit
def _encode(x_ptr, out_ptr, n, E5M2: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, fp8_code(tl.load(x_ptr + i, mask=i < n), E5M2), mask=i < n)


def test_fp8_codes_round_to_nearest_even_and_saturate(device):
    """The kernels' FP8 store (rope.triton.fused_tiles.fp8_code) gives torch's code for every bf16
    value and random fp32 bit patterns, saturated to the largest finite value (torch's e5m2 cast
    overflows to inf instead), NaN to a NaN code."""
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    gen = torch.Generator().manual_seed(0)
    values = torch.cat((torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float(),
                        torch.randint(-2**31, 2**31 - 1, (65536,), generator=gen, dtype=torch.int32).view(torch.float32),
                        torch.randn(65536, generator=gen) * 2.0 ** -12))
    for dtype, e5m2 in ((torch.float8_e4m3fn, False), (torch.float8_e5m2, True)):
        codes = torch.empty(values.shape, dtype=torch.uint8, device=device)
        _encode[(triton.cdiv(values.numel(), 16384),)](values.to(device), codes, values.numel(), E5M2=e5m2, BLOCK=16384)
        limit = torch.finfo(dtype).max
        expected = values.clamp(-limit, limit).to(dtype).view(torch.uint8)
        nan = torch.isnan(values)
        assert torch.equal(codes.cpu()[~nan], expected[~nan]), dtype
        assert bool(((codes.cpu()[nan] & 0x7F) == 0x7F).all()), dtype


# ----------------------------------------------------------------------------- broken variants
BROKEN_CASE = _case(QWEN2, num_tokens=6, num_q_heads=2, num_kv_heads=2, cache="float8_e4m3fn", num_blocks=1,
                    padding=0.0, k_scale=0.3, v_scale=2.5)


def _padding_case(case: CacheCase, device: str):
    """The case's inputs with token 2 a padding token (slot -1) and the cache's last slot unwritten."""
    inputs = build_cache_case(case, device)
    slots = inputs.slot_mapping
    last = case.num_blocks * case.block_size - 1
    free = [s for s in range(last) if s not in slots.tolist()]
    slots[slots == last] = free[0]
    slots[2] = -1
    return inputs


def _broken(kind: str, case: CacheCase):
    kernel = _kernel(case)

    def run(inputs):
        k_in = inputs.key.clone()
        q, k = kernel(inputs)
        if kind == "live_k_not_rotated":          # sglang#19636: rotated k cached, the live k left as it was
            k.copy_(k_in)
        elif kind == "padding_written":           # slot -1 taken as a Python index: the cache's last row
            flat = inputs.key_cache.view(torch.uint8).view(-1, *inputs.key_cache.shape[2:])
            flat[-1] = (k[2].reshape(flat.shape[1:]).double() / inputs.k_scale).to(inputs.key_cache.dtype).view(
                torch.uint8)
        elif kind == "scale_multiplied":          # stored = value * scale instead of value / scale
            tokens, slots = fused_reference.slot_rows(inputs.slot_mapping, case.num_tokens)
            rows = (k.double()[tokens] * inputs.k_scale).clamp(-448, 448).to(inputs.key_cache.dtype)
            fused_reference.scatter_rows(inputs.key_cache.view(torch.uint8), rows.view(torch.uint8).reshape(
                -1, case.num_kv_heads, case.spec.head_size), slots, case.block_size, case.layout)
        return q, k
    return run


@pytest.mark.parametrize("kind", ["live_k_not_rotated", "padding_written", "scale_multiplied"])
def test_broken_variants_fail(device, kind):
    if not triton_runs_on(device) or device != "cpu":
        pytest.skip("the broken variants edit CPU tensors")
    case = BROKEN_CASE
    assert not cache_write_problems(case, _padding_case(case, device), _kernel(case))
    problems = cache_write_problems(case, _padding_case(case, device), _broken(kind, case))
    assert problems, kind


def test_entry_refuses_bad_input_before_launching(device, monkeypatch):
    """The kernel's entry raises the contract's ValueErrors before launching (a slot past the cache,
    a scale on a bf16 cache) and its own (strided channels of q or k, which it writes in place);
    the caches are left as they were.  The slot is a value: read on a GPU only under the debug
    switch (rope.spec.checks_values; without it the kernel writes nothing for it, the test below)."""
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    monkeypatch.setenv(VALUE_CHECKS_ENV, "1")
    case = _case(QWEN2, num_tokens=4, num_q_heads=2, num_kv_heads=1)
    inputs = build_cache_case(case, device)
    before = inputs.key_cache.clone()
    calls = {
        r"slot_mapping\[1\]=32": dict(slot_mapping=torch.tensor([0, 32, -1, 3], device=device)),
        r"k_scale=0\.5: the cache is torch\.bfloat16": dict(k_scale=0.5),
        r"key\.stride\(\)": dict(key=torch.empty(inputs.key.shape[1], 4, dtype=inputs.key.dtype, device=device).T),
    }
    for pattern, change in calls.items():
        args = dict(positions=inputs.positions, query=inputs.query, key=inputs.key, value=inputs.value,
                    key_cache=inputs.key_cache, value_cache=inputs.value_cache, slot_mapping=inputs.slot_mapping,
                    cos_sin_cache=inputs.cos_sin_cache, kv_layout=case.layout) | change
        with pytest.raises(ValueError, match=pattern):
            rope_kv_cache_triton(case.spec, **args)
    assert torch.equal(bits(inputs.key_cache.cpu()), bits(before.cpu()))


@pytest.mark.parametrize("cache, layout", [("activation", "NHD"), ("float8_e4m3fn", "HND")])
def test_unchecked_slots_past_the_cache_write_nothing(device, monkeypatch, cache, layout):
    """Where the values are not read (a GPU's default, ROPE_CHECK_VALUES=0 here), a slot past the
    cache writes nothing, in the cache or past it: the caches are views of buffers with guard blocks
    after them, and every bit (q, k, both caches, the guards) equals a launch with those slots -1."""
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    monkeypatch.setenv(VALUE_CHECKS_ENV, "0")
    case = _case(QWEN2, num_tokens=4, num_q_heads=2, num_kv_heads=1, cache=cache, layout=layout)
    num_slots = case.num_blocks * case.block_size
    results = []
    for slots in ([0, num_slots, -1, num_slots + case.block_size + 1], [0, -1, -1, -1]):
        inputs = build_cache_case(case, device)
        buffers = []
        for name in ("key_cache", "value_cache"):
            stale = getattr(inputs, name)
            buffer = torch.empty((stale.shape[0] + 2, *stale.shape[1:]), dtype=stale.dtype, device=stale.device)
            buffer.view(torch.uint8).fill_(0x5A)
            buffer[:-2] = stale
            setattr(inputs, name, buffer[:-2])
            buffers.append(buffer)
        inputs.slot_mapping = torch.tensor(slots, device=inputs.slot_mapping.device)
        _kernel(case)(inputs)
        results.append([bits(t.cpu()) for t in (inputs.query, inputs.key, *buffers)])
    changed = [name for name, a, b in zip(("query", "key", "key_cache and its guard", "value_cache and its guard"),
                                          *results) if not torch.equal(a, b)]
    assert not changed, f"slots {num_slots} and {num_slots + case.block_size + 1} (past the cache) changed {changed}"


# ------------------------------------------------------------------------------- MLA (contract C)
@settings(deadline=None, max_examples=4)
@given(case=mla_cases(max_tokens=12), block_t=st.sampled_from([1, 2, 4]), block_h=st.sampled_from([1, 2, 4]))
def test_mla_tiles_change_no_bits(device, case, block_t, block_h):
    """The kernel's LATENT form at any tile gives the default launch's bits (q_pe of any head stride,
    the latent rows [kv_c | k_pe] written by the k programs alone)."""
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    results = []
    for tile in ({}, {"block_t": block_t, "block_h": block_h}):
        inputs = build_mla_case(case, device)
        launch_mla_rope_kv_cache(case.spec, inputs.positions, inputs.q_pe, inputs.k_pe.reshape(case.num_tokens, -1),
                                 inputs.kv_c, inputs.kv_cache, inputs.slot_mapping, inputs.cos_sin_cache,
                                 scale=inputs.scale, **tile)
        results.append([bits(t.cpu()) for t in (inputs.q, inputs.k_pe, inputs.kv_c, inputs.kv_cache)])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_mla_entry_refuses_bad_input_before_launching(device):
    """The MLA entry raises before launching: q_pe overlapping itself or k_pe (it rotates both in
    place), the latent cache overlapping kv_c, q_pe's channels strided; the cache is left as it was."""
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    case = mla_case(DEEPSEEK_V3, num_tokens=4, num_heads=2, kv_lora_rank=16, nope_dim=0)
    inputs = build_mla_case(case, device)
    before = inputs.kv_cache.clone()
    kv_a = torch.zeros(4, 16 + 64, dtype=inputs.kv_c.dtype, device=device)
    calls = {
        r"q_pe \(.*\): its elements overlap": dict(q_pe=inputs.q_pe[:, :1].expand(4, 2, 64)),
        r"q_pe and k_pe overlap": dict(q_pe=kv_a[:, 16:].unsqueeze(1), k_pe=kv_a[:, 16:]),
        r"kv_cache and kv_c overlap": dict(kv_c=inputs.kv_cache.view(-1)[:4 * 16].view(4, 16)),
        r"q_pe\.stride\(\)": dict(q_pe=torch.zeros(64, 2, 4, dtype=inputs.q_pe.dtype, device=device).permute(2, 1, 0)),
    }
    for pattern, change in calls.items():
        args = dict(positions=inputs.positions, q_pe=inputs.q_pe, k_pe=inputs.k_pe, kv_c=inputs.kv_c,
                    kv_cache=inputs.kv_cache, slot_mapping=inputs.slot_mapping, cos_sin_cache=inputs.cos_sin_cache,
                    scale=inputs.scale) | change
        with pytest.raises(ValueError, match=pattern):
            mla_rope_kv_cache_triton(case.spec, **args)
    assert torch.equal(bits(inputs.kv_cache.cpu()), bits(before.cpu()))
