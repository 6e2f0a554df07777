"""The Triton kernels compile for a GPU, checked on any machine.

The CPU runs the kernels under the interpreter, which runs a kernel body as Python: a body the
compiler refuses can pass every property there and fail its first launch on a GPU (a name bound
to tiles of two shapes in the two arms of an ``if`` did exactly that).  tests/kernels/compile_offline.py
records the launches the launchers make for every model and compiles each for sm_90 with Triton's
own compiler and ptxas, without a driver; and for AMD gfx942 (MI300X) and gfx90a (MI250X) with
Triton's AMD backend, and for Intel's Ponte Vecchio where Intel's Triton is the one installed, each
target's launches made as the launcher makes them for it (rope/triton/targets.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.kernels.compile_offline import OPTION_MODELS, OPTIONS
from rope.devices import is_interpreter
from rope.models import load_models

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _has_backend(name: str) -> bool:
    try:
        from triton.backends import backends
    except ImportError:
        return False
    return name in backends


needs_cuda_backend = pytest.mark.skipif(not _has_backend("nvidia"), reason="this Triton has no CUDA backend to compile with")


def _compile_offline(*args: str, timeout: float = 600) -> tuple[int, list[dict], dict, str]:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, "-m", "tests.kernels.compile_offline", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    records = [line for line in lines if "summary" not in line]
    summary = next((line["summary"] for line in lines if "summary" in line), {})
    return run.returncode, records, summary, run.stderr


@pytest.mark.needs_no_gpu
@needs_cuda_backend
def test_every_launch_the_launchers_make_compiles_for_sm90():
    rc, records, summary, stderr = _compile_offline()
    failed = [r for r in records if not r["ok"]]
    assert rc == 0 and not failed, (failed[:3], stderr[-2000:])
    assert set(load_models()) < set(summary["launched"]), "every model's launches, and the position kernel's"
    assert summary["compiled"] == len(records) > 60 and summary["failed"] == 0
    rotation = [r for r in records if r["kernel"] == "_rotary_kernel"]
    # The switches the sweeps and the defaults turn, each compiled both ways.
    for switch in ("SPLIT_QK", "GATHER_3D", "PDL", "HEADS_FASTEST", "ROUND_BF16", "INTERLEAVED", "IS_NEOX",
                   "CACHE_I64", "EARLY_POSITIONS", "SPECULATE"):
        assert {r["constexprs"][switch] for r in rotation} == {True, False}, switch
    assert any(r["constexprs"]["BLOCK_HK"] < r["constexprs"]["BLOCK_H"] for r in rotation), "key programs of fewer heads"
    assert len({r["constexprs"]["NUM_DIMS"] for r in rotation}) >= 3
    labels = {r["launch"] for r in rotation}
    for options in OPTIONS:     # each option compiled some launch the defaults did not
        assert any(label.split(" ")[0] in OPTION_MODELS and label.endswith(str(options)) for label in labels), options
    positions = [r for r in records if r["kernel"] == "_prepare_positions_kernel"]
    assert {r["constexprs"]["PDL"] for r in positions} == {True, False}


# The kernel as it once stood: the head vector of each arm of the key-program branch bound to one
# name.  The interpreter runs it (each arm is plain Python there); the compiler refuses it.
TWO_SHAPES_ONE_NAME = [
    ["""            _rotate_tile(q_ptr, q_row_stride,
                         (group * R + slot // q_blocks).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T),
                         (slot % q_blocks) * BLOCK_H + tl.arange(0, BLOCK_H), num_q_heads,""",
     """            heads = (slot % q_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
            _rotate_tile(q_ptr, q_row_stride,
                         (group * R + slot // q_blocks).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T),
                         heads, num_q_heads,"""],
    ["""                         (slot - R * q_blocks) * BLOCK_HK + tl.arange(0, BLOCK_HK), num_kv_heads,""",
     """                         heads, num_kv_heads,"""],
    ["""            _rotate_tile(k_ptr, k_row_stride,""",
     """            heads = (slot - R * q_blocks) * BLOCK_HK + tl.arange(0, BLOCK_HK)
            _rotate_tile(k_ptr, k_row_stride,"""],
]


@needs_cuda_backend
def test_a_kernel_only_the_interpreter_runs_is_caught(tmp_path):
    subs = tmp_path / "subs.json"
    subs.write_text(json.dumps(TWO_SHAPES_ONE_NAME))
    rc, records, _, stderr = _compile_offline("--substitute", str(subs), "--rotation-only", "--models", "glm-4.1v-9b")
    failed = [r for r in records if not r["ok"]]
    assert rc == 1 and failed, stderr[-2000:]
    assert all(r["constexprs"]["BLOCK_HK"] < r["constexprs"]["BLOCK_H"] for r in failed)
    assert "Mismatched type for heads" in failed[0]["error"], failed[0]["error"]
    assert any(r["ok"] for r in records), "the launches without the branch still compile"
    if is_interpreter():     # and the interpreter gives the default bits with it
        from rope.harness.mutation.kernel_mutant import KernelMutant
        import rope.triton.rotary as rotary
        mutant = KernelMutant("two_shapes_one_name", rotary, "launch_rotary",
                              [tuple(s) for s in TWO_SHAPES_ONE_NAME], "").module
        spec = load_models()["glm-4.1v-9b"].spec
        gen = torch.Generator().manual_seed(0)
        positions = torch.randint(0, 64, (3, 130), generator=gen)
        q, k = torch.randn(130, 6 * 128, generator=gen), torch.randn(130, 2 * 128, generator=gen)
        cache = torch.randn(64, spec.rotary_dim, generator=gen)
        q0, k0 = rotary.launch_rotary(spec, positions, q.clone(), k.clone(), cache)
        q1, k1 = mutant.launch_rotary(spec, positions, q.clone(), k.clone(), cache, block_hk=2)
        assert torch.equal(q0, q1) and torch.equal(k0, k1)


def test_compile_offline_refuses_to_run_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-m", "tests.kernels.compile_offline"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "run with TRITON_INTERPRET=0" in run.stderr


@pytest.mark.needs_no_gpu
@pytest.mark.parametrize("target, backend, defaults_only", [
    # The options a caller may pass compiled on MI300X; MI250X (the same CDNA family) takes the
    # launchers' defaults, which halves the compile time a CI run pays on a machine without a cache.
    ("gfx942", "amd", False), ("gfx90a", "amd", True),
    # Intel's backend ships in Intel's Triton (triton-xpu), which replaces Triton: CI compiles with
    # it in an environment of its own (.ci/run); elsewhere this skips.
    ("pvc", "intel", False),
])
def test_every_launch_the_launchers_make_compiles_for_amd_and_intel(target, backend, defaults_only, record_property):
    if not _has_backend(backend):
        pytest.skip(f"this Triton has no {backend} backend to compile with"
                    + (" (Intel's is in triton-xpu: .ci/run's XPU job)" if backend == "intel" else ""))
    rc, records, summary, stderr = _compile_offline("--target", target, *(["--defaults-only"] if defaults_only else []))
    failed = [r for r in records if not r["ok"]]
    assert rc == 0 and not failed, (failed[:3], stderr[-2000:])
    # CI prints this from the run's JUnit XML (.ci/run).
    record_property("compiled", f"{target}: {summary['compiled']} kernels compiled from {summary['launches']} "
                                f"launches, {summary['failed']} failed")
    assert summary["target"] == target and set(load_models()) < set(summary["launched"])
    assert summary["compiled"] == len(records) > (40 if defaults_only else 60) and summary["failed"] == 0
    rotation = [r for r in records if r["kernel"] == "_rotary_kernel"]
    # Launched for this target: no PDL, no eviction hint, however the options asked (rope/triton/targets.py).
    assert all(not r["constexprs"]["PDL"] and r["constexprs"]["QK_EVICT"] == "" for r in records
               if "PDL" in r["constexprs"] and "QK_EVICT" in r["constexprs"])
    assert all("launch_pdl" not in r["options"] for r in records)
    switches = ("GATHER_3D", "HEADS_FASTEST", "INTERLEAVED", "IS_NEOX")
    for switch in switches + (() if defaults_only else ("SPLIT_QK", "ROUND_BF16", "CACHE_I64", "EARLY_POSITIONS", "SPECULATE")):
        assert {r["constexprs"][switch] for r in rotation} == {True, False}, switch
    assert any(r["kernel"] == "_prepare_positions_kernel" for r in records)
