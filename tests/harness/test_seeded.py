"""Tensors from a seed made on any device (rope.harness.seeded): pinned bits, the host's scalar
equal to the tensor's element, a request's values independent of what is drawn beside it and of
the chunking, the distributions' ranges, and the same bits on every available device."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rope.harness import seeded
from rope.harness.seeded import Request, draw_many

SEEDS = st.integers(0, (1 << 64) - 1)
STREAMS = st.integers(0, 15)


def test_pinned_values():
    """The bits recorded case files regenerate from: a change here changes every counter case."""
    assert seeded.integers(7, 1, (6,), 0, 10).tolist() == [7, 6, 6, 3, 2, 1]
    assert seeded.integers((1 << 64) - 1, 0, (3,), -5, 5).tolist() == [3, -1, -1]
    assert [v * 2 ** 15 for v in seeded.normals(7, 2, (4,)).tolist()] == [14050, -11750, 38429, -3518]


@settings(max_examples=60, deadline=None)
@given(seed=SEEDS, stream=STREAMS, index=st.integers(0, 300), low=st.integers(-1000, 1000),
       span=st.integers(1, 1 << 40))
def test_host_scalar_is_the_tensors_element(seed, stream, index, low, span):
    tensor = seeded.integers(seed, stream, (index + 1,), low, low + span)
    assert seeded.scalar(seed, stream, index, low, low + span) == tensor[index].item()


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, requests=st.lists(st.tuples(STREAMS, st.integers(0, 70), st.booleans()), min_size=1, max_size=6),
       chunk=st.sampled_from([1, 3, 64, seeded.CHUNK]))
def test_a_request_is_the_same_alone_beside_others_and_in_any_chunking(seed, requests, chunk):
    asked = [Request((seed + i) % (1 << 64), stream, count, 0, 97) if integer
             else Request((seed + i) % (1 << 64), stream, count) for i, (stream, count, integer) in enumerate(requests)]
    together = draw_many(asked)
    default, seeded.CHUNK = seeded.CHUNK, chunk
    try:
        alone = [draw_many([request])[0] for request in asked]
    finally:
        seeded.CHUNK = default
    for request, got, want in zip(asked, together, alone, strict=True):
        assert got.dtype == (torch.int64 if request.high is not None else torch.float32)
        assert got.shape == (request.count,) and torch.equal(got, want)


def test_ranges_and_moments():
    x = seeded.normals(3, 0, (1 << 16,))
    assert x.abs().max() <= 4 and torch.all(x * 2 ** 15 == (x * 2 ** 15).round())
    assert abs(x.mean().item()) < 0.02 and abs(x.std().item() - seeded.NORMAL_STD) < 0.02
    i = seeded.integers(3, 1, (4096,), -3, 4)
    assert i.min().item() == -3 and i.max().item() == 3 and set(i.tolist()) == set(range(-3, 4))
    assert not torch.equal(seeded.normals(3, 0, (8,)), seeded.normals(3, 1, (8,)))     # streams differ
    assert not torch.equal(seeded.normals(3, 0, (8,)), seeded.normals(4, 0, (8,)))     # seeds differ


@pytest.mark.parametrize("bad, field", [(dict(count=-1), "count"), (dict(low=3, high=3), "high"),
                                        (dict(low=0, high=(1 << 62) + 1), "high")])
def test_bad_requests_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        Request(**{"seed": 0, "stream": 0, "count": 1, **bad})
    with pytest.raises(ValueError, match="high"):
        seeded.scalar(0, 0, 0, 5, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_same_bits_on_every_device(device, dtype):
    """``device``: each available device (the plugin's parametrization), against the CPU's bits."""
    asked = [Request(11, 0, 100_003), Request(12, 5, 513, -7, 1 << 33), Request(1 << 63, 2, 0), Request(13, 1, 17)]
    for got, want in zip(draw_many(asked, device), draw_many(asked), strict=True):
        assert torch.equal(got.cpu(), want)
    assert torch.equal(seeded.normals(5, 3, (77, 129), dtype, device).cpu(), seeded.normals(5, 3, (77, 129), dtype))
