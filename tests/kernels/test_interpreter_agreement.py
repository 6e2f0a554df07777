"""On a GPU box: the Triton kernel on the GPU and under the interpreter on the CPU produce the
same bits (docs/spec.md §3: fp32 compute without FMA contraction, round-to-nearest-even at the store)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rope.harness.rotation.check import run_rotation
from rope.devices import gpu_backend, is_interpreter
from rope.registry import get_implementation
from tests.kernels.agreement_cases import CASES

_INTERPRETER_SCRIPT = """
import sys, torch
import rope
from tests.kernels.agreement_cases import CASES
from rope.harness.rotation.check import run_rotation
from rope.registry import get_implementation
fn = get_implementation("triton")
out = {}
for name, case in CASES.items():
    _, q, k = run_rotation(fn, case, "cpu")
    out[name] = (q.clone(), None if k is None else k.clone())
torch.save(out, sys.argv[1])
"""


@pytest.mark.gpu
@pytest.mark.skipif(gpu_backend() is None or is_interpreter(), reason="needs a GPU running compiled Triton")
def test_gpu_and_interpreter_agree_bit_for_bit(tmp_path):
    path = tmp_path / "interpreter.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT, str(path)], check=True, cwd=root, env=env, timeout=600)
    expected = torch.load(path)
    fn = get_implementation("triton")
    differing = []
    for name, case in CASES.items():
        _, q, k = run_rotation(fn, case, gpu_backend())
        exp_q, exp_k = expected[name]
        if not torch.equal(q.cpu(), exp_q) or (k is not None and not torch.equal(k.cpu(), exp_k)):
            differing.append(name)
    assert not differing, f"GPU and interpreter outputs differ for {differing}"
