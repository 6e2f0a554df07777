#!/usr/bin/env bash
# SGLang's MRotaryEmbedding (rope/backends/sglang/rotation.py: `sglang` = forward_native, `sglang-triton` =
# forward_triton, the fused Triton kernel triton_mrope_fused) for a GPU box with no network:
#
#   lab/offline/sglang_carry.sh [WHEEL] [--check]     # WHEEL: a sglang-0.5.23-*.whl, or a folder holding
#                                               # one (default /tmp/sglang-wheel; downloaded if none)
#   (carry .sgl to the box, then there:) lab/offline/sglang_gpu_check.sh [PYTEST_ARGS...]
#
# Builds .sgl/ (git-ignored), whose site/ goes first on PYTHONPATH on the box (Python 3.12, torch,
# triton, transformers; no orjson, msgspec, pydantic, pyzmq, sgl_kernel, vllm):
#   site/sglang/...     real: files of the published sglang 0.5.23 wheel, unmodified (checked
#                       against the wheel's RECORD hashes), that the rotary path imports: the whole
#                       srt/layers/rotary_embedding package (mrope_rope_index.py too: the position-id
#                       adapter rope/backends/sglang/position_ids.py calls it), the Triton kernels
#                       (kernels/ops/attention/rotary_triton.py, mrope.py), what SGLang imports on
#                       CUDA only (kernels/ops/attention/rope.py, its JIT kernels registered as torch
#                       custom ops at import: kernels/jit/utils, srt/utils/custom_op.py,
#                       kernels/kernel_api_logging.py), srt/environ.py, version.py.  The other
#                       ~4700 Python files are dropped (39 MB wheel -> 39 .py files, ~0.5 MB).
#   site/sglang/...     extracted: modules the chain reaches that the box cannot import whole (their
#                       other definitions need msgspec, orjson, pybase64, starlette, pyzmq, ...),
#                       generated here by lab/offline/carry_extract.py from the wheel's own file
#                       (RECORD-checked): only the top-level names lab/offline/sglang_keep.txt lists and,
#                       transitively, the top-level statements they use, as byte-identical source
#                       segments (imports cut down to the names kept), under a generated docstring
#                       saying so.  The package __init__s of sglang (__version__),
#                       sglang.kernels(.ops(.attention)) and sglang.srt.utils, kernels/fused_op.py
#                       (BaseFusedOp), kernels/spec.py (KernelBackend),
#                       kernels/jit/utils/compile/__init__.py and srt/utils/common.py (device probes,
#                       get_bool_env_var, direct_register_custom_op, ...: 18 of its 220 functions).
#   site/sglang/...     stubs, lab/offline/sglang_stubs/sglang/ laid over that tree: our own small code,
#                       not SGLang's, where the carry deliberately behaves differently: srt/platforms
#                       (current_platform: in-tree, Triton on a GPU), srt/runtime_context.py (no
#                       engine config is published) and kernels/jit/utils/compile/loader.py and
#                       paths.py (load_jit refuses: SGLang's JIT CUDA sources and tvm-ffi are not
#                       carried; the harness never calls those kernels).  Each says in its docstring
#                       which SGLang module it stands in for.  The repository holds no SGLang code.
#   site/sglang-0.5.23.dist-info/   the wheel's metadata less RECORD (importlib.metadata works).
#   manifest.tsv        one line per file: real / meta (sha256 of the wheel's file), extracted or
#                       stub (sha256 of the file written).
# The wheel's Python files are the same in every platform tag (cp311 / cp312 wheels compared equal),
# so the wheel pip downloads for this machine's Python serves the box's 3.12.
#
# --check: here, without a GPU, with $PYTHON (default .venv/bin/python) and TRITON_INTERPRET=1:
# imports the adapter from .sgl/site twice, on SGLang's CPU path (SGLANG_USE_CPU_ENGINE=1, as the
# adapter sets it without a GPU) and on its CUDA path (torch.cuda.is_available() patched to True,
# torch.version.cuda set, SGLANG_USE_CPU_ENGINE unset: what the box imports), runs forward_native
# and forward_triton on a small case in each, and fails when an sglang module the import path
# tries is in the wheel but not in .sgl.
# Idempotent: .sgl is rebuilt from the wheel each run; the wheel is downloaded only when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

SGL_VERSION=0.5.23
MAX_MB=5
WHEEL=/tmp/sglang-wheel
CHECK=0
for arg in "$@"; do
    case $arg in
        --check) CHECK=1 ;;
        -h|--help) sed -n '2,/^# Idempotent/p' "$0"; exit 0 ;;
        *.whl) [ -f "$arg" ] || { echo "no such wheel: $arg" >&2; exit 2; }; WHEEL=$arg ;;
        *) WHEEL=$arg ;;
    esac
done

# 1. The wheel: a file as given, else the one in the folder, else downloaded into it.
if [ ! -f "$WHEEL" ]; then
    mkdir -p "$WHEEL"
    found=$(ls "$WHEEL"/sglang-"$SGL_VERSION"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$found" ]; then
        python3 -m pip download -q --no-deps --only-binary=:all: -d "$WHEEL" "sglang==$SGL_VERSION"
        found=$(ls "$WHEEL"/sglang-"$SGL_VERSION"-*.whl | head -1)
    fi
    WHEEL=$found
fi
echo "wheel: $WHEEL"

# 2. Stage .sgl from the zip (no full unpack), lay the stubs over it, then swap it in.
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
python3 - "$WHEEL" lab/offline/sglang_stubs lab/offline/sglang_keep.txt "$STAGE/sgl" "$SGL_VERSION" <<'PY'
import base64, hashlib, os, shutil, sys, zipfile

whl, stubs, keep_list, out, version = sys.argv[1:]
site = f'{out}/site'
z = zipfile.ZipFile(whl)
names = set(z.namelist())
dist = f'sglang-{version}.dist-info'
if f'{dist}/METADATA' not in names:
    sys.exit(f'{whl}: not an sglang {version} wheel')

# The real SGLang files the rotary path imports (CPU and CUDA branches), read off their imports and
# checked by --check.  Import branches for ROCm / NPU / XPU / MUSA are not followed.
rotary = sorted(n for n in names if n.startswith('sglang/srt/layers/rotary_embedding/')
                and n.count('/') == 4 and n.endswith('.py'))
keep = rotary + [
    'sglang/version.py', 'sglang/_version.py',               # __version__
    'sglang/srt/environ.py',                                 # envs (stdlib only)
    'sglang/srt/debug_utils/__init__.py',                    # environ imports it when
    'sglang/srt/debug_utils/cuda_coredump.py',               #   SGLANG_CUDA_COREDUMP=1
    'sglang/kernels/ops/attention/rotary_triton.py',         # triton_mrope_fused (forward_triton)
    'sglang/kernels/ops/attention/mrope.py',                 # apply_interleaved_rope_triton
    'sglang/kernels/ops/attention/rope.py',                  # imported on CUDA (JIT kernels, lazy)
    'sglang/kernels/jit/__init__.py',
    'sglang/kernels/jit/utils/__init__.py',
    'sglang/kernels/jit/utils/arch.py',
    'sglang/kernels/jit/utils/common.py',
    'sglang/kernels/jit/utils/compile/cpp_args.py',
    'sglang/kernels/jit/utils/compile/parallel.py',
    'sglang/kernels/jit/utils/compile/toolchain.py',
    'sglang/kernels/kernel_api_logging.py',                  # custom_op's logging wrapper
    'sglang/srt/utils/custom_op.py',                         # register_custom_op (lazy)
]
missing = [k for k in keep if k not in names]
if missing:
    sys.exit(f'not in {whl}: {missing}')

# The extracted modules (lab/offline/sglang_keep.txt): path -> (names kept, names left unbound).
extract = {}
for line in open(keep_list):
    line = line.split('#', 1)[0].strip()
    if line:
        path, _, words = line.partition(':')
        if not _ or path in extract:
            sys.exit(f'{keep_list}: bad or repeated line {line!r}')
        words = words.split()
        extract[path.strip()] = ([w for w in words if not w.startswith('-')],
                                 {w[1:] for w in words if w.startswith('-')})
for path in extract:
    if path not in names or not path.endswith('.py'):
        sys.exit(f'{keep_list}: {path} is not a module of {whl}')
    if path in keep:
        sys.exit(f'{keep_list}: {path} is carried whole already')

# Every file read from the wheel must hash as its RECORD says (sha256, urlsafe base64, no padding).
record = {}
for line in z.read(f'{dist}/RECORD').decode().splitlines():
    path, digest, _ = line.rsplit(',', 2)
    record[path] = digest
def sha(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
def read(n):
    data = z.read(n)
    if record.get(n) != f'sha256={sha(data)}':
        sys.exit(f'{n}: does not match the wheel RECORD')
    return data
manifest = []
for n in keep:
    data = read(n)
    z.extract(n, site)
    manifest.append(('real', n, hashlib.sha256(data).hexdigest()))
for n in sorted(names):
    if n.startswith(f'{dist}/') and not n.endswith('/') and not n.endswith('/RECORD'):
        z.extract(n, site)
        manifest.append(('meta', n, hashlib.sha256(z.read(n)).hexdigest()))


# --- extraction (lab/offline/carry_extract.py): the named top-level definitions of a wheel module -----
sys.dont_write_bytecode = True
sys.path.insert(0, 'lab/offline')                        # the repository root is the cwd
from carry_extract import ExtractError, extract_module

extracted = {}
for path, (roots, unbound) in extract.items():
    try:
        text, pulled = extract_module(read(path).decode(), path, tool='lab/offline/sglang_carry.sh',
                                      package='sglang', version=version, keep_list=keep_list,
                                      roots=roots, unbound=unbound)
    except ExtractError as e:
        sys.exit(str(e))
    os.makedirs(os.path.dirname(os.path.join(site, path)), exist_ok=True)
    with open(os.path.join(site, path), 'w') as f:
        f.write(text)
    manifest.append(('extracted', path, hashlib.sha256(text.encode()).hexdigest()))
    extracted[path] = len(roots) + len(pulled)

# The stubs: each stands in for a module of the wheel that no real or extracted file here replaces.
stub_files = sorted(os.path.relpath(os.path.join(d, f), stubs)
                    for d, _, fs in os.walk(stubs) for f in fs if f.endswith('.py'))
for rel in stub_files:
    if rel not in names:
        sys.exit(f'{stubs}/{rel}: stands in for no file of the wheel')
    if rel in keep or rel in extract:
        sys.exit(f'{stubs}/{rel}: would replace a kept real or extracted file')
    text = open(os.path.join(stubs, rel)).read()
    if not text.startswith('"""Stands in for'):
        sys.exit(f'{stubs}/{rel}: must start with a docstring "Stands in for ..."')
    os.makedirs(os.path.dirname(os.path.join(site, rel)), exist_ok=True)
    shutil.copyfile(os.path.join(stubs, rel), os.path.join(site, rel))
    manifest.append(('stub', rel, hashlib.sha256(text.encode()).hexdigest()))

with open(f'{out}/manifest.tsv', 'w') as f:
    f.write(f'# .sgl/site from {os.path.basename(whl)} (real: byte-identical to the wheel, RECORD-checked;'
            f' extracted: generated from a wheel module, lab/offline/sglang_keep.txt) and lab/offline/sglang_stubs (stub)\n')
    for kind, path, digest in sorted(manifest, key=lambda m: m[1]):
        f.write(f'{kind}\t{path}\t{digest}\n')
real_bytes = sum(z.getinfo(n).file_size for n in keep)
print(f'sglang {version}: {len(keep)} real files ({real_bytes / 1e3:.0f} kB) of '
      f'{sum(1 for n in names if n.endswith(".py"))} .py in the wheel; {len(extract)} extracted '
      f'({sum(extracted.values())} top-level names); {len(stub_files)} stubs')
PY
# 3. In place, within its size (.sgl travels with the working tree).
. lab/offline/carry_swap_in.sh
swap_in_carry .sgl "$STAGE/sgl" "$MAX_MB"

[ "$CHECK" = 1 ] || exit 0

# 4. --check: both import paths here, from .sgl/site only.
PY=${PYTHON:-.venv/bin/python}
for mode in cpu cuda; do
# (CARRY_*: SGLang's environ.py renames any SGL_* variable to SGLANG_*, with a warning.)
PYTHONPATH="$PWD/.sgl/site:$PWD" PYTHONDONTWRITEBYTECODE=1 TRITON_INTERPRET=1 CARRY_MODE=$mode \
CARRY_WHEEL="$WHEEL" "$PY" - <<'PY'
import ast, importlib.abc, importlib.util, os, sys, zipfile

mode = os.environ['CARRY_MODE']
site = os.path.realpath('.sgl/site')
tried = []
class Record(importlib.abc.MetaPathFinder):            # every import attempt, failed ones included
    def find_spec(self, name, path=None, target=None):
        tried.append(name)
recorder = Record()
sys.meta_path.insert(0, recorder)

import torch
if mode == 'cuda':
    # What the box sees: a CUDA torch with a device.  The tensors stay on the CPU (the Triton
    # kernel runs under TRITON_INTERPRET=1).
    os.environ.pop('SGLANG_USE_CPU_ENGINE', None)
    torch.cuda.is_available = lambda: True
    torch.version.cuda = torch.version.cuda or '12.9'
else:
    os.environ['SGLANG_USE_CPU_ENGINE'] = '1'

import rope.backends.sglang.rotation as adapter
import sglang
from sglang.srt.layers.rotary_embedding import base, mrope

cuda = 'sglang.kernels.ops.attention.rope' in sys.modules
assert mrope._is_cuda == base._is_cuda == cuda == (mode == 'cuda'), (mode, mrope._is_cuda, cuda)
ours = {m: v for m, v in sys.modules.items() if m.split('.')[0] == 'sglang'}
outside = sorted(m for m, v in ours.items() if getattr(v, '__file__', None)
                 and not os.path.realpath(v.__file__).startswith(site + '/'))
assert not outside, f'not from .sgl/site: {outside}'
kinds = dict(l.split('\t')[1::-1] for l in open('.sgl/manifest.tsv') if not l.startswith('#'))
def kind(m):
    f = getattr(ours[m], '__file__', None)
    return f and kinds.get(os.path.relpath(os.path.realpath(f), site))
print(f'[{mode}] sglang {sglang.__version__}: {len(ours)} modules from .sgl/site;',
      '; '.join(f'{k}: ' + ' '.join(sorted(m for m in ours if kind(m) == k)) for k in ('extracted', 'stub')))

# A small M-RoPE case through both entries, the adapter's way (head_size 80: on CUDA the constructor
# also imports the JIT fallback kernel).
from rope.spec import RopeSpec
spec = RopeSpec(head_size=80, rotary_dim=80, sections=(8, 16, 16), max_position=64)
g = torch.Generator().manual_seed(0)
T = 5
pos = torch.randint(0, 64, (3, T), generator=g)
q = torch.randn(T, 2 * 80, generator=g)
k = torch.randn(T, 80, generator=g)
inv = 1.0 / (10000.0 ** (torch.arange(0, 80, 2, dtype=torch.float64) / 80))
f = torch.outer(torch.arange(64, dtype=torch.float64), inv)
cache = torch.cat([f.cos(), f.sin()], -1).float()
from reference.rotation import rotate
qr, kr = rotate(spec, pos, q, k, cache)
for name, fn in (('forward_native', adapter.rotate_sglang), ('forward_triton', adapter.rotate_sglang_triton)):
    qo, ko = fn(spec, pos, q.clone(), k.clone(), cache)
    err = max((qo.double() - qr).abs().max().item(), (ko.double() - kr).abs().max().item())
    print(f'[{mode}] {name}: fp32, T={T}, max |error| vs the float64 reference {err:.1e}')
    assert err < 1e-5, err

sys.meta_path.remove(recorder)                          # the probes below are not the import path's
names = set(zipfile.ZipFile(os.environ['CARRY_WHEEL']).namelist())
def in_wheel(m):
    p = m.replace('.', '/')
    return f'{p}.py' in names or f'{p}/__init__.py' in names
def in_site(m):
    p = os.path.join(site, *m.split('.'))
    return os.path.exists(p + '.py') or os.path.exists(os.path.join(p, '__init__.py'))
lost = sorted({m for m in tried if m.split('.')[0] == 'sglang' and in_wheel(m) and not in_site(m)})
# Packages the carried files import (anywhere, any branch) that are absent here: the optional ones
# SGLang guards (sgl_kernel for the CPU AMX probe) and other platforms' (torch_npu, aiter, ...).
imported = set()
for m, v in ours.items():
    if getattr(v, '__file__', None):
        for node in ast.walk(ast.parse(open(v.__file__).read())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split('.')[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split('.')[0])
absent = sorted(p for p in imported if p != 'sglang' and p not in sys.modules
                and importlib.util.find_spec(p) is None)
print(f'[{mode}] {len({m for m in tried if m.startswith("sglang")})} sglang modules tried; in the wheel '
      f'but not in .sgl: {lost or "none"}; packages the loaded sglang modules name that are absent '
      f'here: {" ".join(absent) or "none"}; of these tried on this path: '
      f'{" ".join(sorted({m.split(".")[0] for m in tried} & set(absent))) or "none"}')
sys.exit(1 if lost else 0)
PY
done
