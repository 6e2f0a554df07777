#!/usr/bin/env bash
# A separate virtual environment in which vLLM's rotary-embedding modules import on a CPU-only
# machine, so the harness can run against vLLM's own code:
#
#   scripts/vllm_cpu_env.sh [VENV] [VLLM_SPEC]        # default /tmp/vllm-venv, vllm==0.33.0
#   VENV/bin/pytest -n auto --rope-impl vllm-native -p no:randomly
#
# vLLM 0.33.0 publishes only a CUDA wheel on PyPI.  Its requirement on torch has been met by the CPU
# build of torch 2.13.0; where pip resolves it to a newer CUDA torch instead (2.14.0+cu130 and its
# nvidia wheels, about 9.5 GB), that build imports and runs on the CPU as well.  Its compiled extension (vllm._C) cannot load without CUDA, but the
# rotary-embedding layers (forward_native, and the Triton M-RoPE kernel of forward_cuda under
# TRITON_INTERPRET=1) are Python and Triton.  The project itself is installed editable with its test
# dependencies; the main .venv is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/vllm-venv}
VLLM=${2:-vllm==0.33.0}
# TORCH_INDEX=https://download.pytorch.org/whl/cpu where pip has no CPU torch 2.13.0 otherwise.
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# CPU torch: from a find-links directory or index configured for pip, else the PyTorch CPU index.
"$VENV/bin/python" -m pip install -q torch==2.13.0 ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}
"$VENV/bin/python" -m pip install -q "$VLLM"
"$VENV/bin/python" -m pip install -q -e '.[oracle]'
"$VENV/bin/python" - <<'PY'
import torch, vllm
from vllm.model_executor.layers.rotary_embedding import get_rope   # noqa: F401
print("torch", torch.__version__, "| vllm", vllm.__version__, "| rotary_embedding imports")
PY
