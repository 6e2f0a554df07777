"""FlashInfer's fused FP8 RoPE + paged append as contracts B and C (rope/backends/flashinfer_fused.py).

Without a GPU, ``flashinfer.rope`` is a stand-in that does what the CUDA kernel does
(``pos_enc.cuh``'s RopeQuantizeAppendPagedKVCacheKernel, read for this): a token of batch index -1 is
skipped whole; the page of a token is ``kv_indices[(kv_indptr[b] * page_size + positions[t]) //
page_size]``; rotated values and the pass-through channels are multiplied by ``quant_scale`` in fp32
and stored saturated as FP8.  So these tests hold the adapter's part (the page table, the views, the
reciprocal scale, what it declares) and the check's declared-results path; broken stand-ins (the
scale not inverted, padding tokens written, q's scale left at 1) must fail with their diagnosis.
Where FlashInfer imports (the GPU box), the real op runs through properties/fused with
``--rope-fused-impl flashinfer``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings

from properties.fused.fused_cases import KNOWN_CACHE, KNOWN_MLA, cache_cases, mla_cases
from rope.fused import fp8_max
from rope.harness.fused.cases import build_cache_case, build_mla_case
from rope.harness.fused.check import (check_mla_rope_kv_cache, check_rope_kv_cache, run_mla_rope_kv_cache,
                                      run_rope_kv_cache)
from rope.harness.fused.diagnosis import diagnose
from rope.implementation import FUSED_DRAWS, Implementation
from tests.backends.stand_in_flashinfer import import_over_stand_in, real_adapter

_ADAPTER = "rope.backends.flashinfer_fused"
# What the adapters declare (``draws``): 1-D, FP8 caches with one scale, widths of 16, half dtypes.
FP8_DRAWS = ("1d", "fp8_cache", "one_kv_scale", "dims_of_16", "half_dtypes")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """fp32 rotation of x [..., R] by cos/sin [..., R/2] broadcast over the heads."""
    x = x.to(torch.float32)
    if neox:
        a, b = x.chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)


def _fp8(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    limit = fp8_max(dtype)
    return (x.to(torch.float32) * torch.tensor(scale, dtype=torch.float32)).clamp(-limit, limit).to(dtype)


def stand_in(*, invert_nothing: bool = False, write_padding: bool = False, q_scale_one: bool = False):
    """A CPU ``rope_quantize_fp8_append_paged_kv_cache`` doing what FlashInfer 0.7.4's kernel does; the
    flags break it as a bug would: ``invert_nothing`` multiplies by 1/quant_scale (the scale used as
    vLLM's), ``write_padding`` writes a skipped token to the cache's first row, ``q_scale_one``
    quantizes q unscaled."""
    def op(q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids, paged_kv_cache, kv_indices, kv_indptr,
           batch_indices, positions, is_neox=True, quantize_dtype=None, quant_scale_q=1.0, quant_scale_kv=1.0,
           page_size=16, kv_layout="NHD", q_rope_out=None, q_nope_out=None, enable_pdl=False):
        assert cos_sin_cache.dtype == torch.float32
        mla = k_rope.dim() == 2
        scale_q = 1.0 if q_scale_one else quant_scale_q
        if invert_nothing:
            scale_q, scale_kv = 1.0 / scale_q, 1.0 / quant_scale_kv
        else:
            scale_kv = quant_scale_kv
        half = q_rope.shape[-1] // 2
        cache_0, cache_1 = paged_kv_cache
        for t in range(q_rope.shape[0]):
            b = int(batch_indices[t])
            if b < 0 and not write_padding:
                continue
            page_iter, entry = divmod(int(kv_indptr[max(b, 0)]) * page_size + int(positions[t]), page_size)
            page = int(kv_indices[page_iter])
            row = cos_sin_cache[int(pos_ids[t])]
            cos, sin = row[:half], row[half:]
            q_rope_out[t] = _fp8(_rotate(q_rope[t], cos, sin, is_neox), scale_q, quantize_dtype)
            if q_nope is not None and q_nope_out is not None and q_nope.shape[-1]:
                q_nope_out[t] = _fp8(q_nope[t], scale_q, quantize_dtype)
            k_rot = _fp8(_rotate(k_rope[t], cos, sin, is_neox), scale_kv, quantize_dtype)
            k_pass = _fp8(k_nope[t], scale_kv, quantize_dtype)
            if mla:
                cache_0[page, entry] = k_pass
                cache_1[page, entry] = k_rot
                continue
            r = k_rope.shape[-1]
            for cache, rows in ((cache_0, torch.cat((k_rot, k_pass), dim=-1)), (cache_1, _fp8(v[t], scale_kv,
                                                                                             quantize_dtype))):
                if kv_layout == "HND":
                    cache[page, :, entry] = rows
                else:
                    cache[page, entry] = rows
            assert r + k_nope.shape[-1] == cache_0.shape[-1]
        return q_rope_out, q_nope_out
    return op


@pytest.fixture(scope="module")
def adapter():
    """The adapter module imported over a stand-in ``flashinfer.rope`` (tests/backends/stand_in_flashinfer.py)."""
    return import_over_stand_in(_ADAPTER, {"rope": {"rope_quantize_fp8_append_paged_kv_cache": stand_in()}})


def _cache_check(module, case):
    fn = module.rope_kv_cache_flashinfer
    return check_rope_kv_cache(case, build_cache_case(case, "cpu"), run_rope_kv_cache(fn, case),
                               Implementation.of("flashinfer", fn, "fused"))


def _mla_check(module, case):
    fn = module.mla_rope_kv_cache_flashinfer
    return check_mla_rope_kv_cache(case, build_mla_case(case, "cpu"), run_mla_rope_kv_cache(fn, case),
                                   Implementation.of("flashinfer", fn, "fused"))


def test_one_request_owning_every_block_makes_a_tokens_position_its_slot(adapter):
    indices, indptr, batch, positions = adapter.page_table(torch.tensor([5, -1, 40, 17]), 6, 3)
    assert indices.tolist() == [0, 1, 2] and indptr.tolist() == [0, 3]
    assert batch.tolist() == [0, -1, 0, 0, -1, -1]          # a slot of -1 and tokens past slot_mapping
    assert positions.tolist() == [5, 0, 40, 17, 0, 0]
    assert all(t.dtype == torch.int32 for t in (indices, indptr, batch, positions))


def test_the_adapters_declare_how_their_results_differ_from_the_contracts(adapter):
    for fn, op in ((adapter.rope_kv_cache_flashinfer, "rope_kv_cache"),
                   (adapter.mla_rope_kv_cache_flashinfer, "mla_rope_kv_cache")):
        record = Implementation.of("flashinfer", fn, "fused")
        assert record.fused_op == op and record.fp8_query and record.skips_padding_tokens
        assert record.scales_by_reciprocal and not record.returns_live_key
        assert record.draws == FP8_DRAWS and set(record.draws) <= set(FUSED_DRAWS)
        assert record.version == "0.7.4-stand-in"


@settings(deadline=None, max_examples=8)
@given(case=cache_cases(draws=FP8_DRAWS, max_tokens=12, big=False))
def test_drawn_cache_writes_pass_through_the_adapter(adapter, case):
    fn = adapter.rope_kv_cache_flashinfer
    # Within the declared draws nothing is unsupported but the real op's known NeoX straddle (the
    # stand-in rotates those right: the adapter's part is checked on them too).
    why = Implementation.of("flashinfer", fn, "fused").unsupported_reason(case, "cuda")
    assert why is None or why.startswith("known defect"), why
    result = _cache_check(adapter, case)
    assert result.ok, result.problems


@settings(deadline=None, max_examples=8)
@given(case=mla_cases(draws=FP8_DRAWS, max_tokens=8))
def test_drawn_mla_writes_pass_through_the_adapter(adapter, case):
    why = Implementation.of("flashinfer", adapter.mla_rope_kv_cache_flashinfer, "fused").unsupported_reason(
        case, "cuda")
    assert why is None or why.startswith("known defect"), why
    result = _mla_check(adapter, case)
    assert result.ok, result.problems


@pytest.mark.parametrize("known", ["flashinfer-2792-padding-slots", "flashinfer-fp8-neox-scaled-long"])
def test_the_known_fp8_cases_it_takes_pass(adapter, known):
    case = KNOWN_CACHE[known]
    assert Implementation.of("flashinfer", adapter.rope_kv_cache_flashinfer, "fused").unsupported_reason(
        case, "cuda") is None
    assert _cache_check(adapter, case).ok


BROKEN = [
    # (flag, known case, the diagnosis it must land under)
    ("invert_nothing", "flashinfer-fp8-neox-scaled-long", {"fp8_scale_multiplied", "key_cache_wrong", "q_wrong"}),
    ("write_padding", "flashinfer-2792-padding-slots", {"padding_slot_written"}),
    ("q_scale_one", "flashinfer-fp8-neox-scaled-long", {"q_wrong"}),
]


@pytest.mark.parametrize("flag, known, labels", BROKEN)
def test_a_broken_fused_op_fails_with_its_diagnosis(adapter, monkeypatch, flag, known, labels):
    monkeypatch.setattr(adapter._rope, "rope_quantize_fp8_append_paged_kv_cache", stand_in(**{flag: True}))
    result = _cache_check(adapter, KNOWN_CACHE[known])
    assert not result.ok
    assert diagnose(result)[0] in labels, (diagnose(result), result.problems)


def test_a_broken_mla_op_fails(adapter, monkeypatch):
    case = KNOWN_MLA["aiter-3841-heads-major-q"]
    assert _mla_check(adapter, case).ok
    monkeypatch.setattr(adapter._rope, "rope_quantize_fp8_append_paged_kv_cache", stand_in(invert_nothing=True))
    result = _mla_check(adapter, case)
    assert not result.ok and diagnose(result)[0] in {"q_wrong", "qk_wrong", "fp8_scale_multiplied", "kv_cache_wrong"}


def test_a_padding_tokens_q_is_not_held_where_it_skips_them_and_is_held_otherwise(adapter):
    """The declared skip is what keeps a padding token's unwritten q out of the comparison: without
    the declaration the same call fails on it."""
    case = KNOWN_CACHE["flashinfer-fp8-neox-scaled-long"]
    fn = adapter.rope_kv_cache_flashinfer
    assert _cache_check(adapter, case).ok

    def undeclared(*args, **kwargs):
        return fn(*args, **kwargs)
    for name in ("fp8_query", "scales_by_reciprocal"):
        setattr(undeclared, name, True)
    undeclared.returns_live_key = False
    result = check_rope_kv_cache(case, build_cache_case(case, "cpu"), run_rope_kv_cache(undeclared, case),
                                 Implementation.of("undeclared", undeclared, "fused"))
    assert not result.ok and any(p.startswith("q:") for p in result.problems)


def test_unsupported_shapes_say_why(adapter):
    reason = Implementation.of("flashinfer", adapter.rope_kv_cache_flashinfer, "fused").unsupported_reason
    case = KNOWN_CACHE["sglang-19636-live-k"]
    assert "CUDA only" in reason(case, "cpu")
    assert "FP8 caches only" in reason(case, "cuda")
    assert "1-D positions only" in reason(KNOWN_CACHE["glm-4.1v-fp8-hnd"], "cuda")
    fp8 = KNOWN_CACHE["flashinfer-fp8-neox-scaled-long"]
    assert reason(fp8, "cuda") is None
    assert "one scale" in reason(dataclasses.replace(fp8, v_scale=2.5), "cuda")
    assert "float16/bfloat16" in reason(dataclasses.replace(fp8, dtype="float32"), "cuda")
    assert "multiples of 16" in reason(dataclasses.replace(fp8, spec=dataclasses.replace(fp8.spec, rotary_dim=40)),
                                       "cuda")


# ------------------------------------------------------------- the real op, where FlashInfer runs
STRADDLE_SHAPES = [  # (head_size, rotary_dim, is_neox_style)
    (64, 16, True), (128, 48, True), (96, 48, True), (80, 80, True), (16, 16, True),      # declared wrong
    (64, 32, True), (128, 64, True), (128, 128, True), (128, 96, True),                   # NeoX, right
    (64, 16, False), (128, 48, False), (80, 80, False),                                   # GPT-J, right
]


@pytest.mark.parametrize("head, rotary, neox", STRADDLE_SHAPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_the_fused_ops_neox_straddle_is_declared_exactly(head, rotary, neox, layout):
    # Pinned both ways on the real op: a shape the straddle predicate declares fails the check on q
    # (so a fix upstream shows here), every other one passes.
    from properties.fused.fused_cases import QWEN2, cache_case
    from rope.backends.known_faults import flashinfer_fused_straddle
    from rope.harness.fused.check import check_case
    module = real_adapter(_ADAPTER)
    spec = dataclasses.replace(QWEN2, head_size=head, rotary_dim=rotary, is_neox_style=neox)
    case = cache_case(spec, cache="float8_e4m3fn", k_scale=0.3, v_scale=0.3, layout=layout)
    verdict = check_case("rope_kv_cache", module.rope_kv_cache_flashinfer, case, "cuda")
    torch.cuda.synchronize()
    if flashinfer_fused_straddle(spec):
        assert not verdict.ok and any(p.startswith("q:") for p in verdict.problems), \
            f"declared wrong but right now: FlashInfer fixed it? drop the declaration ({case.brief()})"
        assert "known defect" in module.rope_kv_cache_flashinfer.unsupported_reason(case, "cuda")
    else:
        assert verdict.ok, (case.brief(), verdict.problems)


@pytest.mark.parametrize("rope_dim, neox", [(16, True), (48, True), (64, True), (32, True), (64, False), (48, False)])
def test_the_fused_mla_form_straddles_alike(rope_dim, neox):
    from properties.fused.fused_cases import DEEPSEEK_V3, mla_case
    from rope.backends.known_faults import flashinfer_fused_straddle
    from rope.harness.fused.check import check_case
    module = real_adapter(_ADAPTER)
    spec = dataclasses.replace(DEEPSEEK_V3, head_size=rope_dim, rotary_dim=rope_dim, is_neox_style=neox)
    case = mla_case(spec, kv_lora_rank=512, cache="float8_e4m3fn")
    verdict = check_case("mla_rope_kv_cache", module.mla_rope_kv_cache_flashinfer, case, "cuda")
    torch.cuda.synchronize()
    assert verdict.ok == (flashinfer_fused_straddle(spec) is None), (case.brief(), verdict.problems)
