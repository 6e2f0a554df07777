#!/usr/bin/env bash
# Every peer on a GPU box with no network, from what was built here and carried there:
#
#   here:  lab/offline/vllm_carry.sh; lab/offline/sglang_carry.sh; lab/offline/flashinfer_carry.sh
#          python3 -m pip download --no-deps --only-binary=:all: -d .whl liger-kernel==0.8.5 pytest-timeout==2.4.0
#   there (carry .vllm .sgl .fi .whl), from the repo root:
#          . lab/offline/gpu_peers_env.sh && rope-harness bench --device cuda      (or pytest ..., campaign ...)
#
# Sourced, it installs the carried wheels (.whl/liger_kernel-*, pytest_timeout-*) into /tmp/peers-site,
# puts the trimmed vLLM (.vllm/site), SGLang (.sgl/site) and FlashInfer (.fi/site, with its JIT
# environment: lab/offline/flashinfer_gpu_check.sh's fi_env) first on PYTHONPATH, the checkout after them,
# defines `rope-harness` as the checkout's CLI, and prints which peers import.  A carry that is
# missing is left out (its peer is then listed as not raced).
root=$(pwd)
site=/tmp/peers-site
mkdir -p "$site"
for whl in "$root"/.whl/liger_kernel-*.whl "$root"/.whl/pytest_timeout-*.whl; do
    [ -f "$whl" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$whl" >/dev/null
done
paths=$site
[ -d "$root/.vllm/site" ] && paths=$root/.vllm/site:$paths
[ -d "$root/.sgl/site" ] && paths=$root/.sgl/site:$paths
export PYTHONPATH=$paths:$root${PYTHONPATH:+:$PYTHONPATH}
if [ -d "$root/.fi/site" ]; then
    shell_options=$(set +o)                         # the sourced script sets -euo pipefail: not for the caller
    . "$root/lab/offline/flashinfer_gpu_check.sh"          # defines fi_env only, when sourced
    fi_env "$root"
    eval "$shell_options"
fi
rope-harness() { python3 -m rope.harness.cli "$@"; }
python3 - <<'PY'
import importlib
for name in ("vllm-cuda", "liger", "sglang-triton", "flashinfer"):
    from rope.backends import BACKENDS
    module = BACKENDS[name][0].partition(":")[0]
    try:
        importlib.import_module(module)
        print(f"peer {name}: imports")
    except Exception as exc:                      # noqa: BLE001
        print(f"peer {name}: not importable ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
PY
