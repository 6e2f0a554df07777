"""rope.overlap's predicates (rope/overlap.py), exact against brute force and decided from metadata
alone: the layouts serving engines use are not overlaps, and every real overlap is found."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, strategies as st

from rope.cache import cos_sin_cache
from rope.overlap import check_no_overlap, overlaps_itself, share_memory
from rope.registry import get_implementation
from properties.rotation.aliasing import SPECS


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
