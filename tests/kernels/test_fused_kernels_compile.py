"""The fused-op kernels compile for sm_90 with Triton's own compiler and ptxas, checked on any
machine (tests/kernels/fused_compile_offline.py): the CPU runs them under the interpreter, which
accepts bodies the compiler refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _has_cuda_backend() -> bool:
    try:
        from triton.backends import backends
    except ImportError:
        return False
    return "nvidia" in backends


@pytest.mark.needs_no_gpu
@pytest.mark.skipif(not _has_cuda_backend(), reason="this Triton has no CUDA backend to compile with")
def test_fused_kernels_compile_for_sm90():
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, "-m", "tests.kernels.fused_compile_offline"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    failed = [line for line in lines if "summary" not in line and not line["ok"]]
    summary = next((line["summary"] for line in lines if "summary" in line), {})
    assert run.returncode == 0 and not failed, (failed[:2], run.stderr[-2000:])
    # Both kernels, NeoX and GPT-J, the map computed and read from its table, every cache kind; the
    # KV-cache kernel's MLA form with a bf16 and an e4m3fn latent cache.
    assert summary.get("compiled", 0) == 8 and summary["failed"] == 0
