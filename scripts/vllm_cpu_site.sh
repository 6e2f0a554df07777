#!/usr/bin/env bash
# vLLM's rotary-embedding package on a CPU-only machine without vLLM's CUDA dependency tree, next to
# the project's own torch (lighter than scripts/vllm_cpu_env.sh, whose resolver may pull a CUDA torch
# and its nvidia wheels, about 9.5 GB):
#
#   scripts/vllm_cpu_site.sh [SITE] [VLLM_SPEC]     # default /tmp/vllm-site, vllm==0.33.0
#   PYTHONPATH=.:SITE pytest -n auto --rope-impl vllm-native --rope-table-impl vllm -p no:randomly
#   PYTHONPATH=.:SITE rope-harness check --table-impl vllm
#
# The wheel is installed with --no-deps into SITE together with the pure-Python modules the import
# of vllm.model_executor.layers.rotary_embedding touches (found by importing until it succeeded).
# vllm._C (CUDA) does not load; the rotary layers are Python and Triton.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${1:-/tmp/vllm-site}
VLLM=${2:-vllm==0.33.0}
PY=${PYTHON:-.venv/bin/python}
python3 -m pip install -q --no-deps --target "$SITE" "$VLLM" pyzmq urllib3 requests certifi charset-normalizer \
    idna cbor2 aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist openai-harmony openai \
    sniffio anyio httpx httpcore h11 distro jiter pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo \
    prometheus-client xgrammar apache-tvm-ffi fastapi starlette opentelemetry-api opentelemetry-sdk \
    opentelemetry-semantic-conventions importlib-metadata zipp deprecated wrapt partial-json-parser llguidance
CUDA_VISIBLE_DEVICES= PYTHONPATH="$SITE" "$PY" -W ignore -c \
    "import vllm; from vllm.model_executor.layers.rotary_embedding import get_rope; print('vllm', vllm.__version__, 'get_rope imports')"
