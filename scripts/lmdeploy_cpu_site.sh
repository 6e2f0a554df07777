#!/usr/bin/env bash
# lmdeploy's PyTorch-engine rotary code on a CPU-only machine, without lmdeploy's GPU dependency tree:
#
#   scripts/lmdeploy_cpu_site.sh [SITE]        # default /tmp/lmdeploy-site
#   PYTHONPATH=.:SITE pytest -n auto --rope-impl lmdeploy -p no:randomly
#
# lmdeploy's wheel pins CUDA packages; its M-RoPE table selection (lmdeploy/pytorch/nn/rotary_embedding.py)
# is PyTorch and its rotation kernel (lmdeploy/pytorch/kernels/cuda/apply_rotary_pos_emb.py) Triton, which
# runs under TRITON_INTERPRET=1.  The wheel is installed with --no-deps into SITE together with the
# pure-Python modules its import chain touches (found by importing until it succeeded), next to the
# project's own torch.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${1:-/tmp/lmdeploy-site}
PY=${PYTHON:-.venv/bin/python}
python3 -m pip install -q --no-deps --target "$SITE" lmdeploy==0.18.0 mmengine-lite yapf platformdirs addict \
    termcolor requests urllib3 certifi pybase64 pyzmq
PYTHONPATH="$SITE" TRITON_INTERPRET=1 "$PY" -W ignore -c \
    "import lmdeploy.pytorch.nn.rotary_embedding as m; print('lmdeploy MRotaryEmbedding imports:', m.MRotaryEmbedding)"
