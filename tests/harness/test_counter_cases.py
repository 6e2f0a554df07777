"""Counter cases (generator="counter"): made on the device they run on, the same bits as on the CPU
for every view, position pattern and planted NaN (rotation) and for every fused op's case; a batch's
cases the same as one at a time, the pair's host twin the same as the device's; the position
patterns those of the torch-cpu cases, whose bits (and case files) stay as they were."""

from __future__ import annotations

import dataclasses

import pytest
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


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_a_batch_is_made_on_a_gpu_without_waiting_for_it(device, data):
    # A campaign's processes share one GPU: a wait for the device while a batch's inputs are made (a
    # tensor from a Python list is a copy from pageable memory) stalls on every call queued before it.  The
    # batch's cases cover every position pattern, planted non-finite values and packing; the table is
    # built before the check (its first build may wait; later cases map it).
    if torch.device(device).type != "cuda":
        pytest.skip("a host sync is a GPU's (torch.cuda.set_sync_debug_mode)")
    shape = data.draw(_cases("bfloat16"))
    cases = [dataclasses.replace(shape, seed=shape.seed + i, generator="counter", nonfinite=i % 2 == 0,
                                 positions_kind=("uniform", "text", "grid", "last_row")[i % 4],
                                 num_tokens=data.draw(st.integers(1, 6)))
             for i in range(8)]
    build_rotation_inputs_many(cases, device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        made = build_rotation_inputs_many([dataclasses.replace(c, seed=c.seed + 100) for c in cases], device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert len(made) == len(cases)


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


# --------------------------------------------------------------------------- the fused ops' cases
def _fused_cases():
    from properties.fused.fused_cases import cache_case, mla_case, qk_norm_case
    from rope.harness.fused.cases import build_cache_case, build_mla_case, build_qk_norm_case
    q, m = RopeSpec(128, 128, True, (24, 20, 20), max_position=4096), RopeSpec(64, 64, False, max_position=4096)
    return [("qk", build_qk_norm_case, qk_norm_case(q)),
            ("qk-last", build_qk_norm_case, qk_norm_case(q, positions_kind="last_row", row_padding=3)),
            ("cache", build_cache_case, cache_case(q)),
            ("cache-fp8", build_cache_case, cache_case(q, cache="float8_e4m3fn", layout="HND", joint_cache=True,
                                                       positions_kind="text")),
            ("mla", build_mla_case, mla_case(m)),
            ("mla-fp8", build_mla_case, mla_case(m, cache="float8_e5m2", q_layout="heads_major", packed_kv=False,
                                                 positions_kind="grid"))]


def _digest(inputs) -> str:
    import hashlib
    h = hashlib.sha256()
    for name, value in sorted(vars(inputs).items()):
        h.update(name.encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update((t.view(torch.uint8) if t.dtype.is_floating_point else t).numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()[:16]


# The bits of the fixed fused cases drawn on the host, as they were before cases named their generator:
# the case files written then must regenerate them.
HOST_DIGESTS = {"qk": "913f499114153c9b", "qk-last": "b60c1b389f547870", "cache": "779758560ef94f1f",
                "cache-fp8": "0338a596d2445806", "mla": "1edd08954573ef84", "mla-fp8": "d63aedbb09e708bb"}


def test_fused_cases_drawn_on_the_host_keep_their_bits():
    for name, build, case in _fused_cases():
        assert case.generator == "torch-cpu" and _digest(build(case, "cpu")) == HOST_DIGESTS[name], name


def test_fused_counter_cases_are_the_same_bits_on_every_device(device):
    for name, build, case in _fused_cases():
        counter = dataclasses.replace(case, generator="counter")
        made, on_cpu = build(counter, device), build(counter, "cpu")
        assert _digest(made) == _digest(on_cpu), name
        assert _digest(on_cpu) != HOST_DIGESTS[name], name
        for field, value in vars(made).items():
            if isinstance(value, torch.Tensor):
                assert value.device.type == torch.device(device).type or device == "rocm", (name, field)
                assert value.stride() == getattr(on_cpu, field).stride(), (name, field)
    with pytest.raises(ValueError, match="generator='numpy': must be one of"):
        dataclasses.replace(case, generator="numpy")


def test_fused_case_files_without_a_generator_load_as_host_cases():
    from rope.harness.fused.case_file import case_from_dict, case_id
    for name, _, case in _fused_cases():
        record = case.to_dict()
        old = {k: v for k, v in record.items() if k != "generator"}
        op = {"qk": "qk_norm_rope", "cache": "rope_kv_cache", "mla": "mla_rope_kv_cache"}[name.split("-")[0]]
        assert case_from_dict(op, old) == case
        assert case_id("triton", op, case) != case_id("triton", op, dataclasses.replace(case, generator="counter"))
        with pytest.raises(ValueError, match=r"case.generator='mt': must be one of \('counter', 'torch-cpu'\)"):
            case_from_dict(op, record | {"generator": "mt"})
