#!/usr/bin/env bash
# vLLM's own M-RoPE code (rope/backends/vllm/rotation.py: vllm-cuda, vllm-native, vllm-xd; and
# rope/backends/vllm/position_step.py: --rope-position-step-impl vllm) for a GPU box with no network:
#
#   lab/offline/vllm_carry.sh [WHEEL | WHEEL_DIR | SITE_PACKAGES] [--local-check]   # default /tmp/vllm-wheel
#   (carry .vllm to the box, then there:) lab/offline/vllm_gpu_check.sh [PYTEST_ARGS...]
#
# Builds .vllm/ (git-ignored; ~1 MB), whose site/ goes first on PYTHONPATH on the box (Python 3.12,
# torch 2.11, triton 3.6, no pydantic).  Everything of vLLM in it comes from the published vllm
# 0.33.0 wheel at build time (336 MB, mostly compiled CUDA kernels for torch 2.13); the repository
# holds no vLLM code.  lab/offline/vllm_keep.txt lists, per file of the wheel:
#   site/vllm/...     real: the pure-Python modules the two adapters' import paths load, copied
#                     unmodified (each checked against the wheel's RECORD hash), and the wheel's
#                     metadata (METADATA, WHEEL, top_level.txt, licence; not RECORD, which lists the
#                     dropped files, nor entry_points.txt, whose plugins are not carried), so that
#                     importlib.metadata.version("vllm") = 0.33.0, which vLLM's platform detection reads.
#   site/vllm/...     extracted: modules the chain reaches that the box cannot import whole (their
#                     other definitions need pydantic, compiled vLLM kernels, NCCL communicators, the
#                     model registry), generated here by lab/offline/carry_extract.py from the wheel's own
#                     file (RECORD-checked): only the top-level names listed and, transitively, the
#                     top-level statements they use, as byte-identical source segments (imports cut
#                     down to the names kept), under a generated docstring saying so.
#                     vllm.platforms.cuda (CudaPlatform: vLLM's NvmlCudaPlatform /
#                     NonNvmlCudaPlatform, less the import of the compiled vllm._C_stable_libtorch),
#                     vllm.config.vllm (set_current_vllm_config & co.), vllm.config.compilation
#                     (CompilationMode, CUDAGraphMode), vllm.distributed(.parallel_state) (rank
#                     checks, tensor-parallel getters), vllm.model_executor.models(.interfaces)
#                     (SupportsMRoPE).  vLLM's real platform detection (NVML,
#                     vllm/platforms/__init__.py) picks that CudaPlatform on a GPU host, so CustomOp
#                     dispatches forward_cuda to vLLM's Triton kernel triton_mrope.
#   site/vllm/...     stubs, lab/offline/vllm_stubs/vllm/ laid over that tree: our own small code, not
#                     vLLM's, where vLLM's definitions cannot be used: vllm/config/__init__.py
#                     (VllmConfig, DeviceConfig, CompilationConfig: pydantic dataclasses in vLLM; plain
#                     dataclasses here with the fields the ops read) and vllm/_aiter_ops.py (ROCm AITER:
#                     never enabled on CUDA).  Each says in its docstring what it stands in for.
#   manifest.txt      "real|meta|extracted|stub <sha256> <path>" for every file, and where it came from.
# The source is the wheel (WHEEL, or vllm-0.33.0-*.whl in WHEEL_DIR, downloaded there with
# pip download --no-deps when missing), or an installed tree (a site-packages folder holding vllm/
# and vllm-0.33.0.dist-info/, e.g. /tmp/vllm-venv/lib/python3.11/site-packages): the same files.
#
# --local-check: here, without a GPU: with $PYTHON (default .venv/bin/python, which has no vllm),
# PYTHONPATH=.vllm/site:. (+ requests & co. in ${VLLM_LOCAL_DIR:-/tmp/vllm-localcheck}/deps-cpXY),
# TRITON_INTERPRET=1 and pydantic & co. blocked (as on the box): imports the adapters, fails on any
# vllm module that is tried but not carried, checks every vllm module comes from .vllm/site, runs
# vllm-cuda / vllm-native on a small M-RoPE case against the float64 reference; then again with
# vLLM's CUDA-platform probe forced to answer yes (the extracted CudaPlatform, as on the box).
# Idempotent: .vllm is rebuilt from the source each run; a download happens only when the wheel is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

VLLM_VERSION=0.33.0
MAX_MB=8
SRC=/tmp/vllm-wheel
LOCAL_CHECK=0
for arg in "$@"; do
    case $arg in
        --local-check) LOCAL_CHECK=1 ;;
        -h|--help) sed -n '2,/^# Idempotent/p' "$0"; exit 0 ;;
        *) SRC=$arg ;;
    esac
done

# 1. The source: an installed tree, a wheel file, or a folder of wheels (download when missing).
if [ -f "$SRC/vllm/__init__.py" ]; then
    :                                                   # installed tree (site-packages)
elif [ -f "$SRC" ]; then
    :                                                   # the wheel itself
else
    case $SRC in *.whl) DIR=$(dirname "$SRC") ;; *) DIR=$SRC ;; esac
    mkdir -p "$DIR"
    whl() { ls "$DIR"/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -1; }
    [ -n "$(whl)" ] || python3 -m pip download -q --no-deps --only-binary=:all: -d "$DIR" "vllm==$VLLM_VERSION"
    SRC=$(whl)
    [ -n "$SRC" ] || { echo "no vllm-$VLLM_VERSION wheel in $DIR" >&2; exit 1; }
fi

# 2. Stage .vllm from the source (real files, extracted modules) and the stubs, then swap it in.
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
python3 - "$SRC" "$VLLM_VERSION" lab/offline/vllm_keep.txt lab/offline/vllm_stubs "$STAGE/vllm" <<'PY'
import base64, hashlib, os, sys, zipfile

src, version, keep_list, stubs, out = sys.argv[1:]
dist = f'vllm-{version}.dist-info'
if os.path.isdir(src):
    names = set()
    for d in ('vllm', dist):
        for root, _, files in os.walk(os.path.join(src, d)):
            names |= {os.path.relpath(os.path.join(root, f), src).replace(os.sep, '/') for f in files}
    read_raw = lambda n: open(os.path.join(src, n), 'rb').read()
    origin = f'installed tree {os.path.realpath(src)}'
else:
    z = zipfile.ZipFile(src)
    names = set(z.namelist())
    read_raw = z.read
    origin = f'wheel {os.path.basename(src)} (sha256 {hashlib.sha256(open(src, "rb").read()).hexdigest()})'
if f'{dist}/METADATA' not in names:
    sys.exit(f'{src}: no {dist} (not vllm {version})')

# RECORD: path,sha256=<urlsafe b64>,size: every file read from the source must be the wheel's byte for
# byte (an installed tree's RECORD carries the wheel's hashes), so the output is the same from either.
record = {}
for line in read_raw(f'{dist}/RECORD').decode().splitlines():
    path, digest, _ = line.rsplit(',', 2)
    if digest.startswith('sha256='):
        record[path] = digest[len('sha256='):]
def b64(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
def read(n):
    data = read_raw(n)
    if n in record and b64(data) != record[n]:
        sys.exit(f'{n}: does not match the RECORD hash')
    if n not in record and not n.endswith('/RECORD'):
        sys.exit(f'{n}: not in RECORD')
    return data

# lab/offline/vllm_keep.txt: "path" (real) or "path: [+future-annotations] names [-unbound ...]" (extracted).
keep, extract = [], {}
for line in open(keep_list):
    line = line.split('#', 1)[0].strip()
    if not line:
        continue
    path, colon, words = line.partition(':')
    path = path.strip()
    if path in keep or path in extract or not path.startswith('vllm/'):
        sys.exit(f'{keep_list}: bad or repeated line {line!r}')
    if not colon:
        keep.append(path)
        continue
    words = words.split()
    if any(w.startswith('+') and w != '+future-annotations' for w in words):
        sys.exit(f'{keep_list}: {path}: unknown option in {words}')
    extract[path] = ([w for w in words if w[0] not in '-+'], {w[1:] for w in words if w[0] == '-'},
                     '+future-annotations' in words)
missing = [k for k in keep + list(extract) if k not in names]
if missing:
    sys.exit(f'{keep_list}: not in {src}: {missing}')
for path in extract:
    if not path.endswith('.py'):
        sys.exit(f'{keep_list}: {path} is not a Python module')
meta = sorted(n for n in names if n.startswith(f'{dist}/')
              and n.rsplit('/', 1)[-1] in ('METADATA', 'WHEEL', 'top_level.txt', 'LICENSE'))

stub_files = sorted(os.path.relpath(os.path.join(root, f), stubs).replace(os.sep, '/')
                    for root, _, files in os.walk(stubs) for f in files if f.endswith('.py'))
for s in stub_files:
    if s in keep or s in extract:
        sys.exit(f'{stubs}/{s}: would replace a real or extracted file of {keep_list}')
    if s not in names:
        sys.exit(f'stub {s} stands in for no module of the wheel')
    head = open(os.path.join(stubs, s)).read(200)
    if not head.startswith('"""Stub: stands in for vLLM'):
        sys.exit(f'{stubs}/{s}: must start with a docstring "Stub: stands in for vLLM\'s <module> ..."')

site = os.path.join(out, 'site')
def write(n, data):
    os.makedirs(os.path.dirname(os.path.join(site, n)), exist_ok=True)
    with open(os.path.join(site, n), 'wb') as f:
        f.write(data)
lines = [f'# vllm {version} carry (lab/offline/vllm_carry.sh) from {origin}',
         f'# kind sha256 path (under site/); real and meta files match the RECORD of {dist}, extracted'
         f' ones are generated from a file that does (lab/offline/vllm_keep.txt), stubs are lab/offline/vllm_stubs']
for n in keep + meta:
    data = read(n)
    write(n, data)
    lines.append(f'{"meta" if n in meta else "real"} {hashlib.sha256(data).hexdigest()} {n}')


# --- extraction (lab/offline/carry_extract.py): the named top-level definitions of a wheel module -----
sys.dont_write_bytecode = True
sys.path.insert(0, 'lab/offline')                        # the repository root is the cwd
import carry_extract

extracted = {}
for path, (roots, unbound, add_future) in extract.items():
    try:
        text, pulled = carry_extract.extract_module(
            read(path).decode(), path, tool='lab/offline/vllm_carry.sh', package='vllm', version=version,
            keep_list=keep_list, roots=roots, unbound=unbound, add_future=add_future)
    except carry_extract.ExtractError as e:
        sys.exit(str(e))
    write(path, text.encode())
    lines.append(f'extracted {hashlib.sha256(text.encode()).hexdigest()} {path}')
    extracted[path] = len(roots) + len(pulled)
for s in stub_files:
    data = open(os.path.join(stubs, s), 'rb').read()
    write(s, data)
    lines.append(f'stub {hashlib.sha256(data).hexdigest()} {s}')

# Every folder of the tree must be a regular package, as in the wheel.
for root, dirs, files in os.walk(os.path.join(site, 'vllm')):
    if '__init__.py' not in files:
        sys.exit(f'{os.path.relpath(root, site)}: no __init__.py (add it to lab/offline/vllm_keep.txt or a stub)')
with open(os.path.join(out, 'manifest.txt'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
size = sum(len(read_raw(n)) for n in keep)
print(f'vllm {version}: {len(keep)} real files ({size / 1e6:.2f} MB) of '
      f'{sum(1 for n in names if n.startswith("vllm/"))} in the {"tree" if os.path.isdir(src) else "wheel"}; '
      f'{len(extract)} extracted ({sum(extracted.values())} top-level names); '
      f'{len(stub_files)} stubs ({", ".join(stub_files)}); {len(meta)} metadata files')
PY
# 3. In place, within its size (the whole of .vllm travels with the working tree).
. lab/offline/carry_swap_in.sh
swap_in_carry .vllm "$STAGE/vllm" "$MAX_MB"

[ "$LOCAL_CHECK" = 1 ] || exit 0

# 4. --local-check: the import path and the ops, here, from the trimmed tree, once as vLLM's own
# platform detection decides (no GPU: UnspecifiedPlatform) and once with its CUDA probe forced.
PY=${PYTHON:-.venv/bin/python}
# requests (vllm/utils/flashinfer.py imports it; the box has it): from $PY, else installed for $PY
# into ${VLLM_LOCAL_DIR:-/tmp/vllm-localcheck}/deps-cpXY.
DEPS=${VLLM_LOCAL_DIR:-/tmp/vllm-localcheck}/deps-$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
if ! "$PY" -c 'import requests' 2>/dev/null && [ ! -f "$DEPS/.done" ]; then
    rm -rf "$DEPS"
    "$PY" -m pip install -q --no-deps --target "$DEPS" requests urllib3 certifi idna charset-normalizer
    touch "$DEPS/.done"
fi
for platform in detected cuda; do
    echo "--local-check ($platform platform)"
    PYTHONPATH="$PWD/.vllm/site:$PWD:$DEPS" PYTHONDONTWRITEBYTECODE=1 TRITON_INTERPRET=1 FORCE_PLATFORM=$platform \
    SRC="$SRC" "$PY" - <<'PY'
import importlib.abc, os, sys, zipfile

# The box has none of these; vLLM's real config/engine modules would import them.
ABSENT = {'pydantic', 'pydantic_core', 'fastapi', 'msgspec', 'cachetools', 'cbor2', 'blake3', 'openai',
          'zmq', 'pybase64', 'xgrammar', 'gguf', 'mistral_common', 'compressed_tensors', 'ray'}
tried, blocked = [], []
class Record(importlib.abc.MetaPathFinder):           # every import attempt, failed ones included
    def find_spec(self, name, path=None, target=None):
        top = name.split('.')[0]
        if top == 'vllm':
            tried.append(name)
        if top in ABSENT:
            blocked.append(name)
            raise ModuleNotFoundError(f'No module named {name!r} (not on the GPU box)')
sys.meta_path.insert(0, Record())

force = os.environ['FORCE_PLATFORM'] == 'cuda'
if force:
    import vllm.platforms as platforms
    platforms.builtin_platform_plugins['cuda'] = lambda: 'vllm.platforms.cuda.CudaPlatform'

import torch
import rope.backends.vllm.rotation as adapter
import rope.backends.vllm.position_step as positions_adapter
import vllm
from vllm.platforms import current_platform
from vllm.triton_utils import HAS_TRITON

site = os.path.realpath('.vllm/site')
mods = {k: m for k, m in sys.modules.items() if k.split('.')[0] == 'vllm'}
outside = sorted(k for k, m in mods.items()
                 if getattr(m, '__file__', None) and not os.path.realpath(m.__file__).startswith(site + '/'))
kinds = {l.split()[2]: l.split()[0] for l in open('.vllm/manifest.txt') if not l.startswith('#')}
def loaded(kind):
    return ' '.join(sorted(k for k, m in mods.items() if getattr(m, '__file__', None)
                           and kinds.get(os.path.relpath(os.path.realpath(m.__file__), site)) == kind))
print(f'vllm {vllm.__version__} from {os.path.dirname(vllm.__file__)}: {len(mods)} modules loaded; '
      f'extracted among them: {loaded("extracted")}; stubs: {loaded("stub")}')
print(f'current_platform: {type(current_platform).__module__}.{type(current_platform).__name__} '
      f'(is_cuda {current_platform.is_cuda()}), HAS_TRITON {HAS_TRITON}')
assert not outside, f'vllm modules not from .vllm/site: {outside}'
assert current_platform.is_cuda() == force, current_platform
assert HAS_TRITON

# A small Qwen2-VL-like case (3 position rows, chunked sections) through both entries, float32.
from rope import RopeSpec, cos_sin_cache
import reference
spec = RopeSpec(head_size=64, rotary_dim=64, is_neox_style=True, sections=(8, 12, 12), layout='chunked',
                max_position=64)
g = torch.Generator().manual_seed(0)
T = 5
pos = torch.randint(0, 64, (3, T), generator=g)
q = torch.randn(T, 2 * 64, generator=g)
k = torch.randn(T, 64, generator=g)
cache = cos_sin_cache(spec, dtype=torch.float32, device='cpu')
ref_q, ref_k = reference.rotate(spec, pos, q, k, cache)
for entry in (adapter.rotate_vllm_cuda, adapter.rotate_vllm_native):
    oq, ok = entry(spec, pos, q.clone(), k.clone(), cache)
    err = max((oq.double() - ref_q).abs().max().item(), (ok.double() - ref_k).abs().max().item())
    print(f'{entry.__name__}: max |error| vs float64 reference {err:.2e}')
    assert err < 1e-4, err
op = adapter._mrope_op(spec, torch.float32)
print(f'CustomOp dispatch under the default config: MRotaryEmbedding -> {op._forward_method.__name__}')
from vllm.config import VllmConfig, DeviceConfig, CompilationConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding
cfg = VllmConfig(device_config=None if force else DeviceConfig(device='cpu'),
                 compilation_config=CompilationConfig(custom_ops=['all']))
with set_current_vllm_config(cfg):
    enabled = MRotaryEmbedding(64, 64, 64, 10000.0, True, torch.float32, [8, 12, 12], positions_factor=1)
print(f'  with custom_ops=["all"]: -> {enabled._forward_method.__name__}')
assert enabled._forward_method.__name__ == 'forward_cuda'   # CUDA and Unspecified both dispatch it

names = set(zipfile.ZipFile(os.environ['SRC']).namelist()) if os.path.isfile(os.environ['SRC']) else None
def in_source(m):
    rel = '/'.join(m.split('.'))
    if names is not None:
        return rel + '.py' in names or rel + '/__init__.py' in names
    return any(os.path.exists(os.path.join(os.environ['SRC'], rel + s)) for s in ('.py', '/__init__.py'))
lost = sorted({m for m in tried if m not in sys.modules and in_source(m)})
print(f'{len(set(tried))} vllm modules tried; in vLLM but not carried: {lost or "none"}; '
      f'blocked (absent on the box): {sorted(set(blocked)) or "none"}')
sys.exit(1 if lost or blocked else 0)
PY
done
