#!/usr/bin/env bash
# FlashInfer's rope ops (flashinfer.rope) and its paged append (flashinfer.page) for a GPU box with no network:
#
#   lab/offline/flashinfer_carry.sh [WHEEL_DIR] [--local-check]      # WHEEL_DIR default /tmp/fi
#   (carry .fi to the box, then there:) lab/offline/flashinfer_gpu_check.sh
#
# Builds .fi/site/ (git-ignored), to be put first on PYTHONPATH on the box (Python 3.12, x86_64):
#   flashinfer/        flashinfer-python 0.7.4 trimmed to what the rope path loads: the Python
#                      modules of lab/offline/flashinfer_keep.txt (the real package __init__, kept as it
#                      is), the JIT sources named in flashinfer/jit/rope.py and jit/page.py and every header
#                      they #include, found recursively with the include dirs flashinfer passes to
#                      nvcc (flashinfer/jit/cpp_ext.py).  Dropped: the other 2900 Python modules,
#                      the other csrc/ sources, cutlass/, spdlog/, most of cccl/ (715 MB -> ~20 MB).
#   tvm_ffi/           apache-tvm-ffi (flashinfer's one missing compiled dependency), cp312 wheel, whole.
# The box already has torch, ninja, nvcc, filelock, requests, einops, tabulate, nvidia-ml-py,
# cuda-bindings, numpy, packaging, tqdm, click.  FlashInfer then JIT-builds the rope module there
# (no flashinfer-jit-cache / flashinfer-cubin needed).  .fi/rope_headers.txt lists the headers.
#
# --local-check: here, without a GPU: imports flashinfer.rope from .fi/site with $PYTHON
# (default .venv/bin/python) and a matching apache-tvm-ffi + the box's pure-Python packages in
# ${FI_LOCAL_DIR:-/tmp/fi-localcheck}, builds the rope JitSpec, checks no flashinfer module the
# import path tries is missing from .fi, and, where nvcc is found (PATH, CUDA_HOME, /usr/local/cuda),
# JIT-compiles and links rope.so for sm_90a (a CPU call then stops at "must be a CUDA tensor").
# Idempotent: .fi is rebuilt from the wheels each run; downloads happen only when a wheel is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

FI_VERSION=0.7.4
TVM_FFI_VERSION=0.1.15.post2      # flashinfer 0.7.4 needs apache-tvm-ffi>=0.1.11,<0.2 (checked below)
MAX_MB=40
WHEEL_DIR=/tmp/fi
LOCAL_CHECK=0
for arg in "$@"; do
    case $arg in
        --local-check) LOCAL_CHECK=1 ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) WHEEL_DIR=$arg ;;
    esac
done
mkdir -p "$WHEEL_DIR"

# 1. The wheels: flashinfer (pure Python, 101 MB) and apache-tvm-ffi for the box's CPython 3.12.
FI_WHL=$WHEEL_DIR/flashinfer_python-$FI_VERSION-py3-none-any.whl
[ -f "$FI_WHL" ] || python3 -m pip download -q --no-deps --only-binary=:all: -d "$WHEEL_DIR" "flashinfer-python==$FI_VERSION"
tvm_whl() { ls "$WHEEL_DIR"/apache_tvm_ffi-"$TVM_FFI_VERSION"-cp312-cp312-*manylinux*x86_64*.whl 2>/dev/null | head -1; }
if [ -z "$(tvm_whl)" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEEL_DIR" "apache-tvm-ffi==$TVM_FFI_VERSION"
fi
TVM_WHL=$(tvm_whl)

# 2. Stage .fi from the two zips (no full unpack of the 715 MB flashinfer tree), then swap it in.
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
python3 - "$FI_WHL" "$TVM_WHL" lab/offline/flashinfer_keep.txt "$STAGE/fi" "$TVM_FFI_VERSION" <<'PY'
import posixpath, re, sys, zipfile

fi_whl, tvm_whl, keep_list, out, tvm_version = sys.argv[1:]
fi, tvm = zipfile.ZipFile(fi_whl), zipfile.ZipFile(tvm_whl)
fi_names, tvm_names = set(fi.namelist()), set(tvm.namelist())

# The tvm-ffi pin must satisfy the wheel's own requirement.
meta = next(n for n in fi_names if n.endswith('.dist-info/METADATA'))
req = next(l for l in fi.read(meta).decode().splitlines()
           if l.startswith('Requires-Dist: apache-tvm-ffi') and 'extra ==' not in l)
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
if not Requirement(req.split(':', 1)[1].strip()).specifier.contains(tvm_version, prereleases=True):
    sys.exit(f'apache-tvm-ffi {tvm_version} does not satisfy the wheel\'s "{req}"')

keep = [l.strip() for l in open(keep_list) if l.strip() and not l.startswith('#')]
missing = [k for k in keep if k not in fi_names]
if missing:
    sys.exit(f'{keep_list}: not in {fi_whl}: {missing[:5]} ...')
keep = set(keep)
# dist-info (metadata, entry points, licences); RECORD would list the dropped files.
keep |= {n for n in fi_names if '.dist-info/' in n and not n.endswith('/RECORD')}

# The JIT sources, as gen_rope_module() and gen_page_module() name them (the rotation and the fused
# FP8 ops; the paged append of the unfused pair).
sources = []
for module in ('rope', 'page'):
    text = fi.read(f'flashinfer/jit/{module}.py').decode()
    found = ['flashinfer/data/csrc/' + s for s in re.findall(r'FLASHINFER_CSRC_DIR\s*/\s*"([^"]+)"', text)]
    if not found or any(s not in fi_names for s in found):
        sys.exit(f'{module} sources not found in flashinfer/jit/{module}.py: {found}')
    sources += found

# Include search as flashinfer/jit/cpp_ext.py sets it up: -I vendored CCCL first, then -isystem
# (python, $cuda_home/include: not ours), tvm_ffi include, data/include, data/csrc, cutlass, spdlog.
# Every #include line counts, whatever #if surrounds it (a superset of what nvcc opens); a name
# found in none of these dirs is the CUDA toolkit's or the C++ library's.
D = 'flashinfer/data'
search = [(fi, f'{D}/cccl/cub'), (fi, f'{D}/cccl/libcudacxx/include'), (fi, f'{D}/cccl/thrust'),
          (tvm, 'tvm_ffi/include'), (fi, f'{D}/include'), (fi, f'{D}/csrc'), (fi, f'{D}/cutlass/include'),
          (fi, f'{D}/cutlass/tools/util/include'), (fi, f'{D}/spdlog/include')]
names = {fi: fi_names, tvm: tvm_names}
inc = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
seen, stack, external = {}, [(fi, s) for s in sources], set()
while stack:
    z, path = stack.pop()
    if path in seen:
        continue
    seen[path] = z
    for kind, name in inc.findall(z.read(path)):
        name = name.decode()
        dirs = ([(z, posixpath.dirname(path))] if kind == b'"' else []) + search
        for zz, d in dirs:
            cand = posixpath.normpath(posixpath.join(d, name))
            if cand in names[zz]:
                stack.append((zz, cand))
                break
        else:
            external.add(name)

headers = sorted(p for p in seen if seen[p] is fi)
keep |= set(headers)
for n in sorted(keep):
    fi.extract(n, f'{out}/site')
tvm.extractall(f'{out}/site')          # apache-tvm-ffi whole: its Python package, libs and headers

total = sum(fi.getinfo(p).file_size for p in headers)
tvm_headers = sorted(p for p in seen if seen[p] is tvm)
with open(f'{out}/rope_headers.txt', 'w') as f:
    f.write(f'# rope and page JIT sources and every file they #include from flashinfer/data and tvm_ffi/include\n'
            f'# flashinfer: {len(headers)} files, {total} bytes; tvm_ffi: {len(tvm_headers)} files\n')
    for p in headers:
        f.write(f'{fi.getinfo(p).file_size:9d} {p}\n')
    for p in tvm_headers:
        f.write(f'{tvm.getinfo(p).file_size:9d} {p}\n')
    f.write('# resolved outside (CUDA toolkit / C++ library): ' + ' '.join(sorted(external)) + '\n')
py = sum(1 for n in keep if n.endswith('.py'))
print(f'flashinfer {len(keep)} files kept ({py} .py; rope and page sources + {len(headers) - len(sources)} headers, '
      f'{total / 1e6:.2f} MB) of {len([n for n in fi_names if not n.endswith("/")])}; '
      f'tvm_ffi headers used: {len(tvm_headers)}')
PY
# 3. In place, within its size (the whole of .fi travels with the working tree, 64 MiB a call).
. lab/offline/carry_swap_in.sh
swap_in_carry .fi "$STAGE/fi" "$MAX_MB"
echo "  flashinfer $(du -sh .fi/site/flashinfer | cut -f1), tvm_ffi $(du -sh .fi/site/tvm_ffi | cut -f1)"

[ "$LOCAL_CHECK" = 1 ] || exit 0

# 4. --local-check: the import path and the JIT build, here, from the trimmed tree.
PY=${PYTHON:-.venv/bin/python}
LC=${FI_LOCAL_DIR:-/tmp/fi-localcheck}
mkdir -p "$LC"
if [ ! -f "$LC/deps/.tvm-$TVM_FFI_VERSION" ]; then
    # tvm-ffi for the local interpreter (shadows the cp312 one in .fi), and the box's packages
    # that flashinfer imports and a plain torch venv lacks.
    rm -rf "$LC/deps"
    "$PY" -m pip install -q --no-deps --target "$LC/deps" "apache-tvm-ffi==$TVM_FFI_VERSION" requests urllib3 \
        certifi idna charset-normalizer einops tabulate nvidia-ml-py cuda-bindings cuda-pathfinder ninja filelock
    touch "$LC/deps/.tvm-$TVM_FFI_VERSION"
fi
rm -rf "$LC/ws"
NVCC=""
if command -v nvcc >/dev/null || [ -n "${CUDA_HOME:-}" ] || [ -x /usr/local/cuda/bin/nvcc ]; then
    command -v nvcc >/dev/null || export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
    # The box's set-up from lab/offline/flashinfer_gpu_check.sh: CUDA_HOME from nvcc itself, -L links
    # for -lcudart / -lcuda (no driver here, so libcuda is an empty stub).
    . lab/offline/flashinfer_gpu_check.sh
    FLASHINFER_WORKSPACE_BASE=$LC/ws fi_env "$PWD" "$LC/ld"
    NVCC=$CUDA_HOME/bin/nvcc
fi
PATH="$LC/deps/bin:$PATH" PYTHONPATH="$LC/deps:$PWD/.fi/site" PYTHONDONTWRITEBYTECODE=1 \
FLASHINFER_WORKSPACE_BASE="$LC/ws" FLASHINFER_CUDA_ARCH_LIST=9.0 TVM_FFI_CACHE_DIR="$LC/tvm-ffi-cache" \
FI_NVCC="$NVCC" FI_WHL="$FI_WHL" "$PY" - <<'PY'
import importlib.abc, os, subprocess, sys, time, zipfile

tried = []
class Record(importlib.abc.MetaPathFinder):           # every import attempt, failed ones included
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'flashinfer':
            tried.append(name)
sys.meta_path.insert(0, Record())

t = time.perf_counter()
import flashinfer.rope
import torch
print(f'import flashinfer.rope: {time.perf_counter() - t:.1f} s, from {os.path.dirname(flashinfer.__file__)}')
site = os.path.realpath('.fi/site')
assert os.path.realpath(flashinfer.__file__).startswith(site), flashinfer.__file__

from flashinfer.jit.rope import gen_rope_module
spec = gen_rope_module()
print('rope JitSpec sources:', *[os.path.relpath(s, site) for s in spec.sources])
assert all(s.exists() for s in spec.sources)
import flashinfer.page                              # the unfused pair's append
from flashinfer.jit.page import gen_page_module
page_spec = gen_page_module()
print('page JitSpec sources:', *[os.path.relpath(s, site) for s in page_spec.sources])
assert all(s.exists() for s in page_spec.sources)

if os.environ['FI_NVCC']:
    q, k = torch.randn(3, 256, dtype=torch.bfloat16), torch.randn(3, 128, dtype=torch.bfloat16)
    t = time.perf_counter()
    try:
        flashinfer.rope.apply_rope_with_cos_sin_cache(torch.arange(3), q, k, 128, torch.randn(8, 64))
        sys.exit('a CPU call returned: expected the "CUDA tensor" check')
    except RuntimeError as exc:
        if 'CUDA tensor' not in str(exc):
            raise
    so = spec.jit_library_path
    print(f'JIT build for sm_90a with {os.environ["FI_NVCC"]}: {time.perf_counter() - t:.1f} s -> {so.name} '
          f'({so.stat().st_size} bytes); the CPU call stopped at the CUDA-tensor check as it should')
    deps = subprocess.run(['ninja', '-C', str(spec.build_dir), '-f', str(spec.ninja_path), '-t', 'deps'],
                          capture_output=True, text=True, check=True).stdout.split('\n')
    deps = {d.strip() for d in deps if d.startswith(' ')}
    ours = sorted(os.path.relpath(d, site) for d in deps if d.startswith(site + '/'))
    import tvm_ffi                                  # the local interpreter's copy: same headers as .fi's
    tvm_root = os.path.dirname(os.path.dirname(os.path.realpath(tvm_ffi.__file__)))
    tvm = [os.path.relpath(d, tvm_root) for d in deps if d.startswith(tvm_root + '/tvm_ffi/')]
    absent = [p for p in tvm if not os.path.exists(os.path.join(site, p))]
    print(f'nvcc opened {len(deps)} files: {len(ours)} from .fi/site, {len(tvm)} tvm_ffi headers '
          f'(missing from .fi/site/tvm_ffi: {absent or "none"})')
    assert not absent
    t = time.perf_counter()
    page_so = page_spec.build_and_load() and page_spec.jit_library_path   # the append's module, built alike
    print(f'JIT build of the page module: {time.perf_counter() - t:.1f} s -> {page_so.name} '
          f'({page_so.stat().st_size} bytes)')
else:
    print('no nvcc here: JIT build not tried')

names = set(zipfile.ZipFile(os.environ['FI_WHL']).namelist())
lost = sorted({m for m in tried if not os.path.exists(os.path.join(site, *m.split('.')) + '.py')
               and not os.path.exists(os.path.join(site, *m.split('.'), '__init__.py'))
               and ('/'.join(m.split('.')) + '.py' in names or '/'.join(m.split('.')) + '/__init__.py' in names)})
print(f'{len(set(tried))} flashinfer modules tried; in the wheel but not in .fi: {lost or "none"}')
sys.exit(1 if lost else 0)
PY
