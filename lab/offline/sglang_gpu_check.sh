#!/usr/bin/env bash
# On the GPU box (no network), from the repo root, with .sgl carried (lab/offline/sglang_carry.sh here):
#
#   lab/offline/sglang_gpu_check.sh [PYTEST_ARGS...]
#
# (a) puts .sgl/site and the repo on PYTHONPATH, imports rope.backends.sglang.rotation, and prints the SGLang
#     version, whether SGLang took its CUDA path (SGLANG_USE_CPU_ENGINE unset, as the adapter leaves
#     it on a GPU host) and which of the sglang modules loaded are the wheel's files, which were
#     extracted from the wheel's files (lab/offline/sglang_keep.txt) and which are the carry's own stubs
#     (lab/offline/sglang_stubs); every one is checked against the sha256 in .sgl/manifest.tsv;
# (b) runs one small M-RoPE case through forward_native and forward_triton (triton_mrope_fused,
#     compiled for the GPU) on CUDA against the float64 reference;
# (c) runs pytest with PYTEST_ARGS, by default
#       -q -p no:cacheprovider --rope-impl sglang --rope-impl sglang-triton --rope-device cuda
#       properties/rotation/test_rotation.py tests/backends/test_backends.py
#     (any PYTEST_ARGS replace that default after "-q -p no:cacheprovider").
# Known upstream findings for sglang / sglang-triton (docs/findings.md,
# docs/upstream-sglang-mrope-padding-lanes.md) show as failures or pinned xfails there.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
[ -d .sgl/site/sglang ] || { echo ".sgl/site missing: run lab/offline/sglang_carry.sh and carry .sgl" >&2; exit 2; }
export PYTHONPATH=$root/.sgl/site:$root${PYTHONPATH:+:$PYTHONPATH}
unset SGLANG_USE_CPU_ENGINE TRITON_INTERPRET

PYTHONUNBUFFERED=1 python3 - <<'PY'
import hashlib, importlib.metadata, os, sys, time

import torch, triton

t = time.perf_counter()
import rope.backends.sglang.rotation as adapter
import sglang
from sglang.srt.layers.rotary_embedding import mrope
print(f'(a) import rope.backends.sglang.rotation: {time.perf_counter() - t:.1f} s; torch {torch.__version__} '
      f'(CUDA {torch.version.cuda}, {torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"}), '
      f'triton {triton.__version__}')
print(f'    sglang {sglang.__version__} (metadata {importlib.metadata.version("sglang")}) from '
      f'{os.path.dirname(sglang.__file__)}; SGLang CUDA path: {mrope._is_cuda}')

site = os.path.realpath('.sgl/site')
manifest = {}
for line in open('.sgl/manifest.tsv'):
    if not line.startswith('#'):
        kind, path, digest = line.rstrip('\n').split('\t')
        manifest[path] = (kind, digest)
loaded = {m: v for m, v in sys.modules.items() if m.split('.')[0] == 'sglang' and getattr(v, '__file__', None)}
by_kind, bad = {'real': [], 'extracted': [], 'stub': []}, []
for m, v in sorted(loaded.items()):
    path = os.path.realpath(v.__file__)
    rel = os.path.relpath(path, site)
    if rel not in manifest or manifest[rel][0] not in by_kind:
        bad.append(f'{m} ({path}: not a module in .sgl/manifest.tsv)')
        continue
    kind, digest = manifest[rel]
    if hashlib.sha256(open(path, 'rb').read()).hexdigest() != digest:
        bad.append(f'{m} ({rel}: changed since lab/offline/sglang_carry.sh built it)')
    by_kind[kind].append(m)
print(f'    {len(by_kind["real"])} sglang modules are the wheel\'s files; {len(by_kind["extracted"])} extracted '
      f'from them: {" ".join(by_kind["extracted"])}; {len(by_kind["stub"])} stubs: {" ".join(by_kind["stub"])}')
if bad:
    sys.exit('    not as built: ' + '; '.join(bad))
if not torch.cuda.is_available():
    sys.exit('no CUDA device here')
if not mrope._is_cuda:
    sys.exit('SGLang did not take its CUDA path (SGLANG_USE_CPU_ENGINE set?)')

from reference.rotation import rotate
from rope.spec import RopeSpec

spec = RopeSpec(head_size=128, rotary_dim=128, sections=(16, 24, 24), layout='interleaved', max_position=256)
g = torch.Generator().manual_seed(0)
pos = torch.randint(0, 256, (3, 7), generator=g).cuda()
q, k = torch.randn(7, 4 * 128, generator=g).cuda(), torch.randn(7, 2 * 128, generator=g).cuda()
inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
f = torch.outer(torch.arange(256, dtype=torch.float64), inv)
cache = torch.cat([f.cos(), f.sin()], -1).float().cuda()
qr, kr = rotate(spec, pos, q, k, cache)
for name, fn in (('forward_native', adapter.rotate_sglang), ('forward_triton', adapter.rotate_sglang_triton)):
    t = time.perf_counter()
    qo, ko = fn(spec, pos, q.clone(), k.clone(), cache)
    torch.cuda.synchronize()
    err = max((qo.double() - qr).abs().max().item(), (ko.double() - kr).abs().max().item())
    print(f'(b) {name} on CUDA, fp32 interleaved 4q/2kv heads x 128, 7 tokens: max |error| vs the '
          f'float64 reference {err:.1e} (first call {time.perf_counter() - t:.1f} s)')
    if not err < 1e-5:
        sys.exit(f'{name}: error {err} on a plain case')
PY

if [ $# -eq 0 ]; then
    set -- --rope-impl sglang --rope-impl sglang-triton --rope-device cuda \
        properties/rotation/test_rotation.py tests/backends/test_backends.py
fi
echo "(c) pytest -q -p no:cacheprovider $*"
python3 -m pytest -q -p no:cacheprovider "$@"
