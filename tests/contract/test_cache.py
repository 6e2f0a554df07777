"""The cos/sin cache is the serving engines' float32 recipe, bit for bit (docs/spec.md §1)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from properties.strategies import KINDS, rope_specs
from rope.cache import cos_sin_cache
from rope.spec import RopeSpec


def recipe(base: float, rotary_dim: int, length: int) -> torch.Tensor:
    """docs/spec.md §1 written out step by step: inv_freq, outer product, cos | sin, all float32."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim
    inv = 1.0 / (base ** exponents)
    freqs = torch.einsum("i,j -> ij", torch.arange(length, dtype=torch.float), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@given(spec=st.sampled_from(KINDS).flatmap(lambda k: rope_specs(kind=k, max_positions=(1, 7, 300, 4096))),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_cache_is_the_float32_recipe_bit_for_bit(spec, dtype):
    expected = recipe(spec.effective_base, spec.rotary_dim, spec.max_position).to(dtype)
    got = cos_sin_cache(spec, dtype)
    assert got.dtype == dtype and got.shape == (spec.max_position, spec.rotary_dim)
    assert torch.equal(got, expected)


def test_ntk_alpha_base_hunyuanocr():
    spec = RopeSpec(128, 128, True, (16, 16, 16, 16), base=10000.0, max_position=64, ntk_alpha=1000.0)
    base = 10000.0 * 1000.0 ** (128 / (128 - 2))
    assert torch.equal(cos_sin_cache(spec), recipe(base, 128, 64))
    assert not torch.equal(cos_sin_cache(spec), recipe(10000.0, 128, 64))


def test_cache_layout_cos_then_sin():
    spec = RopeSpec(64, 32, max_position=5)
    cache = cos_sin_cache(spec)
    assert torch.equal(cache[0], torch.cat((torch.ones(16), torch.zeros(16))))
    assert cache[3, 0] == pytest.approx(torch.cos(torch.tensor(3.0)).item(), abs=1e-6)
    assert cache[3, 16] == pytest.approx(torch.sin(torch.tensor(3.0)).item(), abs=1e-6)


def test_cache_is_identical_on_every_device(device):
    spec = RopeSpec(128, 64, False, (8, 12, 12), max_position=1000)
    assert torch.equal(cos_sin_cache(spec, torch.bfloat16, device).cpu(), cos_sin_cache(spec, torch.bfloat16))


@pytest.mark.parametrize("bad", [torch.int64, "float32"])
def test_cache_rejects_bad_dtype(bad):
    with pytest.raises(ValueError, match=r"dtype=.*must be a floating torch.dtype"):
        cos_sin_cache(RopeSpec(64, 64), bad)


@given(requests=st.lists(st.tuples(st.sampled_from((2, 10, 64, 80)), st.sampled_from((1e4, 1e6)),
                                   st.sampled_from((1, 7, 300, 2048, 4097)),
                                   st.sampled_from((torch.float32, torch.float16, torch.bfloat16))),
                         min_size=1, max_size=12))
def test_the_harness_tables_are_the_cache_bit_for_bit(requests):
    # The harness memoizes tables and serves shorter ones as prefixes of longer ones, in any
    # order of requests: each must still be exactly what rope.cache builds for its spec.
    from rope.harness.rotation.cases import shared_table
    for width, base, rows, dtype in requests:
        spec = RopeSpec(head_size=128, rotary_dim=width, base=base, max_position=rows)
        table = shared_table(spec, dtype)
        assert table.dtype == dtype and table.is_contiguous()
        assert torch.equal(table, cos_sin_cache(spec, dtype)), (width, base, rows, dtype)
