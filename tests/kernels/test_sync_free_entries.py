"""The public Triton entries without host synchronization (docs/implementations.md, rope.spec.checks_values).

On a GPU, ``get_implementation("triton")`` and ``get_positions_implementation("triton")`` check
shapes, dtypes, devices and aliasing (metadata only) and leave the *values* (position ranges,
request slots, lengths) alone: reading them would synchronize with the host on every call and make
the call impossible to capture in a CUDA graph.  The kernels then stay in bounds whatever the
values: the rotary kernel clamps positions to the cache's rows, the position kernel writes no slot
outside the table and no column outside ``out``.  ``ROPE_CHECK_VALUES=1`` turns the value checks
back on (the debug switch); on the CPU the values are on the host already and are always checked.

CPU tests run the kernels under the interpreter with the value checks switched off (what a GPU
gets by default); GPU tests assert no host sync (``torch.cuda.set_sync_debug_mode("error")``) and
capture both entries in one CUDA graph, replayed with new inputs.
"""

from __future__ import annotations

import pytest
import torch

import reference
from properties.position_step.known_steps import CHUNK_1, DECODE
from rope.cache import cos_sin_cache
from rope.devices import torch_device, triton_runs_on
from rope.harness.rotation.bound import compare_rotation
from rope.registry import get_implementation, get_positions_implementation
from rope.spec import VALUE_CHECKS_ENV, RopeSpec, checks_values

pytestmark = pytest.mark.stack      # meets the installed torch and Triton: CI runs it on every stack (.ci/run)

SPEC = RopeSpec(128, 64, False, (8, 12, 12), max_position=64)       # GLM-4.1V-style, a 64-row cache
T = 7


def _needs_triton(device):
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")


def _rotation_inputs(device, seed=0, low=0, high=64):
    gen = torch.Generator().manual_seed(seed)
    dev = torch_device(device)
    positions = torch.randint(low, high, (3, T), generator=gen)
    q = torch.randn(T, 2 * 128, generator=gen)
    k = torch.randn(T, 128, generator=gen)
    cache = cos_sin_cache(SPEC, torch.float32, "cpu")
    return positions.to(dev), q.to(dev), k.to(dev), cache.to(dev)


def _assert_rotates_like_reference(positions, q_in, k_in, cache, q_out, k_out):
    ref_q, ref_k = reference.rotate(SPEC, positions.cpu(), q_in.cpu(), k_in.cpu(), cache.cpu())
    result = compare_rotation(SPEC, positions.cpu(), q_in.cpu(), k_in.cpu(), cache.cpu(), q_out.cpu(), k_out.cpu(),
                              ref_q, ref_k, "float32")
    assert result.ok, result.message()


# ------------------------------------------------------------------------------------------ the switch
def test_values_are_checked_where_they_are_on_the_host(monkeypatch):
    monkeypatch.delenv(VALUE_CHECKS_ENV, raising=False)
    assert checks_values(torch.zeros(1))
    assert not checks_values(torch.zeros(1, device="meta"))
    monkeypatch.setenv(VALUE_CHECKS_ENV, "0")
    assert not checks_values(torch.zeros(1))
    monkeypatch.setenv(VALUE_CHECKS_ENV, "1")
    assert checks_values(torch.zeros(1))


def test_the_debug_switch_checks_values_on_every_device(device, monkeypatch):
    _needs_triton(device)
    monkeypatch.setenv(VALUE_CHECKS_ENV, "1")
    positions, q, k, cache = _rotation_inputs(device)
    with pytest.raises(ValueError, match=r"positions=\[\d+\.\.\d+\]: must lie in \[0, 64\)"):
        get_implementation("triton")(SPEC, positions + 64, q, k, cache)


# ------------------------------------------------------------------------------------------ in bounds
def test_unchecked_positions_are_clamped_to_the_cache(device, monkeypatch):
    # Out-of-range positions, values unchecked: the kernel reads the nearest row of the cache,
    # never past it; in-range tokens are untouched by the clamp.
    _needs_triton(device)
    monkeypatch.setenv(VALUE_CHECKS_ENV, "0")
    positions, q, k, cache = _rotation_inputs(device, seed=1, low=-40, high=110)
    assert int(positions.min()) < 0 and int(positions.max()) >= 64
    q_out, k_out = get_implementation("triton")(SPEC, positions, q.clone(), k.clone(), cache)
    _assert_rotates_like_reference(positions.clamp(0, 63), q, k, cache, q_out, k_out)


def test_the_reference_and_native_always_check_values(monkeypatch):
    monkeypatch.setenv(VALUE_CHECKS_ENV, "0")
    positions, q, k, cache = _rotation_inputs("cpu")
    for fn in (reference.rotate, get_implementation("native")):
        with pytest.raises(ValueError, match="must lie in"):
            fn(SPEC, positions + 64, q, k, cache)


def _position_args(device, batch=CHUNK_1):
    return {k: v.to(torch_device(device)) if isinstance(v, torch.Tensor) else v for k, v in batch.tensors().items()}


def _call_positions(fn, args, out):
    names = ("prefill_positions", "prefill_delta", "idx_mapping", "query_start_loc", "prefill_lens",
             "num_computed_tokens", "num_dims")
    fn(*(args[n] for n in names), out)


@pytest.mark.parametrize("bad", ["slot-out-of-range", "read-past-table", "steps-past-out", "negative-start"])
def test_unchecked_position_steps_stay_in_bounds(device, monkeypatch, bad):
    # Values unchecked: a bad slot writes nothing, reads stop at the table's last column (0 past
    # it), stores stop at out's last column.  ``out`` is a view with sentinel columns either side.
    _needs_triton(device)
    monkeypatch.setenv(VALUE_CHECKS_ENV, "0")
    args = _position_args(device)
    dev = torch_device(device)
    if bad == "slot-out-of-range":
        args["idx_mapping"] = torch.tensor([5], dtype=torch.int32, device=dev)
    elif bad == "read-past-table":
        args["num_computed_tokens"] = torch.tensor([39], dtype=torch.int32, device=dev)
    elif bad == "steps-past-out":
        args["query_start_loc"] = torch.tensor([0, 400], dtype=torch.int32, device=dev)
    else:
        args["query_start_loc"] = torch.tensor([-8, 24], dtype=torch.int32, device=dev)
    buffer = torch.full((3, 8 + 32 + 8), -7, dtype=torch.int64, device=dev)
    out = buffer[:, 8:40]
    _call_positions(get_positions_implementation("triton"), args, out)
    got = buffer.cpu()
    assert (got[:, :8] == -7).all() and (got[:, 40:] == -7).all(), "wrote outside out"
    if bad == "slot-out-of-range":
        assert (got[:, 8:40] == -7).all(), "a slot outside the table wrote something"
    if bad == "read-past-table":             # columns 39 .. 70 of a 64-column table: the rest reads 0
        table = args["prefill_positions"].cpu()
        assert got[:, 8:8 + 25].tolist() == table[:3, 39:64].tolist()
        assert (got[:, 8 + 25:40] == 0).all()


def test_checked_position_step_still_rejects_bad_values_on_the_cpu(monkeypatch):
    monkeypatch.delenv(VALUE_CHECKS_ENV, raising=False)
    args = _position_args("cpu")
    args["idx_mapping"] = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="every slot must lie in"):
        _call_positions(get_positions_implementation("triton"), args, torch.zeros(3, 40, dtype=torch.int64))


# ------------------------------------------------------------------------------------------ GPU
def _needs_cuda(device):
    if device not in ("cuda", "rocm"):
        pytest.skip("a CUDA graph and the sync debug mode need a CUDA/ROCm GPU")


def test_public_entries_do_not_synchronize(device, monkeypatch):
    _needs_cuda(device)
    monkeypatch.delenv(VALUE_CHECKS_ENV, raising=False)
    rotate, prepare = get_implementation("triton"), get_positions_implementation("triton")
    positions, q, k, cache = _rotation_inputs(device)
    args = _position_args(device)
    out = torch.zeros(3, 40, dtype=torch.int64, device=positions.device)
    rotate(SPEC, positions, q.clone(), k.clone(), cache)           # compile outside the check
    _call_positions(prepare, args, out)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rotate(SPEC, positions, q, k, cache)
        _call_positions(prepare, args, out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_public_entries_capture_in_a_cuda_graph_and_replay_new_inputs(device, monkeypatch):
    # One graph: the position step writes the step's positions into a static buffer, the rotation
    # reads them.  Replayed with a second step and new q/k copied into the static inputs, the
    # outputs follow the new inputs (checked against the references).
    _needs_cuda(device)
    monkeypatch.delenv(VALUE_CHECKS_ENV, raising=False)
    rotate, prepare = get_implementation("triton"), get_positions_implementation("triton")
    dev = torch_device(device)
    cache = cos_sin_cache(SPEC, torch.float32, "cpu").to(dev)
    static = {k: v.clone() for k, v in _position_args(device).items() if isinstance(v, torch.Tensor)}
    positions = torch.zeros(3, 32, dtype=torch.int64, device=dev)
    q = torch.zeros(32, 2 * 128, device=dev)
    k = torch.zeros(32, 128, device=dev)

    def step():
        _call_positions(prepare, {**static, "num_dims": 3}, positions)
        rotate(SPEC, positions, q, k, cache)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()                                                      # warm-up (compiles) on a side stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    gen = torch.Generator().manual_seed(3)
    for batch in (CHUNK_1, DECODE):
        new = batch.tensors()
        for name, t in static.items():
            t.copy_(new[name])
        q_in, k_in = torch.randn(32, 2 * 128, generator=gen), torch.randn(32, 128, generator=gen)
        q.copy_(q_in)
        k.copy_(k_in)
        graph.replay()
        torch.cuda.synchronize()
        tokens = int(new["query_start_loc"][-1])
        want = reference.prepare_positions(*(new[n] for n in ("prefill_positions", "prefill_delta", "idx_mapping",
                                                             "query_start_loc", "prefill_lens", "num_computed_tokens")),
                                           3)
        assert positions[:, :tokens].cpu().tolist() == want.tolist()
        _assert_rotates_like_reference(positions[:, :tokens], q_in[:tokens], k_in[:tokens], cache,
                                       q[:tokens], k[:tokens])
