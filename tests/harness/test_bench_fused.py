"""The fused ops' race (rope/harness/bench_fused.py): its rows' bytes, every contender checked before
it is timed (a wrong one is reported and left untimed), and the report's table.  Off the GPU the
Triton kernels run under the interpreter: checked at small sizes, not timed."""

from __future__ import annotations

import math

import pytest

from rope.devices import triton_runs_on
from rope.harness import bench_fused
from rope.harness.bench_report import fused_markdown

pytestmark = pytest.mark.skipif(not triton_runs_on("cpu"), reason="Triton does not run on CPU tensors here")


def test_a_cache_writes_bytes_are_the_rotated_channels_the_reads_and_the_cache_rows():
    case = bench_fused._case("rope_kv_cache", "glm-4.1v-9b", 1000, "float8_e4m3fn")
    spec, t = case.spec, 1000
    d, r, hq, hk = spec.head_size, spec.rotary_dim, case.num_q_heads, case.num_kv_heads
    expected = (2 * t * (hq + hk) * r * 2          # q's and k's rotated channels, read and written (bf16)
                + t * hk * (d - r) * 2 + t * hk * d * 2   # k's pass-through and v read
                + 2 * t * hk * d * 1                # both caches' rows written (FP8)
                + t * r * 2 + t * spec.num_dims * 8 + t * 8)   # cos/sin rows, positions, slots
    assert bench_fused.cache_write_bytes(case) == expected
    norm = bench_fused._case("qk_norm_rope", "glm-4.1v-9b", 1000, "-")
    assert bench_fused.qk_norm_bytes(norm) == (2 * t * (norm.num_heads_q + norm.num_heads_k) * d * 2 + 2 * d * 2
                                               + t * r * 2 + t * spec.num_dims * 8)


def test_every_contender_is_checked_and_the_table_names_the_rows():
    rows = bench_fused.run_fused(models=("qwen2-7b",), tokens=(3,), device="cpu", copy_gbps=100.0,
                                 progress=lambda *_: None)
    assert {(r["op"], r["impl"]) for r in rows} == {(op, impl) for op in bench_fused.OPS
                                                    for impl in ("triton", "unfused")}
    assert all(r["checked"] == "ok" and math.isnan(r["ms"]) for r in rows)        # interpreter: not timed
    assert all(r["floor_ms"] == pytest.approx(r["bytes"] / 100e9 * 1e3) for r in rows)
    table = "\n".join(fused_markdown({"fused": rows}))
    assert "| rope_kv_cache | qwen2-7b | 3 | float8_e4m3fn |" in table and "all ok" in table


def test_a_wrong_contender_is_reported_and_not_timed(monkeypatch):
    from properties.mutants.broken_fused import live_key_unrotated
    real = bench_fused.get_fused_implementation
    monkeypatch.setattr(bench_fused, "get_fused_implementation",
                        lambda name, op: live_key_unrotated if (name, op) == ("triton", "rope_kv_cache")
                        else real(name, op))
    rows = bench_fused.run_fused(models=("qwen2-7b",), tokens=(3,), device="cpu", copy_gbps=100.0,
                                 progress=lambda *_: None, only=("triton",))
    broken = [r for r in rows if r["op"] == "rope_kv_cache"]
    assert broken and all(r["checked"].startswith("FAILED") for r in broken)
    assert "triton: FAILED" in "\n".join(fused_markdown({"fused": rows}))
