"""On a GPU box: the Triton kernel on the GPU and under the interpreter on the CPU produce the
same bits (docs/spec.md §3: fp32 compute without FMA contraction, round-to-nearest-even at the store).
The cases are dealt to a few shards, each its own test, so that the interpreter's minute of CPU time
spreads over a GPU suite's workers instead of being its longest pole."""

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

SHARDS = 4


def shard_names(shard: int) -> list[str]:
    """The cases of ``shard``: every SHARDS-th name, so the large known-bug cases spread out."""
    return sorted(CASES)[shard::SHARDS]


_INTERPRETER_SCRIPT = """
import sys, torch
import rope
from tests.kernels.agreement_cases import CASES
from rope.harness.rotation.check import run_rotation
from rope.registry import get_implementation
fn = get_implementation("triton")
out = {}
for name in sys.argv[2:]:
    _, q, k = run_rotation(fn, CASES[name], "cpu")
    out[name] = (q.clone(), None if k is None else k.clone())
torch.save(out, sys.argv[1])
"""


@pytest.mark.gpu
@pytest.mark.skipif(gpu_backend() is None or is_interpreter(), reason="needs a GPU running compiled Triton")
@pytest.mark.parametrize("shard", range(SHARDS))
def test_gpu_and_interpreter_agree_bit_for_bit(tmp_path, shard):
    names = shard_names(shard)
    path = tmp_path / "interpreter.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT, str(path), *names], check=True, cwd=root, env=env, timeout=600)
    expected = torch.load(path)
    fn = get_implementation("triton")
    differing = []
    for name in names:
        _, q, k = run_rotation(fn, CASES[name], gpu_backend())
        exp_q, exp_k = expected[name]
        if not torch.equal(q.cpu(), exp_q) or (k is not None and not torch.equal(k.cpu(), exp_k)):
            differing.append(name)
    assert not differing, f"GPU and interpreter outputs differ for {differing}"


def test_the_shards_deal_every_case_once():
    dealt = [name for shard in range(SHARDS) for name in shard_names(shard)]
    assert sorted(dealt) == sorted(CASES) and len(set(dealt)) == len(dealt)
    assert all(shard_names(shard) for shard in range(SHARDS))
