"""The benchmark's machinery: the byte floor, the check before timing, and the reports."""

from __future__ import annotations

import json

import pytest
import torch

from rope.harness import bench
from rope.models import get_model


def test_rotation_bytes_floor_qwen25_vl_72b():
    spec = get_model("qwen2.5-vl-72b").spec
    # 4096 tokens x (64 + 8) heads x 128 channels x 2 bytes, read and written; cos+sin 128 x 2 bytes
    # per token; 3 int64 positions per token.
    assert bench.rotation_bytes(spec, 4096, 64, 8, 2) == 2 * 4096 * 72 * 128 * 2 + 4096 * 128 * 2 + 4096 * 3 * 8


def test_check_sample_flags_a_broken_implementation(device):
    from properties.mutants.broken_rotations import neox_for_gptj
    spec = get_model("glm-4.1v-9b").spec
    import torch
    pos, q, k = bench._inputs(spec, 8, 4, 2, torch.bfloat16, device)
    cache = __import__("rope").cos_sin_cache(spec, torch.bfloat16, q.device)
    assert bench.check_sample(spec, bench.rotate_native, pos, q, k, cache).startswith("ok")
    assert bench.check_sample(spec, neox_for_gptj, pos, q, k, cache).startswith("MISMATCH")


@pytest.mark.slow
def test_bench_smoke_writes_reports(tmp_path):
    from rope.devices import triton_runs_on
    impls = ("triton", "native") if triton_runs_on("cpu") else ("native",)
    data = bench.run(models=("glm-4.1v-9b",), tokens=(1, 2), device="cpu", positions=(),
                     progress=lambda s: None, only=impls)
    paths = bench.write_reports(data, tmp_path)
    assert [p.name for p in paths] == ["bench.json", "bench.md", "bench.png"]
    loaded = json.loads(paths[0].read_text())
    assert {r["impl"] for r in loaded["results"]} == set(impls)
    assert all(r["checked"].startswith("ok") for r in loaded["results"])
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| glm-4.1v-9b | 1 | native |" in paths[1].read_text()


@pytest.mark.slow
def test_bench_positions_checks_times_and_plots(tmp_path):
    # The position half of `rope-harness bench` on the CPU (small steps: decode, and prefill chunks
    # over two blocks), so that it cannot rot where CI has no GPU; its panel joins the plot.
    from rope.devices import triton_runs_on
    if not triton_runs_on("cpu"):
        pytest.skip("Triton does not run on the CPU here")
    data = bench.run(models=(), device="cpu", positions=((3, 1), (2, 300)), progress=lambda s: None,
                     only=("native",))
    assert [(r["model"], r["impl"]) for r in data["results"]] == [
        ("3x1", "native"), ("3x1", "triton"), ("2x300", "native"), ("2x300", "triton")]
    assert all(r["checked"].startswith("ok") and r["ms"] > 0 for r in data["results"]), data["results"]
    paths = bench.write_reports(data, tmp_path)
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 2x300 | 600 | triton |" in paths[1].read_text()


def test_input_sets_span_the_l2_and_stay_bounded(monkeypatch):
    # The rotation timer's copies: one pass over them must move ROTATE_L2_MULTIPLE L2 caches of bytes
    # (else the L2 flatters large sizes), never more than MAX_INPUT_SETS copies, and one set where a
    # CUDA graph times a single set (decode sizes) or off the GPU.  The L2 size is faked: no GPU here.
    import types
    import torch
    from rope.harness import bench
    l2 = 60 << 20
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(L2_cache_size=l2))
    n = bench.input_sets("cuda", 150_000_000, 4096)
    assert n * 150_000_000 >= bench.ROTATE_L2_MULTIPLE * l2 > (n - 1) * 150_000_000
    assert bench.input_sets("cuda", 10, 4096) == bench.MAX_INPUT_SETS
    assert bench.input_sets("cuda", 10, bench.GRAPH_MAX_TOKENS) == 1
    assert bench.input_sets("cpu", 10, 4096) == 1
    assert bench.input_sets("cuda", 10 << 30, 65536) == 1


def test_pdl_empty_launch_only_where_pdl_runs():
    # PDL is a CUDA (cc >= 9) launch attribute: elsewhere the PDL empty launch is NaN and the report
    # does not claim one; where it was measured, the report names it.
    import torch
    from rope.triton.pdl import pdl_available
    assert not pdl_available(torch.device("cpu"))
    assert bench.empty_launch_ms("cpu", pdl=True) != bench.empty_launch_ms("cpu", pdl=True)   # NaN
    data = {"device": "cpu", "device_name": "x", "copy_gbps": 1.0, "empty_launch_ms": 0.001, "torch": "t",
            "results": []}
    assert "programmatic" not in bench.markdown({**data, "empty_launch_pdl_ms": float("nan")})
    assert "0.5 us launched with programmatic" in bench.markdown({**data, "empty_launch_pdl_ms": 0.0005})
