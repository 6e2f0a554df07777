"""Counter cases (rope.harness.rotation.cases, generator="counter"): made on the device they run on,
the same bits as on the CPU for every view, position pattern and planted NaN; a batch's cases the
same as one at a time, the pair's host twin the same as the device's; the position patterns those
of the torch-cpu cases."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from properties.strategies import rotation_cases
from rope.harness.rotation.cases import (VIEWS, RotationCase, build_rotation_inputs, build_rotation_inputs_many,
                                         build_rotation_pair)
from rope.spec import RopeSpec


def _cases(dtype):
    @st.composite
    def draw(draw_):
        case = draw_(rotation_cases(dtype=dtype, nonfinite=True, max_tokens=12))
        view = draw_(st.sampled_from(VIEWS))
        fields = {"view": view, "packed_qkv": False} if view != "contiguous" else {}
        return dataclasses.replace(case, generator="counter", **fields)
    return draw()


def _same(a, b) -> None:
    for name in ("positions", "query", "key", "storage"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype, name
            assert torch.equal(_bits(x), _bits(y)), name


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns on the CPU (NaN equal to the same NaN)."""
    t = t.cpu().contiguous()
    return t.view(torch.uint8) if t.is_floating_point() and t.numel() else t


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_counter_case_is_the_same_bits_on_every_device(device, data):
    case = data.draw(_cases(data.draw(st.sampled_from(["float32", "bfloat16", "float16"]))))
    made = build_rotation_inputs(case, device)
    assert made.query.device.type == torch.device(device).type if device != "rocm" else True
    _same(made, build_rotation_inputs(case, "cpu"))
    on_device, twin = build_rotation_pair(case, device)
    _same(on_device, made)
    _same(twin, made)
    assert twin.query.device.type == "cpu" and twin.cache.device.type == "cpu"


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_a_batch_is_its_cases_one_at_a_time(device, data):
    shape = data.draw(_cases("bfloat16"))
    cases = [dataclasses.replace(shape, seed=shape.seed + i, num_tokens=data.draw(st.integers(0, 6)),
                                 generator=data.draw(st.sampled_from(["counter", "torch-cpu"])))
             for i in range(data.draw(st.integers(1, 5)))]
    for together, case in zip(build_rotation_inputs_many(cases, device), cases, strict=True):
        _same(together, build_rotation_inputs(case, device))


def test_position_patterns():
    spec = RopeSpec(64, 64, True, (16, 8, 8), max_position=100)
    made = {kind: build_rotation_inputs(RotationCase(spec, 40, 1, 0, "float32", kind, seed=3, generator="counter"))
            .positions for kind in ("uniform", "text", "grid", "last_row")}
    for pos in made.values():
        assert pos.shape == (3, 40) and pos.dtype == torch.int64 and 0 <= pos.min() and pos.max() < 100
    text = made["text"]
    assert torch.equal(text[0], text[1]) and torch.all((text[0].diff() - 1) % 100 == 0)
    assert (made["last_row"] == 99).float().mean() > 0.3 and torch.all(made["last_row"][:, -1] == 99)
    grid = made["grid"]
    assert set((grid[0].diff() % 100).tolist()) <= {0, 1} and len(set(grid[2].tolist())) <= 5   # t steps, w cycles
    assert len(set(made["uniform"].flatten().tolist())) > 60
    one_row = build_rotation_inputs(RotationCase(RopeSpec(64, 64), 7, 1, 0, "float32", "text", seed=3,
                                                 generator="counter")).positions
    assert one_row.shape == (7,) and one_row.is_contiguous()


def test_nan_planted_the_same_way_whatever_the_order():
    case = RotationCase(RopeSpec(64, 64), 30, 4, 2, "bfloat16", seed=5, nonfinite=True, generator="counter")
    x = build_rotation_inputs(case)
    for t in (x.query, x.key):
        assert 1 <= (~t.isfinite()).sum() <= 1 + t.numel() // 50
        assert t.isnan().any() or t.isinf().any()
    clean = build_rotation_inputs(dataclasses.replace(case, nonfinite=False))
    finite = x.query.isfinite()
    assert torch.equal(x.query[finite], clean.query[finite])        # the finite values are the clean case's
