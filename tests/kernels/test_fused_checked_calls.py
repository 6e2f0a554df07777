"""The fused entries check a call's metadata once per signature where no value is read (a GPU: the
same buffers every step), as the rotation's entry does (rope/triton/checked.py): a second call with
the same buffers skips the checks; a call whose tensors differ is checked whole, so aliasing and a
wrong dtype are refused after a good call; where values are read (the CPU, ROPE_CHECK_VALUES=1)
every call is checked whole, so a slot or position past the cache is refused on any call."""

from __future__ import annotations

import pytest
import torch

from properties.fused.fused_cases import DEEPSEEK_V3, QWEN2, cache_case, mla_case, qk_norm_case
from rope.devices import triton_runs_on
from rope.harness.fused.cases import build_cache_case, build_mla_case, build_qk_norm_case
from rope.triton import fused_qk_norm_rope as qk_module
from rope.triton import rope_kv_cache as cache_module

pytestmark = pytest.mark.skipif(not triton_runs_on("cpu"),
                                reason="the kernels run on CPU tensors only under Triton's interpreter "
                                       "(TRITON_INTERPRET=1)")

CACHE = cache_case(QWEN2, num_tokens=3, num_q_heads=2, num_kv_heads=1, cache="float8_e4m3fn", num_blocks=1,
                   padding=0.0)
MLA = mla_case(DEEPSEEK_V3, num_tokens=3, num_heads=2, kv_lora_rank=16, cache="float8_e4m3fn", padding=0.0,
               num_blocks=1)
QK = qk_norm_case(QWEN2, num_tokens=3, num_heads_q=2, num_heads_k=1, num_heads_v=1)


def _cache_call(i, **changed):
    args = dict(positions=i.positions, query=i.query, key=i.key, value=i.value, key_cache=i.key_cache,
                value_cache=i.value_cache, slot_mapping=i.slot_mapping, cos_sin_cache=i.cos_sin_cache) | changed
    return cache_module.rope_kv_cache_triton(CACHE.spec, *args.values(), kv_layout=CACHE.layout,
                                             k_scale=i.k_scale, v_scale=i.v_scale)


def _mla_call(i, **changed):
    args = dict(positions=i.positions, q_pe=i.q_pe, k_pe=i.k_pe, kv_c=i.kv_c, kv_cache=i.kv_cache,
                slot_mapping=i.slot_mapping, cos_sin_cache=i.cos_sin_cache) | changed
    return cache_module.mla_rope_kv_cache_triton(MLA.spec, *args.values(), scale=i.scale)


def _qk_call(i, **changed):
    args = dict(positions=i.positions, qkv=i.qkv) | changed
    return qk_module.qk_norm_rope_triton(QK.spec, args["positions"], args["qkv"], QK.num_heads_q, QK.num_heads_k,
                                         QK.num_heads_v, i.q_weight, i.k_weight, QK.eps, i.cos_sin_cache)


def test_a_cache_write_checks_its_metadata_once_per_signature(monkeypatch):
    monkeypatch.setenv("ROPE_CHECK_VALUES", "0")
    cache_module._CHECKED.clear()
    i = build_cache_case(CACHE)
    _cache_call(i)
    assert len(cache_module._CHECKED) == 1
    _cache_call(i)
    assert len(cache_module._CHECKED) == 1                 # the same metadata: no second entry
    with pytest.raises(ValueError, match="overlap"):       # key is query: refused although query was checked
        _cache_call(i, key=i.query[:, :i.key.shape[1]])
    with pytest.raises(ValueError, match="value.dtype"):
        _cache_call(i, value=i.value.float())
    with pytest.raises(ValueError, match="same memory"):   # one buffer for both caches: refused
        _cache_call(i, value_cache=i.key_cache)
    assert len(cache_module._CHECKED) == 1


# (entry's module, inputs, call, the refused change, the message it is refused with)
ONCE_PER_SIGNATURE = {
    "mla": (cache_module, lambda: build_mla_case(MLA), _mla_call,
            lambda i: dict(k_pe=i.q_pe[:, 0]), "k_pe"),                    # k_pe is q_pe's first head
    "qk_norm": (qk_module, lambda: build_qk_norm_case(QK), _qk_call,
                lambda i: dict(qkv=i.qkv[:1].expand(i.qkv.shape[0], -1)), "overlap"),   # one row three times
}


@pytest.mark.parametrize("entry", list(ONCE_PER_SIGNATURE))
def test_the_other_fused_entries_check_their_metadata_once_per_signature(monkeypatch, entry):
    module, build, call, refused, message = ONCE_PER_SIGNATURE[entry]
    monkeypatch.setenv("ROPE_CHECK_VALUES", "0")
    module._CHECKED.clear()
    i = build()
    call(i)
    call(i)
    assert len(module._CHECKED) == 1
    with pytest.raises(ValueError, match=message):
        call(i, **refused(i))
    assert len(module._CHECKED) == 1


@pytest.mark.parametrize("switch", ["", "1"])
def test_where_values_are_read_every_call_is_checked_whole(monkeypatch, switch):
    # The CPU reads the values (as a GPU does under ROPE_CHECK_VALUES=1): no call comes from the cache,
    # so a slot or a position past the cache is refused after good calls with the same buffers.
    if switch:
        monkeypatch.setenv("ROPE_CHECK_VALUES", switch)
    else:
        monkeypatch.delenv("ROPE_CHECK_VALUES", raising=False)
    cache_module._CHECKED.clear()
    qk_module._CHECKED.clear()
    i, m, q = build_cache_case(CACHE), build_mla_case(MLA), build_qk_norm_case(QK)
    _cache_call(i), _mla_call(m), _qk_call(q)
    assert len(cache_module._CHECKED) == len(qk_module._CHECKED) == 0
    slots = i.key_cache.shape[0] * i.key_cache.shape[1]
    i.slot_mapping[0] = slots                               # in place: the same address
    with pytest.raises(ValueError, match=r"slot_mapping\[0\]"):
        _cache_call(i)
    m.slot_mapping[0] = slots
    with pytest.raises(ValueError, match=r"slot_mapping\[0\]"):
        _mla_call(m)
    q.positions[..., 0] = q.cos_sin_cache.shape[0]
    with pytest.raises(ValueError, match="positions"):
        _qk_call(q)


def test_a_float_scale_is_part_of_the_signature(monkeypatch):
    # A scale refused for a bf16 cache must be refused after a good call with the same tensors.
    monkeypatch.setenv("ROPE_CHECK_VALUES", "0")
    cache_module._CHECKED.clear()
    case = cache_case(QWEN2, num_tokens=3, num_q_heads=2, num_kv_heads=1, cache="activation", num_blocks=1,
                      padding=0.0, k_scale=1.0, v_scale=1.0)
    i = build_cache_case(case)
    cache_module.rope_kv_cache_triton(case.spec, i.positions, i.query, i.key, i.value, i.key_cache, i.value_cache,
                                      i.slot_mapping, i.cos_sin_cache, k_scale=1.0, v_scale=1.0)
    with pytest.raises(ValueError, match="k_scale"):
        cache_module.rope_kv_cache_triton(case.spec, i.positions, i.query, i.key, i.value, i.key_cache,
                                          i.value_cache, i.slot_mapping, i.cos_sin_cache, k_scale=0.5, v_scale=1.0)
    with pytest.raises(ValueError, match="k_scale"):
        cache_module.rope_kv_cache_triton(case.spec, i.positions, i.query, i.key, i.value, i.key_cache,
                                          i.value_cache, i.slot_mapping, i.cos_sin_cache,
                                          k_scale=torch.tensor([2.0]), v_scale=1.0)
