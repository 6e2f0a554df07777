"""Inputs that overlap in memory: every built-in implementation refuses them with a ValueError
naming the tensors (the contract lets implementations rotate in place, so overlapping q/k
would be a silent wrong answer), decided from metadata alone; the reference, which writes
nothing, stays correct on them.  The overlap predicates are checked against brute force."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, strategies as st

import reference
from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.overlap import check_no_overlap, overlaps_itself, share_memory
from rope.registry import get_implementation
from rope.spec import RopeSpec
from rope.harness.comparison import skip_unless_builtin

ALIASINGS = (
    "query-expanded",        # torch.randn(1, W).expand(T, W): every row is one memory row
    "key-expanded",
    "query-as-strided",      # rows that start closer together than they are wide
    "key-is-query",
    "key-overlaps-query",    # two column windows of one buffer that share columns
    "key-inside-query-rows", # a packed buffer whose k slice reaches into the next row's q
    "query-overlaps-cache",  # q is a view of the cos/sin table it reads
    "key-overlaps-positions",
)
SPECS = (RopeSpec(64, 64, True, max_position=64), RopeSpec(64, 32, False, (4, 6, 6), max_position=64))


def aliased_inputs(kind: str, spec: RopeSpec, num_tokens: int, q_heads: int, device: str, seed: int):
    dev = torch_device(device)
    hs, qw, kw = spec.head_size, q_heads * spec.head_size, spec.head_size
    gen = torch.Generator().manual_seed(seed)
    rows = (spec.num_dims,) if spec.num_dims > 1 else ()
    positions = torch.randint(0, spec.max_position, rows + (num_tokens,), generator=gen).to(dev)
    cache = cos_sin_cache(spec, torch.float32, dev)
    query = torch.randn(num_tokens, qw, generator=gen).to(dev)
    key = torch.randn(num_tokens, kw, generator=gen).to(dev)
    flat = torch.randn(num_tokens * (qw + kw) + qw + kw, generator=gen).to(dev)
    if kind == "query-expanded":
        query = query[:1].expand(num_tokens, qw)
    elif kind == "key-expanded":
        key = key[:1].expand(num_tokens, kw)
    elif kind == "query-as-strided":
        query = flat.as_strided((num_tokens, qw), (qw // 2, 1))
    elif kind == "key-is-query":
        key = query if q_heads == 1 else query[:, :kw]
    elif kind == "key-overlaps-query":
        buf = flat[:num_tokens * (qw + kw)].view(num_tokens, qw + kw)
        query, key = buf[:, :qw], buf[:, qw - hs // 2:qw - hs // 2 + kw]
    elif kind == "key-inside-query-rows":
        # Packed rows of qw + kw; k starts hs channels late, so its last hs run into the next row's q.
        query = flat.as_strided((num_tokens, qw), (qw + kw, 1))
        key = flat.as_strided((num_tokens, kw), (qw + kw, 1), qw + hs)
    elif kind == "query-overlaps-cache":
        table = torch.randn(spec.max_position * spec.rotary_dim + num_tokens * qw, generator=gen).to(dev)
        cache = table[:spec.max_position * spec.rotary_dim].view(spec.max_position, spec.rotary_dim)
        cache.copy_(cos_sin_cache(spec, torch.float32, dev))
        query = table[spec.rotary_dim:spec.rotary_dim + num_tokens * qw].view(num_tokens, qw)
    elif kind == "key-overlaps-positions":
        # int64 positions and a float64 key in one byte buffer: the key reinterprets the positions.
        key = key.double()
        query = query.double()
        cache = cache.double()
        store = torch.zeros(positions.numel() + num_tokens * kw, dtype=torch.int64, device=dev)
        store[:positions.numel()] = positions.reshape(-1)
        positions = store[:positions.numel()].view(positions.shape)
        key = store.view(torch.float64)[positions.numel() - 1:positions.numel() - 1 + num_tokens * kw].view(
            num_tokens, kw)
    return positions, query, key, cache


case_strategy = dict(kind=st.sampled_from(ALIASINGS), spec=st.sampled_from(SPECS),
                     num_tokens=st.integers(2, 9), q_heads=st.integers(1, 3), seed=st.integers(0, 2**16))


@given(**case_strategy)
@example(kind="key-is-query", spec=SPECS[1], num_tokens=4, q_heads=2, seed=0)
@example(kind="query-expanded", spec=SPECS[0], num_tokens=4, q_heads=1, seed=0)
def test_implementation_refuses_overlapping_inputs(impl_name, device, kind, spec, num_tokens, q_heads, seed):
    skip_unless_builtin(impl_name)
    positions, query, key, cache = aliased_inputs(kind, spec, num_tokens, q_heads, device, seed)
    before = [t.clone() for t in (positions, query, key, cache)]
    with pytest.raises(ValueError, match=r"(query|key) .*overlap in memory|(query|key) and (key|positions|cos_sin_cache) "
                                         r"overlap in memory"):
        get_implementation(impl_name)(spec, positions, query, key, cache)
    for name, old, new in zip(("positions", "query", "key", "cos_sin_cache"), before, (positions, query, key, cache)):
        assert torch.equal(old, new), f"{name} was written before the overlap was refused"


@given(**case_strategy)
def test_reference_is_correct_on_overlapping_inputs(kind, spec, num_tokens, q_heads, seed):
    # The reference writes nothing: on aliased views it must give what it gives on private copies.
    positions, query, key, cache = aliased_inputs(kind, spec, num_tokens, q_heads, "cpu", seed)
    before = [t.clone() for t in (positions, query, key, cache)]
    q_out, k_out = reference.rotate(spec, positions, query, key, cache)
    q_ref, k_ref = reference.rotate(spec, *(t.clone() for t in before))
    torch.testing.assert_close(q_out, q_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(k_out, k_ref, rtol=0, atol=0, equal_nan=True)
    for old, new in zip(before, (positions, query, key, cache)):
        assert torch.equal(old, new), "the reference wrote to an input"


def test_packed_qkv_and_separate_tensors_are_accepted():
    # The layouts serving engines use are not overlaps: q and k sliced from one packed qkv row,
    # a row-strided q, a single-row q (its row stride is irrelevant).
    spec = SPECS[0]
    buf = torch.zeros(5, 3 * 64 + 64)
    check_no_overlap({"query": buf[:, :128], "key": buf[:, 128:192]}, {"cos_sin_cache": buf[:, 192:]})
    check_no_overlap({"query": torch.zeros(1, 64).as_strided((1, 64), (0, 1))}, {})
    positions = torch.zeros(5, dtype=torch.int64)
    q, k = get_implementation("native")(spec, positions, buf[:, :128], buf[:, 128:192], cos_sin_cache(spec, torch.float32))
    assert q.shape == (5, 128) and k.shape == (5, 64)


# ------------------------------------------------------------------ the predicates, against brute force
def _offsets(t: torch.Tensor) -> list[int]:
    idx = torch.zeros(t.shape, dtype=torch.int64) + t.storage_offset()
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[d] = size
        idx = idx + (torch.arange(size) * stride).view(shape)
    return idx.reshape(-1).tolist()


layouts = st.tuples(st.integers(0, 5), st.integers(0, 6), st.integers(0, 7), st.integers(0, 4), st.integers(0, 12))


@given(layouts)
@example((4, 64, 32, 1, 0))      # rows closer than their width: overlap
@example((3, 2, 2, 3, 0))        # strides (2, 3) over (3, 2): interleaved, disjoint
@example((4, 8, 0, 1, 0))        # expanded
def test_overlaps_itself_is_exact_in_two_dims(layout):
    rows, cols, row_stride, col_stride, offset = layout
    t = torch.empty(200).as_strided((rows, cols), (row_stride, col_stride), offset)
    offsets = _offsets(t)
    assert overlaps_itself(t) == (len(set(offsets)) < len(offsets)), (t.shape, t.stride())


@given(layouts, layouts, st.booleans())
@example((5, 128, 320, 1, 0), (5, 64, 320, 1, 128), True)    # packed qkv: q and k
@example((5, 128, 320, 1, 0), (5, 64, 320, 1, 300), True)    # k runs into the next row's q
def test_share_memory_is_exact_for_row_views_and_never_misses(a, b, same_row_stride):
    if same_row_stride:
        b = (b[0], b[1], a[2], 1, b[4])
        a = (a[0], a[1], a[2], 1, a[4])
    store = torch.empty(2000)
    x = store.as_strided(a[:2], a[2:4], a[4])
    y = store.as_strided(b[:2], b[2:4], b[4])
    truth = bool(set(_offsets(x)) & set(_offsets(y)))
    found = share_memory(x, y)
    if truth:
        assert found, (x.shape, x.stride(), x.storage_offset(), y.shape, y.stride(), y.storage_offset())
    if same_row_stride:
        assert found == truth, (x.shape, x.stride(), x.storage_offset(), y.shape, y.stride(), y.storage_offset())
    assert not share_memory(x, torch.empty(2000).as_strided(b[:2], b[2:4], b[4]))   # another storage


def test_decided_from_metadata_alone():
    # meta tensors have no data: reading one element would raise.  On a GPU, a host sync is an error.
    m = torch.empty(64, device="meta")
    assert overlaps_itself(m[:1].expand(4, 64))
    assert share_memory(m[:32].view(4, 8), m[4:36].view(4, 8))
    if torch.cuda.is_available():
        g = torch.empty(4096, device="cuda")
        torch.cuda.set_sync_debug_mode("error")
        try:
            with pytest.raises(ValueError, match="overlap in memory"):
                check_no_overlap({"query": g[:512].view(8, 64), "key": g[448:960].view(8, 64)}, {"positions": g[1024:]})
        finally:
            torch.cuda.set_sync_debug_mode("default")
