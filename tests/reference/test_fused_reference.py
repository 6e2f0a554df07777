"""The float64 references of the fused ops (reference/fused.py) against independent formulations:
torch's own RMSNorm, a dense rotation matrix per token, a token-by-token loop for the cache writes
(slot -> block, offset), the NHD and HND images of one write, DeepSeek's MLA layout (the rope channels
of q as a strided view); and every bad input of the table refused with a ValueError naming the field."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

import reference
import reference.fused as fused
from properties.strategies import KINDS, rope_specs
from rope.cache import cos_sin_cache
from rope.harness.rotation.cases import make_positions
from rope.spec import RopeSpec

SPECS = st.sampled_from(KINDS).flatmap(lambda kind: rope_specs(kind=kind, head_sizes=(64, 32, 80, 16),
                                                                max_positions=(300, 4096)))


def _rotation_matrices(spec: RopeSpec, positions, cache) -> torch.Tensor:
    """float64 [T, D, D]: each token's rotation as a matrix (identity on pass-through channels),
    from the spec's axis map and pairing, written out element by element."""
    rows = positions.reshape(spec.num_dims, -1)
    num_tokens, f = rows.shape[1], spec.num_freqs
    freq = torch.arange(f)
    pos = rows[torch.tensor(spec.axis_map())].T                                 # [T, F]: the row of each frequency
    c, s = cache[pos, freq].double(), cache[pos, f + freq].double()
    a, b = (freq, freq + f) if spec.is_neox_style else (2 * freq, 2 * freq + 1)
    out = torch.eye(spec.head_size, dtype=torch.float64).repeat(num_tokens, 1, 1)
    token = torch.arange(num_tokens)[:, None]
    out[token, a, a], out[token, a, b], out[token, b, a], out[token, b, b] = c, -s, s, c
    return out


def _normed(x: torch.Tensor, weight: torch.Tensor, eps: float, d: int) -> torch.Tensor:
    heads = x.double().reshape(x.shape[0], x.shape[1] // d, d)
    return torch.nn.functional.rms_norm(heads, (d,), weight.double(), eps)


@settings(deadline=None, max_examples=15)
@given(spec=SPECS, num_tokens=st.integers(0, 5), heads=st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(0, 2)),
       dtype=st.sampled_from([torch.bfloat16, torch.float32]), eps=st.sampled_from([1e-6, 0.1]),
       seed=st.integers(0, 2**16))
@example(spec=RopeSpec(64, 32, False, (4, 6, 6), "chunked", max_position=300), num_tokens=3, heads=(2, 1, 1),
         dtype=torch.bfloat16, eps=1e-6, seed=0)
def test_qk_norm_rope_is_torch_rms_norm_then_rotation_matrices(spec, num_tokens, heads, dtype, eps, seed):
    gen = torch.Generator().manual_seed(seed)
    nq, nk, nv = heads
    d = spec.head_size
    qkv = (torch.randn(num_tokens, (nq + nk + nv) * d, generator=gen) * 3).to(dtype)
    qw, kw = ((0.5 + torch.rand(d, generator=gen)).to(dtype) for _ in range(2))
    positions = make_positions(spec, num_tokens, "uniform", gen)
    cache = cos_sin_cache(spec, dtype)
    got = fused.qk_norm_rope(spec, positions, qkv, nq, nk, nv, qw, kw, eps, cache)
    rot = _rotation_matrices(spec, positions, cache.double())                      # [T, D, D]
    q = torch.einsum("tij,thj->thi", rot, _normed(qkv[:, :nq * d], qw, eps, d))
    k = torch.einsum("tij,thj->thi", rot, _normed(qkv[:, nq * d:(nq + nk) * d], kw, eps, d))
    expected = torch.cat((q.reshape(num_tokens, nq * d), k.reshape(num_tokens, nk * d), qkv[:, (nq + nk) * d:].double()), 1)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def _cache_write_by_loop(spec, positions, key, value, key_cache, value_cache, slot_mapping, cache, layout, k_scale,
                         v_scale):
    """The expected caches written token by token: slot -> (block, offset), head by head."""
    k_rot = reference.rotate(spec, positions, key, None, cache)[0]
    d = spec.head_size
    images = {"key_cache": key_cache.double().clone(), "value_cache": value_cache.double().clone()}
    fp8 = key_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    limit = torch.finfo(key_cache.dtype).max if fp8 else math.inf
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot == -1:
            continue
        block, offset = divmod(slot, key_cache.shape[1] if layout == "NHD" else key_cache.shape[2])
        for name, rows, scale in (("key_cache", k_rot, k_scale), ("value_cache", value.double(), v_scale)):
            for h in range(key.shape[1] // d):
                row = rows[t, h * d:(h + 1) * d] / (scale if fp8 else 1.0)
                row = row.clamp(-limit, limit)
                if layout == "NHD":
                    images[name][block, offset, h] = row
                else:
                    images[name][block, h, offset] = row
    return k_rot, images


CACHE_DTYPES = [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


@settings(deadline=None, max_examples=15)
@given(spec=SPECS, num_tokens=st.integers(0, 6), num_kv=st.integers(1, 2), cache_dtype=st.sampled_from(CACHE_DTYPES),
       layout=st.sampled_from(["NHD", "HND"]), block_size=st.sampled_from([1, 4, 16]), short=st.integers(0, 2),
       scales=st.tuples(st.sampled_from([0.3, 2.5]), st.sampled_from([0.05, 7.0])), seed=st.integers(0, 2**16))
def test_rope_kv_cache_is_a_loop_over_tokens(spec, num_tokens, num_kv, cache_dtype, layout, block_size, short, scales,
                                             seed):
    gen = torch.Generator().manual_seed(seed)
    d = spec.head_size
    query = torch.randn(num_tokens, 2 * d, generator=gen).bfloat16()
    key, value = (torch.randn(num_tokens, num_kv * d, generator=gen).mul(40).bfloat16() for _ in range(2))
    num_blocks = max(1, -(-num_tokens // block_size))
    shape = (num_blocks, block_size, num_kv, d) if layout == "NHD" else (num_blocks, num_kv, block_size, d)
    old = [torch.randn(shape, generator=gen).to(cache_dtype) for _ in range(2)]
    n = max(0, num_tokens - short)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    slots[::3] = -1
    positions = make_positions(spec, num_tokens, "uniform", gen)
    cache = cos_sin_cache(spec, torch.bfloat16)
    fp8 = cache_dtype != torch.bfloat16
    k_scale, v_scale = scales if fp8 else (None, None)
    got = fused.rope_kv_cache(spec, positions, query, key, value, old[0], old[1], slots, cache, kv_layout=layout,
                              k_scale=k_scale, v_scale=v_scale)
    k_rot, images = _cache_write_by_loop(spec, positions, key, value, old[0], old[1], slots, cache, layout, k_scale,
                                         v_scale)
    q_rot = reference.rotate(spec, positions, query, None, cache)[0]
    assert torch.equal(got.query, q_rot) and torch.equal(got.key, k_rot)        # every token, padding too
    for name in images:
        assert torch.equal(got.caches[name].nan_to_num(7.0), images[name].nan_to_num(7.0)), name
    expected_written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    expected_written[slots[slots >= 0]] = True
    assert torch.equal(got.written, expected_written.reshape(num_blocks, block_size))


def test_nhd_and_hnd_write_the_same_rows():
    spec = RopeSpec(32, 32, True, max_position=64)
    gen = torch.Generator().manual_seed(0)
    key, value = (torch.randn(5, 64, generator=gen).bfloat16() for _ in range(2))
    positions = torch.arange(5)
    slots = torch.tensor([9, -1, 0, 31, 4])
    nhd = torch.zeros(2, 16, 2, 32, dtype=torch.bfloat16)
    hnd = torch.zeros(2, 2, 16, 32, dtype=torch.bfloat16)
    a = fused.rope_kv_cache(spec, positions, key, key, value, nhd, nhd.clone(), slots, cos_sin_cache(spec))
    b = fused.rope_kv_cache(spec, positions, key, key, value, hnd, hnd.clone(), slots, cos_sin_cache(spec),
                            kv_layout="HND")
    for name in ("key_cache", "value_cache"):
        assert torch.equal(a.caches[name], b.caches[name].transpose(1, 2))
    assert torch.equal(a.written, b.written) and int(a.written.sum()) == 4


def test_mla_rotates_the_rope_channels_and_writes_latent_rows():
    """DeepSeek's layout: q [T, H, 128 + 64] with q_pe its last 64 channels (a strided view), k_pe
    [T, 1, 64], kv_c [T, 512], GPT-J pairing; an FP8 latent cache with scale 0.3; slot -1 skipped."""
    spec = RopeSpec(64, 64, False, max_position=4096)
    gen = torch.Generator().manual_seed(0)
    t, h = 6, 4
    q = torch.randn(t, h, 192, generator=gen).bfloat16()
    k_pe = torch.randn(t, 1, 64, generator=gen).bfloat16()
    kv_c = torch.randn(t, 512, generator=gen).bfloat16()
    kv_cache = torch.randn(3, 16, 576, generator=gen).to(torch.float8_e4m3fn)
    slots = torch.tensor([5, -1, 40, 17, 0, 46])          # the last row (47) unwritten: slot -1 must not land there
    positions = torch.tensor([0, 7, 4095, 100, 3, 2048])
    cache = cos_sin_cache(spec, torch.float32)
    got = fused.mla_rope_kv_cache(spec, positions, q[..., 128:], k_pe, kv_c, kv_cache, slots, cache, scale=0.3)
    q_rot, k_rot = reference.rotate(spec, positions, q[..., 128:].reshape(t, h * 64), k_pe[:, 0], cache)
    assert torch.equal(got.query, q_rot.reshape(t, h, 64)) and torch.equal(got.key, k_rot)
    expected = kv_cache.double()
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            row = torch.cat((kv_c[token].double(), k_rot[token])) / 0.3
            expected[slot // 16, slot % 16] = row.clamp(-448, 448)
    assert torch.equal(got.caches["kv_cache"].nan_to_num(7.0), expected.nan_to_num(7.0))
    assert int(got.written.sum()) == 5 and not bool(got.written[0, 7])


# ------------------------------------------------------------------------------------- bad inputs
S1 = RopeSpec(32, 32, True, max_position=64)
S3 = RopeSpec(32, 32, True, (4, 6, 6), "chunked", max_position=64)
MLA = RopeSpec(64, 64, False, max_position=64)


def _qk(**change):
    args = dict(spec=S1, positions=torch.arange(3), qkv=torch.zeros(3, 4 * 32), num_heads_q=2, num_heads_k=1,
                num_heads_v=1, q_weight=torch.ones(32), k_weight=torch.ones(32), eps=1e-6,
                cos_sin_cache=cos_sin_cache(S1))
    args.update(change)
    return lambda: fused.qk_norm_rope(**args)


def _kv(**change):
    args = dict(spec=S1, positions=torch.arange(3), query=torch.zeros(3, 64), key=torch.zeros(3, 32),
                value=torch.zeros(3, 32), key_cache=torch.zeros(2, 4, 1, 32), value_cache=torch.zeros(2, 4, 1, 32),
                slot_mapping=torch.tensor([0, 5, -1]), cos_sin_cache=cos_sin_cache(S1))
    fp8 = change.pop("fp8", None)
    if fp8:
        args["key_cache"], args["value_cache"] = (torch.zeros(2, 4, 1, 32).to(fp8) for _ in range(2))
    args.update(change)
    return lambda: fused.rope_kv_cache(**args)


def _mla(**change):
    args = dict(spec=MLA, positions=torch.arange(2), q_pe=torch.zeros(2, 3, 64), k_pe=torch.zeros(2, 64),
                kv_c=torch.zeros(2, 16), kv_cache=torch.zeros(1, 4, 80), slot_mapping=torch.tensor([1, -1]),
                cos_sin_cache=cos_sin_cache(MLA))
    args.update(change)
    return lambda: fused.mla_rope_kv_cache(**args)


BAD_INPUTS = {
    "qkv width": (_qk(qkv=torch.zeros(3, 5 * 32)), r"qkv\.shape=\(3, 160\)"),
    "num_heads_k zero": (_qk(num_heads_k=0), r"num_heads_k=0"),
    "num_heads_v negative": (_qk(num_heads_v=-1), r"num_heads_v=-1"),
    "q_weight shape": (_qk(q_weight=torch.ones(16)), r"q_weight\.shape=\(16,\)"),
    "k_weight dtype": (_qk(k_weight=torch.ones(32, dtype=torch.float16)), r"k_weight\.dtype=torch\.float16"),
    "eps negative": (_qk(eps=-1.0), r"eps=-1\.0"),
    "eps nan": (_qk(eps=float("nan")), r"eps=nan"),
    "qk positions rows": (_qk(spec=S3, cos_sin_cache=cos_sin_cache(S3)), r"positions\.shape=\(3,\)"),
    "qk position past cache": (_qk(positions=torch.tensor([0, 1, 64])), r"positions=\[0\.\.64\]"),
    "kv layout": (_kv(kv_layout="NDH"), r"kv_layout='NDH'"),
    "kv key none": (_kv(key=None), r"key=None"),
    "kv value shape": (_kv(value=torch.zeros(3, 64)), r"value\.shape=\(3, 64\)"),
    "kv cache heads": (_kv(key_cache=torch.zeros(2, 4, 2, 32), value_cache=torch.zeros(2, 4, 2, 32)),
                       r"key_cache\.shape=\(2, 4, 2, 32\)"),
    "kv cache shapes differ": (_kv(value_cache=torch.zeros(3, 4, 1, 32)), r"value_cache\.shape=\(3, 4, 1, 32\)"),
    "kv cache 3-D": (_kv(key_cache=torch.zeros(8, 1, 32)), r"key_cache\.shape=\(8, 1, 32\)"),
    "kv cache dtype": (_kv(key_cache=torch.zeros(2, 4, 1, 32, dtype=torch.float16),
                           value_cache=torch.zeros(2, 4, 1, 32, dtype=torch.float16)), r"key_cache\.dtype=torch\.float16"),
    "kv caches one buffer": (_kv(value_cache=None), r"value_cache=NoneType"),
    "kv slot past cache": (_kv(slot_mapping=torch.tensor([0, 8, -1])), r"slot_mapping\[1\]=8"),
    "kv slot below -1": (_kv(slot_mapping=torch.tensor([0, -2, 1])), r"slot_mapping\[1\]=-2"),
    "kv slot twice": (_kv(slot_mapping=torch.tensor([3, 3, -1])), r"slot 3 appears more than once"),
    "kv slot dtype": (_kv(slot_mapping=torch.tensor([0.0, 1.0, 2.0])), r"slot_mapping\.dtype=torch\.float32"),
    "kv slots longer than tokens": (_kv(slot_mapping=torch.tensor([0, 1, 2, 3])), r"slot_mapping\.shape=\(4,\)"),
    "kv scale on bf16 cache": (_kv(k_scale=0.5), r"k_scale=0\.5: the cache is torch\.float32"),
    "kv scale zero": (_kv(fp8=torch.float8_e4m3fn, v_scale=0.0), r"v_scale=0\.0"),
    "kv scale tensor of two": (_kv(fp8=torch.float8_e5m2, k_scale=torch.ones(2)), r"k_scale\.shape=\(2,\)"),
    "kv scale tensor negative": (_kv(fp8=torch.float8_e5m2, k_scale=torch.tensor([-1.0])), r"k_scale=-1\.0"),
    "mla rotary partial": (_mla(spec=RopeSpec(64, 32, False, max_position=64),
                                cos_sin_cache=cos_sin_cache(RopeSpec(64, 32, False, max_position=64))),
                           r"rotary_dim=32 must equal head_size=64"),
    "mla q_pe 2-D": (_mla(q_pe=torch.zeros(2, 64)), r"q_pe\.shape=\(2, 64\)"),
    "mla k_pe width": (_mla(k_pe=torch.zeros(2, 32)), r"k_pe\.shape=\(2, 32\)"),
    "mla kv_cache width": (_mla(kv_cache=torch.zeros(1, 4, 72)), r"kv_cache\.shape=\(1, 4, 72\)"),
    "mla kv_c tokens": (_mla(kv_c=torch.zeros(3, 16)), r"kv_c\.shape=\(3, 16\)"),
    "mla slot past cache": (_mla(slot_mapping=torch.tensor([4, -1])), r"slot_mapping\[0\]=4"),
    "mla q_pe dtype": (_mla(q_pe=torch.zeros(2, 3, 64, dtype=torch.int32)), r"q_pe\.dtype=torch\.int32"),
    "mla q_pe tokens": (_mla(q_pe=torch.zeros(3, 3, 64)), r"q_pe\.shape=\(3, 3, 64\): must have num_tokens=2"),
    "mla k_pe dtype": (_mla(k_pe=torch.zeros(2, 64, dtype=torch.float16)), r"k_pe\.dtype=torch\.float16"),
    "mla kv_c dtype": (_mla(kv_c=torch.zeros(2, 16, dtype=torch.float16)), r"kv_c\.dtype=torch\.float16"),
    "mla kv_cache channels strided": (_mla(kv_cache=torch.zeros(1, 80, 4).transpose(1, 2)), r"kv_cache\.stride\(\)"),
    "mla kv_cache expanded": (_mla(kv_cache=torch.zeros(1, 1, 80).expand(1, 4, 80)), r"kv_cache\.stride\(\)=\(80, 0, 1\)"),
    "mla scale on bf16 cache": (_mla(scale=0.5), r"scale=0\.5: the cache is torch\.float32"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_raises_naming_the_field(name):
    call, pattern = BAD_INPUTS[name]
    with pytest.raises(ValueError, match=pattern):
        call()
