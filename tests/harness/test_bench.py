"""The benchmark's machinery: the byte floor, the check before timing, and the reports."""

from __future__ import annotations

import json

import pytest
import torch

from rope.harness import bench, bench_report
from rope.models import get_model

pytestmark = pytest.mark.stack      # meets the installed torch and Triton: CI runs it on every stack (.ci/run)


def test_rotation_bytes_floor_qwen25_vl_72b():
    spec = get_model("qwen2.5-vl-72b").spec
    # 4096 tokens x (64 + 8) heads x 128 channels x 2 bytes, read and written; cos+sin 128 x 2 bytes
    # per token; 3 int64 positions per token.
    assert bench.rotation_bytes(spec, 4096, 64, 8, 2) == 2 * 4096 * 72 * 128 * 2 + 4096 * 128 * 2 + 4096 * 3 * 8


@pytest.mark.needs_no_gpu
def test_bench_on_the_cpu_as_a_user_types_it(tmp_path):
    # `rope-harness bench --device cpu` with its default sizes (two of the default models: the
    # NeoX and the GPT-J-partial layouts, half the time of all four): small sizes, Triton rows (the
    # interpreter) checked and labelled, never timed; torch.compile whole, one graph per shape; the
    # reports written.  Run as a user runs it: the installed command, in another directory.
    import os
    import shutil
    import subprocess
    import sys
    exe = shutil.which("rope-harness") or os.path.join(os.path.dirname(sys.executable), "rope-harness")
    if not os.path.exists(exe):
        pytest.skip("the rope-harness command is not installed here (a checkout on PYTHONPATH): pip install .")
    models = ("qwen2.5-vl-72b", "glm-4.1v-9b")
    proc = subprocess.run([exe, "bench", "--device", "cpu", "--models", ",".join(models), "--out", str(tmp_path)],
                          cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = data["results"]
    assert {r["tokens"] for r in rows if r["kind"] == "rotation"} == set(bench.CPU_TOKENS)
    assert {r["model"] for r in rows if r["kind"] == "rotation"} == set(models)
    assert all(r["checked"].startswith("ok") for r in rows), [r for r in rows if not r["checked"].startswith("ok")]
    interpreted = [r for r in rows if r["impl"] in ("triton", "triton-public")]
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert interpreted and all(r["ms"] != r["ms"] and r["timing"].startswith("interpreter") for r in interpreted)
        assert max(r["tokens"] for r in interpreted if r["kind"] == "rotation") <= bench.INTERPRETER_CHECK_TOKENS
    compiled = [r for r in rows if r["impl"] == "torch-compile"]
    assert len(compiled) == len(bench.CPU_TOKENS) * len(models)
    assert all(r["note"] == "1 Dynamo graph, fullgraph" for r in compiled), [r["note"] for r in compiled]
    assert {r["model"] for r in rows if r["kind"] == "positions"} == {f"{n}x{c}" for n, c in bench.CPU_POSITION_SHAPES}
    md = (tmp_path / "bench.md").read_text()
    assert "interpreter: checked, not timed" in md and "| qwen2.5-vl-72b | 256 | native |" in md
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _row(impl, ms, checked="ok", ours=False, tokens=4096):
    return bench.Result("rotation", impl, "qwen2.5-vl-72b", tokens, "bfloat16", ms, 1, 1.0, 1.0, checked=checked,
                        ours=ours)


def test_race_takes_the_fastest_peer_that_passed_its_check():
    nan = float("nan")
    rows = [_row("triton", 0.040, ours=True), _row("triton-public", 0.030, ours=True),
            _row("vllm-cuda", 0.020, checked="MISMATCH q[0, 3]"), _row("liger-pregathered", nan),
            _row("liger", 0.050), _row("torch-compile", 0.080), _row("native", 0.5),
            _row("triton", nan, ours=True, tokens=1), _row("native", 0.1, tokens=1)]
    assert bench.race(rows) == [{"model": "qwen2.5-vl-72b", "tokens": 4096, "dtype": "bfloat16", "ours_ms": 0.040,
                                 "best_peer": "liger", "best_peer_ms": 0.050, "ratio": 0.040 / 0.050}]
    md = bench_report.race_markdown({"race": bench.race(rows), "device": "cuda"})
    assert "| qwen2.5-vl-72b | 4096 | bfloat16 | 40.0 | liger | 50.0 | 0.80 |" in md


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_contender_is_checked_on_the_call_that_is_timed(dtype):
    # The bound call is what gets checked: native passes, a peer whose engine call pairs GPT-J
    # NeoX-style (GLM-4.1V) is a MISMATCH row, and both are timed.
    from properties.mutants.broken_rotations import neox_for_gptj
    from rope.harness.bench_contenders import Contender
    from rope.native import rotate_native
    spec = get_model("glm-4.1v-9b").spec
    pos, q, k = bench._inputs(spec, 8, 4, 2, dtype, "cpu")
    cache = __import__("rope").cos_sin_cache(spec, dtype, "cpu")
    for fn, verdict in ((rotate_native, "ok"), (neox_for_gptj, "MISMATCH")):
        contender = Contender(fn.__name__, False, lambda *a, fn=fn: (lambda: fn(*a)), "activation")
        timed = bench.race_rotation(contender, spec, pos, q, k, cache, "cpu", bench._timer("cpu"), 8, 1)
        assert timed["checked"].startswith(verdict) and timed["ms"] > 0 and timed["timing"] == "wall", (fn.__name__, timed)
        assert timed["eager_ms"] != timed["eager_ms"]      # do_bench: GPU only


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
    from rope.triton.targets import pdl_available
    assert not pdl_available(torch.device("cpu"))
    assert bench.empty_launch_ms("cpu", pdl=True) != bench.empty_launch_ms("cpu", pdl=True)   # NaN
    data = {"device": "cpu", "device_name": "x", "copy_gbps": 1.0, "empty_launch_ms": 0.001, "torch": "t",
            "results": []}
    assert "programmatic" not in bench_report.markdown({**data, "empty_launch_pdl_ms": float("nan")})
    assert "0.5 us launched with programmatic" in bench_report.markdown({**data, "empty_launch_pdl_ms": 0.0005})


def test_bench_positions_on_a_cpu_without_the_interpreter_races_native_alone(monkeypatch):
    # The CPU of a GPU box: TRITON_INTERPRET unset there, so no Triton kernel takes CPU tensors.  The
    # position race keeps the native rows and says why Triton is not raced, instead of raising
    # from inside the kernel's launcher.
    import rope.devices
    monkeypatch.setattr(rope.devices, "triton_runs_on", lambda device: False)
    said = []
    rows = bench.bench_positions("cpu", bench._timer("cpu"), 1.0, said.append, shapes=[(2, 4)])
    assert [r.impl for r in rows] == ["native"] and rows[0].checked == "ok"
    assert any("triton not raced" in line for line in said), said


def test_the_host_clock_lets_a_rows_contenders_take_turns(monkeypatch):
    # Each round times every contender once, in turn: a stretch of a busy host slows them alike.
    from rope.harness import bench
    monkeypatch.setattr(bench, "synchronize", lambda device: None)
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    host = bench.host_us_per_call(fns, "cuda", calls=2, rounds=3)
    assert set(host) == {"a", "b", "c"} and all(us > 0 for us in host.values())
    assert order == ["a", "b", "c"] + ["a", "a", "b", "b", "c", "c"] * 3


def test_the_race_compares_eager_times_and_reports_the_hosts():
    # Launched from Python: ours against the peer fastest under do_bench (not under the timer), and
    # the host's time of ours, the public entry, the bare launch and every peer; a peer whose
    # check failed takes no part.
    import math
    from rope.harness import bench

    def row(impl, ms, eager, host, ours=False, checked="ok"):
        return bench.Result("rotation", impl, "m", 4096, "bfloat16", ms, 1000, 1.0, 0.9 * 0.010 / ms,
                            checked=checked, ours=ours, eager_ms=eager, host_us=host, copy_eager_ms=0.0108)
    results = [row("triton", 0.010, 0.012, 20.0, ours=True), row("triton-public", 0.010, 0.012, 25.0, ours=True),
               row("triton-bare", 0.010, 0.012, 30.0, ours=True), row("fast-timer", 0.009, 0.020, 40.0),
               row("fast-eager", 0.011, 0.015, 50.0), row("wrong", 0.001, 0.001, 1.0, checked="MISMATCH")]
    (race,) = bench.race(results)
    assert race["best_peer"] == "fast-timer" and race["best_eager_peer"] == "fast-eager"
    assert math.isclose(race["eager_ratio"], 0.012 / 0.015) and math.isclose(race["ours_eager_frac"], 0.9 * 0.010 / 0.012)
    # The same bytes copied under the same timer: 10.8 us, 0.9 x 10 / 10.8 of the copy bandwidth.
    assert race["copy_eager_ms"] == 0.0108 and math.isclose(race["copy_eager_frac"], 0.9 * 0.010 / 0.0108)
    assert race["host_us"] == {"triton": 20.0, "triton-public": 25.0, "triton-bare": 30.0}
    assert race["peers_host_us"] == {"fast-timer": 40.0, "fast-eager": 50.0}
    data = {"race": [race], "device": "cuda"}
    table = "\n".join(bench_report.race_markdown(data))
    assert ("| m | 4096 | 12.0 | 75.0 | 10.8 | 83.3 | fast-eager | 15.0 | 0.80 | 20.0 | 25.0 | 30.0 | 50.0 | 40.0 |"
            in table)   # peers by name
    del race["copy_eager_ms"], race["copy_eager_frac"]      # a run from before the copy was timed
    assert "| m | 4096 | 12.0 | 75.0 | - | - | fast-eager |" in "\n".join(bench_report.race_markdown(data))


def test_the_same_bytes_copy_moves_as_many_bytes_as_the_rotation():
    # The flushed floor beside ours: a copy reading half the row's bytes and writing the other half,
    # as an in-place rotation of that many bytes reads and writes them.
    spec = get_model("qwen2.5-vl-72b").spec
    nbytes = bench.rotation_bytes(spec, 4096, 64, 8, 2)
    written = bench.same_bytes_copy("cpu", nbytes)()
    assert written.dtype == torch.uint8 and 2 * written.numel() == nbytes


def test_the_race_times_ours_in_the_peers_chain_mode_and_against_the_floor():
    # Under the graph timer the default launch overlaps the call before (PDL) and no peer does: where
    # the run has ours without PDL, that figure is raced and the overlapping one kept beside it; the
    # floor (a same-pattern in-place stream, the same timers) is over ours under each timer.
    import math

    def row(impl, ms, tokens=4096, ours=False, checked="ok", **extra):
        return bench.Result("rotation", impl, "m", tokens, "bfloat16", ms, 1000, 1.0, 0.8 * 0.010 / ms,
                            checked=checked, ours=ours, eager_ms=ms * 1.2, host_us=20.0,
                            floor_ms=0.0096, floor_how="rotating+graph, rows=32", floor_eager_ms=0.0114,
                            floor_eager_how="mul_", **extra)
    results = [row("triton", 0.009, ours=True), row("triton-no-pdl", 0.010, ours=True),
               row("triton-public", 0.010, ours=True), row("peer", 0.0105)]
    (race,) = bench.race(results)
    assert race["ours_ms"] == 0.010 and race["ours_chain"] == "no overlap" and race["ours_pdl_ms"] == 0.009
    assert math.isclose(race["ratio"], 0.010 / 0.0105) and race["best_peer"] == "peer"
    assert math.isclose(race["floor_frac"], 0.0096 / 0.010) and race["floor_how"] == "rotating+graph, rows=32"
    # Eagerly ours is the default launch (no call to overlap after a flush) against the eager floor.
    assert math.isclose(race["floor_eager_frac"], 0.0114 / (0.009 * 1.2)) and race["floor_eager_how"] == "mul_"
    md = "\n".join(bench_report.race_markdown({"race": [race], "device": "cuda"}))
    assert "without programmatic dependent launch" in md
    assert "| m | 4096 | bfloat16 | 10.0 | peer | 10.5 | 0.95 | 9.6 | rotating+graph, rows=32 | 0.960 | - | 9.0 |" in md
    assert "| m | 4096 | 10.8 | 11.4 | mul_ | 1.056 | peer |" in md
    # The copy's bandwidth is quoted from 16,384 tokens only; without the no-PDL run, ours as launched.
    (big,) = bench.race([row("triton", 0.040, tokens=16384, ours=True), row("peer", 0.050, tokens=16384)])
    assert "ours_chain" not in big and big["ours_ms"] == 0.040
    md = "\n".join(bench_report.race_markdown({"race": [big], "device": "cuda"}))
    assert "| m | 16384 | bfloat16 | 40.0 | peer | 50.0 | 0.80 | 9.6 | rotating+graph, rows=32 | 0.240 | 20.0 | - |" in md
    assert "without programmatic dependent launch" not in md
    # A no-overlap launch whose output failed its check is not raced: ours as launched is.
    (bad,) = bench.race([row("triton", 0.009, ours=True), row("triton-no-pdl", 0.010, ours=True, checked="MISMATCH"),
                         row("peer", 0.0105)])
    assert bad["ours_ms"] == 0.009 and "ours_chain" not in bad


def test_the_race_shows_the_channels_only_stream_beside_the_same_bytes_floor():
    # Where the run measured both kinds of stream, the floor is the same-bytes stream and the
    # channels-only stream (fewer bytes) stands beside it in its own columns under each timer, with
    # its ratio to ours; the report says which is which.
    import math
    ours = dict(checked="ok", eager_ms=0.0108, host_us=20.0, floor_ms=0.0097, floor_how="rotating+graph, kernel",
                floor_eager_ms=0.0104, floor_eager_how="kernel,block_t=4", channels_ms=0.0090, channels_how="rows=16",
                channels_eager_ms=0.0095)
    results = [bench.Result("rotation", "triton-no-pdl", "m", 4096, "bfloat16", 0.010, 1000, 1.0, 0.8, ours=True,
                            **ours),
               bench.Result("rotation", "triton", "m", 4096, "bfloat16", 0.010, 1000, 1.0, 0.8, ours=True, **ours),
               bench.Result("rotation", "peer", "m", 4096, "bfloat16", 0.012, 1000, 1.0, 0.7, checked="ok",
                            eager_ms=0.013, host_us=30.0)]
    (race,) = bench.race(results)
    assert math.isclose(race["floor_frac"], 0.97) and math.isclose(race["channels_frac"], 0.90)
    assert race["channels_how"] == "rows=16"
    assert math.isclose(race["floor_eager_frac"], 0.0104 / 0.0108)
    assert math.isclose(race["channels_eager_frac"], 0.0095 / 0.0108)
    md = "\n".join(bench_report.race_markdown({"race": [race], "device": "cuda"}))
    assert "moves a rotation's bytes in its pattern" in md and "is never the floor" in md
    assert "| floor / ours | channels only (us) | channels / ours | % of copy |" in md
    assert "| 9.7 | rotating+graph, kernel | 0.970 | 9.0 | 0.900 | - |" in md
    assert "| m | 4096 | 10.8 | 10.4 | kernel,block_t=4 | 0.963 | 9.5 | 0.880 | peer |" in md
    # A run whose floor was the channels-only stream (older reports) renders its own layout, as written then.
    for key in ("channels_ms", "channels_how", "channels_frac", "channels_eager_ms", "channels_eager_frac"):
        race.pop(key)
    md = "\n".join(bench_report.race_markdown({"race": [race], "device": "cuda"}))
    assert "channels only" not in md and "moves the rotated channels of q and k in place and does nothing else" in md


def test_the_floor_is_the_fastest_same_bytes_stream_never_the_channels_only_one(monkeypatch):
    # The floor moves what a rotation moves: under each timer it is the fastest same-bytes variant
    # (the kernel's stream, the gathering tiles), even where a channels-only variant, which moves
    # fewer bytes, is faster; the channels-only kind's fastest is kept beside it.  Timers faked,
    # variants stubbed.
    from rope.harness import bench_floor
    monkeypatch.setattr(bench_floor, "same_bytes_calls", lambda spec, p, q, k, cache: {"kernel": 1, "tile=2x8": 2})
    monkeypatch.setattr(bench_floor, "channels_calls", lambda spec, q, k: {"mul_": 3, "rows=16": 4})
    graph = {1: 0.012, 2: 0.011, 3: 0.013, 4: 0.010}       # rows=16 fastest, tile=2x8 the fastest same-bytes one
    eager = {1: 0.014, 2: 0.020, 3: 0.016, 4: 0.015}       # kernel fastest eagerly
    spec = get_model("qwen2-7b").spec
    floor = bench_floor.measure_floor(spec, torch.zeros(5, dtype=torch.long), 2, 1, torch.zeros(8, spec.rotary_dim),
                                      torch.float32, 2, lambda calls, tokens: (graph[calls[0]], "rotating+graph"),
                                      lambda call: eager[call])
    assert (floor.ms, floor.how, floor.eager_ms, floor.eager_how) == (0.011, "rotating+graph, tile=2x8", 0.014, "kernel")
    assert (floor.channels_ms, floor.channels_how, floor.channels_eager_ms) == (0.010, "rows=16", 0.015)


def _floor_device():
    from rope.devices import is_interpreter
    if not is_interpreter() and not torch.cuda.is_available():
        pytest.skip("the Triton streams need a GPU or the interpreter")
    return "cuda" if torch.cuda.is_available() and not is_interpreter() else "cpu"


@pytest.mark.parametrize("model", ["qwen2.5-vl-72b", "glm-4.1v-9b"])
def test_every_channels_only_stream_moves_the_rotated_channels_in_place_and_nothing_else(model):
    # The channels-only streams touch the rotated channels a rotation touches: the first rotary_dim
    # channels of every head row of q and k (GLM-4.1V: 64 of 128), in place; the pass-through
    # channels stay.
    from rope.harness.bench_floor import CHANNEL_ROWS, channels_bytes, channels_calls
    device = _floor_device()
    spec = get_model(model).spec
    tokens, num_q, num_kv = 5, 3, 1
    assert channels_bytes(spec, tokens, num_q, num_kv, 4) == 2 * tokens * 4 * spec.rotary_dim * 4
    gen = torch.Generator().manual_seed(0)
    q0 = torch.randn(tokens, num_q * spec.head_size, generator=gen).to(device)
    k0 = torch.randn(tokens, num_kv * spec.head_size, generator=gen).to(device)
    names = list(channels_calls(spec, q0.clone(), k0.clone()))
    for name in names:
        q, k = q0.clone(), k0.clone()
        channels_calls(spec, q, k)[name]()
        for before, after in ((q0, q), (k0, k)):
            b = before.view(tokens, -1, spec.head_size)
            a = after.view(tokens, -1, spec.head_size)
            torch.testing.assert_close(a[..., :spec.rotary_dim], b[..., :spec.rotary_dim] * 1.0000001)
            assert torch.equal(a[..., spec.rotary_dim:], b[..., spec.rotary_dim:]), name
            assert not torch.equal(a[..., :spec.rotary_dim], b[..., :spec.rotary_dim]), name
    assert names == ["mul_", *(f"rows={r}" for r in CHANNEL_ROWS)]


@pytest.mark.parametrize("model, num_q, num_kv", [
    ("qwen2.5-vl-72b", 3, 1),       # chunked sections, 3 position rows
    ("qwen3-vl-8b", 9, 2),          # interleaved sections: each lane's row cycles through the three
    ("glm-4.1v-9b", 5, 2),          # GPT-J pairs, 64 of 128 channels rotated
    ("hunyuan-ocr", 2, 1),          # XD-RoPE, 4 position rows
    ("qwen2-7b", 3, 0),             # 1-D positions, no key
])
def test_every_floor_variant_reads_the_entries_a_rotation_reads_and_rewrites_the_rotated_channels(model, num_q, num_kv):
    # The floor moves a rotation's bytes: each rotated channel is scaled in place by an entry of the
    # cache row named by the position of its frequency's row, whatever the map; nothing else
    # changes.  The gathering tiles scale channel j by column j (frequency j mod rotary_dim/2's cos,
    # then its sin); the kernel's stream scales each pair as the rotation pairs it (NeoX (i, i +
    # half), GPT-J (2i, 2i + 1)): x1 by frequency i's cos, x2 by its sin.
    from rope.harness.bench_floor import GATHER_TILES, same_bytes_calls
    device = _floor_device()
    spec = get_model(model).spec
    tokens, rows, d, rot = 7, 48, spec.head_size, spec.rotary_dim
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, rows, (spec.num_dims, tokens), generator=gen)
    positions = (positions[0] if spec.num_dims == 1 else positions).to(device)
    cache = (torch.rand(rows, rot, generator=gen) + 0.5).to(device)
    q0 = torch.randn(tokens, num_q * d, generator=gen).to(device)
    k0 = torch.randn(tokens, num_kv * d, generator=gen).to(device) if num_kv else None
    axis = torch.tensor(spec.axis_map() * 2)                              # channel j -> frequency j mod rot/2's row
    entries = cache.cpu()[positions.cpu().view(spec.num_dims, tokens)[axis].T, torch.arange(rot)]   # [T, rot]
    half = rot // 2
    pairs = torch.arange(half)
    x1, x2 = (pairs, pairs + half) if spec.is_neox_style else (2 * pairs, 2 * pairs + 1)
    paired = torch.empty_like(entries)                                    # the kernel's factor of each channel
    paired[:, x1], paired[:, x2] = entries[:, :half], entries[:, half:]
    names = list(same_bytes_calls(spec, positions, q0.clone(), k0.clone() if num_kv else None, cache))
    assert names[0] == "kernel" and all(n.startswith("kernel,block_t=") for n in names[1:-len(GATHER_TILES)])
    assert names[-len(GATHER_TILES):] == [f"tile={t}x{h}" for t, h in GATHER_TILES]
    assert not spec.is_neox_style or torch.equal(paired, entries)
    for name in names:
        q = q0.clone()
        k = k0.clone() if num_kv else None
        same_bytes_calls(spec, positions, q, k, cache)[name]()
        factor = entries if name.startswith("tile=") else paired
        for before, after in ((q0, q), (k0, k)):
            if before is None:
                continue
            b = before.cpu().view(tokens, -1, d)
            a = after.cpu().view(tokens, -1, d)
            torch.testing.assert_close(a[..., :rot], b[..., :rot] * factor[:, None, :], msg=name)
            assert torch.equal(a[..., rot:], b[..., rot:]), name


def test_the_floor_refuses_positions_it_cannot_read():
    # Both same-bytes kinds refuse them: the kernel's stream by the rotation's own checks (the values
    # among them on the CPU), the gathering stream by its own on any device.
    from rope.harness.bench_floor import gathering_calls, same_bytes_calls
    spec = get_model("qwen2.5-vl-72b").spec
    q = torch.zeros(4, spec.head_size)
    cache = torch.zeros(8, spec.rotary_dim)
    for calls in (same_bytes_calls, gathering_calls):
        with pytest.raises(ValueError, match="positions"):
            calls(spec, torch.zeros(4, dtype=torch.long), q, None, cache)          # 1 row for a 3-row map
        with pytest.raises(ValueError, match="positions"):
            calls(spec, torch.zeros(4, 3, dtype=torch.long).T, q, None, cache)     # strided rows
        with pytest.raises(ValueError, match="cache"):
            calls(spec, torch.zeros(3, 4, dtype=torch.long), q, None, cache[:, :4])
        with pytest.raises(ValueError, match="positions"):
            calls(spec, torch.full((3, 4), 8, dtype=torch.long), q, None, cache)      # row 8 of 8 rows
        with pytest.raises(ValueError, match="positions"):
            calls(spec, torch.full((3, 4), -1, dtype=torch.long), q, None, cache)


@pytest.mark.parametrize("model, tokens", [("qwen2.5-vl-72b", 4096), ("qwen3-vl-8b", 4096), ("glm-4.1v-9b", 16384),
                                           ("hunyuan-ocr", 4096), ("qwen2-7b", 65536)])
def test_the_kernels_stream_is_the_rotations_launch_with_the_rotation_switched_off(model, tokens):
    # The floor's `kernel` variant moves a rotation's bytes in its pattern only if it is the very
    # launch the raced `triton-no-pdl` makes: the same grid, arguments and constexprs (tile, gather,
    # eviction hint, key programs), PDL off, the STREAM switch on and nothing else changed.
    # Launches recorded for an H100/H200 (sm_90), the kernel intercepted.
    from rope.triton import rotary
    from rope.triton.rotary import launch_rotary, stream_launch
    from tests.kernels.compile_offline import record_launches
    device = _floor_device()
    spec = get_model(model).spec
    num_q, num_kv = get_model(model).sharded(1)
    positions = torch.zeros((spec.num_dims, tokens) if spec.num_dims > 1 else (tokens,), dtype=torch.long,
                            device=device)
    q = torch.zeros(tokens, num_q * spec.head_size, dtype=torch.bfloat16, device=device)
    k = torch.zeros(tokens, num_kv * spec.head_size, dtype=torch.bfloat16, device=device)
    cache = torch.zeros(spec.max_position, spec.rotary_dim, dtype=torch.bfloat16, device=device)
    (_, grid, args, raced), = record_launches(rotary, "_rotary_kernel",
                                              lambda: launch_rotary(spec, positions, q, k, cache, pdl=False))
    launched = []
    (_, stream_grid, stream_args, stream), = record_launches(
        rotary, "_rotary_kernel", lambda: launched.append(stream_launch(spec, positions, q, k, cache)) or launched[0]())
    assert stream_grid == grid and len(stream_args) == len(args)
    assert all(a is b or a == b for a, b in zip(stream_args, args))
    assert raced["STREAM"] is False and stream["STREAM"] is True and not stream["PDL"]
    assert launched[0].block_t == stream["BLOCK_T"]            # the tile the floor's block_t variants halve and double
    assert {name: value for name, value in stream.items() if name != "STREAM"} == \
        {name: value for name, value in raced.items() if name != "STREAM"}
