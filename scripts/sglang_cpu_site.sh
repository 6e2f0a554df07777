#!/usr/bin/env bash
# SGLang's rotary-embedding module on a CPU-only machine, without SGLang's GPU dependency tree:
#
#   scripts/sglang_cpu_site.sh [SITE]          # default /tmp/sglang-site
#   PYTHONPATH=.:SITE pytest -n auto --rope-impl sglang --rope-impl sglang-triton -p no:randomly
#
# sglang 0.5.23 pins torch==2.14.1 and CUDA kernel packages; its MRotaryEmbedding itself is Python
# and Triton.  The wheel is installed with --no-deps into SITE together with the pure-Python modules
# its import chain touches (found by importing until it succeeded), next to the project's own torch.
# rope/backends/sglang/rotation.py sets SGLANG_USE_CPU_ENGINE=1 when there is no GPU (SGLang's CPU switch).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${1:-/tmp/sglang-site}
PY=${PYTHON:-.venv/bin/python}
python3 -m pip install -q --no-deps --target "$SITE" sglang==0.5.23 orjson psutil pybase64 requests urllib3 \
    certifi idna charset-normalizer starlette anyio sniffio msgspec pyzmq ipython traitlets aiohttp multidict \
    attrs yarl propcache aiohappyeyeballs aiosignal frozenlist
PYTHONPATH="$SITE" SGLANG_USE_CPU_ENGINE=1 "$PY" -W ignore -c \
    "import sglang.srt.layers.rotary_embedding.mrope as m; print('sglang MRotaryEmbedding imports:', m.MRotaryEmbedding)"
