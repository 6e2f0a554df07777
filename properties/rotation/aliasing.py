"""Inputs that overlap in memory, the cases of properties/rotation/test_aliasing.py (a case module: the
project's tests of the reference and of the overlap predicates use them too)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.spec import RopeSpec

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
