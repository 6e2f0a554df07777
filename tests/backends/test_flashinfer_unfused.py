"""FlashInfer's unfused pair as contract B (rope/backends/flashinfer_unfused.py):
``apply_rope_with_cos_sin_cache_inplace`` then ``flashinfer.page.append_paged_kv_cache``.

Without a GPU both are stand-ins doing what FlashInfer 0.7.4's kernels do (read for this:
``pos_enc.cuh``'s rotation in float32 stored in the activation dtype, in place on q's and k's rows;
``page.cuh``'s AppendPagedKVCacheKernel, which copies a token's k and v rows to page
``kv_indices[(kv_indptr[batch_indices[i]] * page_size + positions[i]) // page_size]`` and has no skip
for a batch index of -1: the stand-in refuses one, as the real kernel would read out of bounds).  So
these tests hold the adapter's part (the page table, the tokens it hands the append, the views, what
it declares); broken stand-ins (k left unrotated, nothing appended) fail with their diagnosis.  Where
FlashInfer imports (the GPU box), the real pair runs through properties/fused with
``--rope-fused-impl flashinfer-unfused`` and through the pins at the end."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings

from properties.fused.fused_cases import APPEND_HEAD_SIZES, KNOWN_CACHE, QWEN2, cache_case, cache_cases
from rope.harness.fused.cases import build_cache_case
from rope.harness.fused.check import check_rope_kv_cache, run_rope_kv_cache
from rope.harness.fused.diagnosis import diagnose
from rope.implementation import FUSED_DRAWS, Implementation
from tests.backends.stand_in_flashinfer import import_over_stand_in, real_adapter

_ADAPTER = "rope.backends.flashinfer_unfused"


def _rotate_rows(x: torch.Tensor, cache: torch.Tensor, positions, head_size: int, neox: bool) -> torch.Tensor:
    """fp32 rotation of x [T, H * head_size] by the cache's rows, rounded once to x's dtype."""
    rotary = cache.shape[1]
    half = rotary // 2
    heads = x.to(torch.float32).unflatten(1, (-1, head_size))
    row = cache[positions.long()]
    cos, sin = row[:, None, :half], row[:, None, half:]
    out = heads.clone()
    if neox:
        a, b = heads[..., :half], heads[..., half:rotary]
        out[..., :half], out[..., half:rotary] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = heads[..., 0:rotary:2], heads[..., 1:rotary:2]
        out[..., 0:rotary:2], out[..., 1:rotary:2] = a * cos - b * sin, b * cos + a * sin
    return out.flatten(1).to(x.dtype)


def rope_stand_in(*, skip_key: bool = False):
    """``apply_rope_with_cos_sin_cache_inplace``; ``skip_key`` leaves k as it was (a bug)."""
    def op(positions, query, key, head_size, cos_sin_cache, is_neox=True):
        assert cos_sin_cache.dtype == torch.float32
        query.copy_(_rotate_rows(query, cos_sin_cache, positions, head_size, is_neox))
        if not skip_key:
            key.copy_(_rotate_rows(key, cos_sin_cache, positions, head_size, is_neox))
    return op


def append_stand_in(*, nothing: bool = False):
    """``append_paged_kv_cache``; ``nothing`` writes no row (a bug)."""
    def op(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
           kv_last_page_len, kv_layout="NHD"):
        k_cache, v_cache = paged_kv_cache
        assert append_key.dim() == 3 and append_value.dim() == 3 and k_cache.dim() == 4
        assert append_key.dtype == k_cache.dtype and append_value.dtype == v_cache.dtype
        assert kv_indptr.shape[0] == kv_last_page_len.shape[0] + 1
        assert bool((batch_indices >= 0).all()), "a batch index of -1: the kernel reads kv_indptr[-1]"
        page_size = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
        if nothing:
            return
        for i in range(append_key.shape[0]):
            page_iter, entry = divmod(int(kv_indptr[int(batch_indices[i])]) * page_size + int(positions[i]), page_size)
            page = int(kv_indices[page_iter])
            for cache, rows in ((k_cache, append_key[i]), (v_cache, append_value[i])):
                if kv_layout == "HND":
                    cache[page, :, entry] = rows
                else:
                    cache[page, entry] = rows
    return op


@pytest.fixture(scope="module")
def adapter():
    """The adapter imported over stand-in ``flashinfer.rope`` and ``flashinfer.page``."""
    return import_over_stand_in(_ADAPTER, {"rope": {"apply_rope_with_cos_sin_cache_inplace": rope_stand_in()},
                                           "page": {"append_paged_kv_cache": append_stand_in()}})


def _check(module, case):
    fn = module.rope_kv_cache_flashinfer_unfused
    return check_rope_kv_cache(case, build_cache_case(case, "cpu"), run_rope_kv_cache(fn, case),
                               Implementation.of("flashinfer-unfused", fn, "fused"))


def _reason(module):
    return Implementation.of("flashinfer-unfused", module.rope_kv_cache_flashinfer_unfused, "fused").unsupported_reason


def test_it_declares_the_contracts_results_and_its_draws(adapter):
    record = Implementation.of("flashinfer-unfused", adapter.rope_kv_cache_flashinfer_unfused, "fused")
    assert record.fused_op == "rope_kv_cache" and record.returns_live_key
    assert not (record.fp8_query or record.skips_padding_tokens or record.scales_by_reciprocal)
    assert set(record.draws) <= set(FUSED_DRAWS) and record.version == "0.7.4-stand-in"
    assert APPEND_HEAD_SIZES == tuple(h for h in adapter.APPEND_HEAD_SIZES if h < 512)


@settings(deadline=None, max_examples=10)
@given(case=cache_cases(draws=("1d", "activation_cache", "append_heads", "half_dtypes"), max_tokens=12, big=False))
def test_drawn_cache_writes_pass_through_the_adapter(adapter, case):
    # Its declared draws keep every case within what the pair takes, but for the rotation's measured
    # faults and defects (the stand-in rotates those right: the adapter's part is checked on them too).
    assert case.cache == "activation" and case.spec.head_size in APPEND_HEAD_SIZES and case.spec.num_dims == 1
    why = _reason(adapter)(case, "cuda")
    assert why is None or why.startswith(("known fault", "known defect")), why
    result = _check(adapter, case)
    assert result.ok, result.problems


@pytest.mark.parametrize("known", ["flashinfer-2792-padding-slots", "sglang-19636-live-k"])
def test_padding_slots_and_the_live_key(adapter, known):
    # Padding slots never reach the append (the stand-in refuses a batch index of -1, as the kernel
    # reads out of bounds on one), and the live k is the rotated one.
    case = dataclasses.replace(KNOWN_CACHE[known], cache="activation", dtype="bfloat16")
    if case.spec.head_size not in APPEND_HEAD_SIZES:
        case = dataclasses.replace(case, spec=dataclasses.replace(case.spec, head_size=128,
                                                                  rotary_dim=min(case.spec.rotary_dim, 128)))
    assert _reason(adapter)(case, "cuda") is None
    result = _check(adapter, case)
    assert result.ok, result.problems


@pytest.mark.parametrize("broken, labels", [
    ("skip_key", {"live_key_unrotated", "key_cache_wrong", "qk_wrong", "k_wrong"}),
    ("nothing", {"key_cache_wrong", "cache_stale", "value_cache_wrong", "kv_cache_wrong"}),
])
def test_a_broken_pair_fails_with_its_diagnosis(adapter, monkeypatch, broken, labels):
    case = cache_case(QWEN2, cache="activation", layout="HND")
    assert _check(adapter, case).ok
    if broken == "skip_key":
        monkeypatch.setattr(adapter._rope, "apply_rope_with_cos_sin_cache_inplace", rope_stand_in(skip_key=True))
    else:
        monkeypatch.setattr(adapter._page, "append_paged_kv_cache", append_stand_in(nothing=True))
    result = _check(adapter, case)
    assert not result.ok
    assert diagnose(result)[0] in labels, (diagnose(result), result.problems)


def test_unsupported_shapes_say_why(adapter):
    reason = _reason(adapter)
    case = cache_case(QWEN2, cache="activation")
    assert reason(case, "cuda") is None
    assert "CUDA only" in reason(case, "cpu")
    assert "no FP8" in reason(dataclasses.replace(case, cache="float8_e4m3fn"), "cuda")
    assert "float16/bfloat16" in reason(dataclasses.replace(case, dtype="float32"), "cuda")
    assert "head sizes" in reason(dataclasses.replace(case, spec=dataclasses.replace(QWEN2, head_size=96,
                                                                                      rotary_dim=96)), "cuda")
    assert "1-D positions only" in reason(dataclasses.replace(KNOWN_CACHE["glm-4.1v-fp8-hnd"], cache="activation"),
                                          "cuda")
    assert reason(dataclasses.replace(case, spec=dataclasses.replace(QWEN2, rotary_dim=40)), "cuda") \
        .startswith("known fault")                   # NeoX rotary not a multiple of 16: misaligned loads


def test_the_adapter_refuses_what_the_append_would_misread(adapter):
    fn = adapter.rope_kv_cache_flashinfer_unfused
    for case, match in ((cache_case(QWEN2, cache="float8_e4m3fn", k_scale=0.3, v_scale=0.3), "no FP8"),
                        (cache_case(dataclasses.replace(QWEN2, head_size=96, rotary_dim=96)), "head_size=96")):
        x = build_cache_case(case, "cpu")
        with pytest.raises(ValueError, match=match):
            fn(case.spec, x.positions, x.query, x.key, x.value, x.key_cache, x.value_cache, x.slot_mapping,
               x.cos_sin_cache, kv_layout=case.layout, k_scale=x.k_scale, v_scale=x.v_scale)


# ------------------------------------------------------------- the real pair, where FlashInfer runs
@pytest.mark.parametrize("head, rotary, neox", [(128, 128, True), (128, 64, False), (64, 32, True), (256, 64, True)])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", [16, 64])
def test_the_real_pair_matches_the_reference(head, rotary, neox, layout, block_size):
    from rope.harness.fused.check import check_case
    module = real_adapter(_ADAPTER)
    spec = dataclasses.replace(QWEN2, head_size=head, rotary_dim=rotary, is_neox_style=neox)
    case = dataclasses.replace(cache_case(spec, cache="activation", layout=layout), block_size=block_size,
                               num_blocks=4, padding=0.25)
    assert module.rope_kv_cache_flashinfer_unfused.unsupported_reason(case, "cuda") is None
    verdict = check_case("rope_kv_cache", module.rope_kv_cache_flashinfer_unfused, case, "cuda")
    torch.cuda.synchronize()
    assert verdict.ok, (case.brief(), verdict.problems)
