#!/usr/bin/env bash
# On the GPU box (no network), from the repo root, with .fi carried (lab/offline/flashinfer_carry.sh here):
#
#   lab/offline/flashinfer_gpu_check.sh [PYTEST_ARGS...]
#
# (a) imports flashinfer.rope from .fi/site, (b) JIT-builds the rope module for sm_90a only and runs
# apply_rope_with_cos_sin_cache on small CUDA inputs against the float64 reference (timing the build;
# lab/bench/flashinfer_probe.py --check),
# (c) runs the property tests against it:
#   pytest -q -p no:cacheprovider --rope-impl flashinfer --rope-device cuda
#          properties/rotation/test_rotation.py tests/backends/test_backends.py
# Expected with FlashInfer 0.7.4 (H200, lab/runs/flashinfer-suite-h200-2026-11-29.log): test_backends
# passes (faulting shapes drawn around, wrong ones pinned as strict xfails); test_rotation fails, on
# the 0-token raise and the wrong-value shapes (README findings, note 4), writing their case files.
# The build goes to $FLASHINFER_WORKSPACE_BASE (default /tmp/fi-ws)/.cache/flashinfer/0.7.4/90a/.
# Sourced (`. lab/offline/flashinfer_gpu_check.sh`), it only defines fi_env, which sets that environment.
set -euo pipefail

# The environment for flashinfer's JIT: PYTHONPATH, writable workspace, sm_90a only, the CUDA
# toolkit behind nvcc, and a link that finds -lcudart / -lcuda.
fi_env() {
    local root=$1 ld=${2:-/tmp/fi-ws/ld}
    export PYTHONPATH=$root/.fi/site:$root${PYTHONPATH:+:$PYTHONPATH}
    export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}   # default is $HOME
    export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}           # -> compute_90a/sm_90a
    export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-$FLASHINFER_WORKSPACE_BASE/tvm-ffi}
    # flashinfer takes CUDA_HOME, else dirname(dirname(which nvcc)); an nvcc wrapper script in
    # /usr/local/bin would give /usr/local.  Ask nvcc where it really is.
    if [ -z "${CUDA_HOME:-}" ]; then
        local here
        here=$(nvcc -dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1) || true
        export CUDA_HOME=$(cd "${here:-$(dirname "$(command -v nvcc)")}/.." && pwd -P)
    fi
    # flashinfer links rope.so with: c++ ... -L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda.
    # A pip-style toolkit has lib/ and libcudart.so.13 only, a container often libcuda.so.1 only:
    # then point -L at a folder of links (libcuda: the driver's, else the toolkit stub, else an
    # empty stub with the driver's soname; rope.so takes no symbol from it).
    local probe="-L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs"
    mkdir -p "$ld"
    echo 'void fi_probe(void){}' > "$ld/probe.c"
    if ! cc -shared -fPIC -o "$ld/probe.so" "$ld/probe.c" $probe -lcudart -lcuda 2>/dev/null; then
        local f
        for f in "$CUDA_HOME"/lib64/libcudart.so "$CUDA_HOME"/lib/libcudart.so* \
                 "$CUDA_HOME"/targets/x86_64-linux/lib/libcudart.so*; do
            [ -e "$f" ] && { ln -sf "$f" "$ld/libcudart.so"; break; }
        done
        f=$( (ldconfig -p 2>/dev/null | sed -n 's/.*libcuda\.so\.1 (libc6,x86-64) => //p';
              ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 \
                 "$CUDA_HOME"/targets/x86_64-linux/lib/stubs/libcuda.so 2>/dev/null) | head -1) || true
        if [ -n "$f" ]; then ln -sf "$f" "$ld/libcuda.so"
        else echo 'void fi_libcuda_stub(void){}' > "$ld/stub.c" &&
             cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$ld/libcuda.so" "$ld/stub.c"; fi
        export FLASHINFER_EXTRA_LDFLAGS="-L$ld${FLASHINFER_EXTRA_LDFLAGS:+ $FLASHINFER_EXTRA_LDFLAGS}"
        cc -shared -fPIC -o "$ld/probe.so" "$ld/probe.c" $probe -L"$ld" -lcudart -lcuda ||
            { echo "cannot link -lcudart -lcuda (CUDA_HOME=$CUDA_HOME, links in $ld)" >&2; return 1; }
    fi
}

main() {
    cd "$(dirname "$0")/../.."
    [ -d .fi/site/flashinfer ] || { echo ".fi/site missing: run lab/offline/flashinfer_carry.sh and carry .fi" >&2; exit 2; }
    fi_env "$PWD"
    echo "nvcc: $(command -v nvcc) ($(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')), CUDA_HOME=$CUDA_HOME," \
         "c++: $(c++ -dumpfullversion 2>/dev/null || c++ -dumpversion), ninja $(ninja --version)," \
         "FLASHINFER_EXTRA_LDFLAGS=${FLASHINFER_EXTRA_LDFLAGS:-}"
    PYTHONUNBUFFERED=1 python -m lab.bench.flashinfer_probe --check
    echo "(c) pytest --rope-impl flashinfer --rope-device cuda"
    python3 -m pytest -q -p no:cacheprovider --rope-impl flashinfer --rope-device cuda \
        properties/rotation/test_rotation.py tests/backends/test_backends.py "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi
