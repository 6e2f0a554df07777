#!/usr/bin/env bash
# On the GPU box (no network), from the repo root, with .vllm carried (lab/offline/vllm_carry.sh here):
#
#   lab/offline/vllm_gpu_check.sh [PYTEST_ARGS...]
#
# (a) puts .vllm/site first on PYTHONPATH (PYTHONPATH=$root/.vllm/site:$root), imports
#     rope.backends.vllm.rotation and rope.backends.vllm.position_step, prints the vLLM version, where it comes
#     from, the platform vLLM detected (must be CUDA: vLLM's CudaPlatform, extracted from the wheel,
#     so forward_cuda runs the Triton kernel triton_mrope), and which of the loaded vllm modules are
#     extracted from vLLM's files or our stubs (.vllm/manifest.txt; every other one is a real vllm
#     0.33.0 file), failing if any vllm module comes from elsewhere or a file no longer matches the
#     manifest;
# (b) runs vllm-cuda and vllm-native once on a small Qwen3-VL M-RoPE case on the GPU against the
#     float64 reference (counting the launches of vLLM's triton_mrope: forward_cuda must make one,
#     forward_native none), and prepare_positions_vllm on a prefill chunk and a decode step;
# (c) runs pytest with PYTEST_ARGS, or by default
#       python3 -m pytest -q -p no:cacheprovider --rope-device cuda --rope-impl vllm-cuda
#              --rope-impl vllm-native --rope-position-step-impl vllm
#              properties/rotation/test_rotation.py properties/position_step/test_runner_positions.py
# The box has no pydantic, so vLLM's own config classes cannot load there: the stub vllm.config of
# lab/offline/vllm_stubs/ stands in for them (the rest of vllm.config is extracted from the wheel), and
# modules that need compiled vLLM kernels or NCCL are carried as extracts (lab/offline/vllm_keep.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
[ -f .vllm/manifest.txt ] || { echo ".vllm missing: run lab/offline/vllm_carry.sh and carry .vllm" >&2; exit 2; }
export PYTHONPATH=$root/.vllm/site:$root${PYTHONPATH:+:$PYTHONPATH}

PYTHONUNBUFFERED=1 python3 - <<'PY'
import hashlib, os, sys

import torch
import rope.backends.vllm.rotation as adapter
import rope.backends.vllm.position_step
import vllm
from vllm.platforms import current_platform
from vllm.triton_utils import HAS_TRITON

site = os.path.realpath('.vllm/site')
manifest = {l.split()[2]: l.split()[:2] for l in open('.vllm/manifest.txt') if not l.startswith('#')}
loaded = {k: os.path.realpath(m.__file__) for k, m in sys.modules.items()
          if k.split('.')[0] == 'vllm' and getattr(m, '__file__', None)}
outside = sorted(k for k, f in loaded.items() if not f.startswith(site + '/'))
changed = sorted(k for k, f in loaded.items() if f.startswith(site + '/') and
                 hashlib.sha256(open(f, 'rb').read()).hexdigest() != manifest.get(os.path.relpath(f, site), ['', ''])[1])
kind = {k: manifest.get(os.path.relpath(f, site), [''])[0] for k, f in loaded.items()}
extracted = sorted(k for k in loaded if kind[k] == 'extracted')
stubs = sorted(k for k in loaded if kind[k] == 'stub')
print(f'vllm {vllm.__version__} from {os.path.dirname(vllm.__file__)}; {len(loaded)} vllm modules loaded: '
      f'{sum(v == "real" for v in kind.values())} real vllm files, extracted: {" ".join(extracted)}; '
      f'stubs: {" ".join(stubs)}')
print(f'torch {torch.__version__}, triton {__import__("triton").__version__}, CUDA available {torch.cuda.is_available()}; '
      f'vLLM platform {type(current_platform).__module__}.{type(current_platform).__name__} '
      f'(is_cuda {current_platform.is_cuda()}), HAS_TRITON {HAS_TRITON}')
assert not outside, f'vllm modules from outside .vllm/site: {outside}'
assert not changed, f'files differ from .vllm/manifest.txt: {changed}'
assert current_platform.is_cuda() and HAS_TRITON, 'vLLM must detect CUDA and keep Triton here'

from rope import RopeSpec, cos_sin_cache
import reference
from reference.runner_positions import prepare_positions
from vllm.model_executor.layers.rotary_embedding import mrope

# vLLM's Triton M-RoPE kernel must be what forward_cuda runs: count its launches.
launches = []
_triton_mrope = mrope.triton_mrope
mrope.triton_mrope = lambda *a, **kw: launches.append(1) or _triton_mrope(*a, **kw)
spec = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(24, 20, 20), layout='interleaved',
                base=5000000.0, max_position=4096)            # Qwen3-VL (models.yaml qwen3-vl-2b)
g = torch.Generator(device='cuda').manual_seed(0)
T = 37
pos = torch.randint(0, 4096, (3, T), device='cuda', generator=g)
q = torch.randn(T, 16 * 128, device='cuda', generator=g)
k = torch.randn(T, 8 * 128, device='cuda', generator=g)
cache = cos_sin_cache(spec, dtype=torch.float32, device='cuda')
ref_q, ref_k = reference.rotate(spec, pos, q, k, cache)
for entry in (adapter.rotate_vllm_cuda, adapter.rotate_vllm_native):
    before = len(launches)
    oq, ok = entry(spec, pos, q.clone(), k.clone(), cache)
    torch.cuda.synchronize()
    err = max((oq.double() - ref_q).abs().max().item(), (ok.double() - ref_k).abs().max().item())
    print(f'{entry.__name__} on cuda: max |error| vs float64 reference {err:.2e}, '
          f'triton_mrope calls {len(launches) - before}')
    assert err < 1e-4, err
    assert (len(launches) > before) == (entry is adapter.rotate_vllm_cuda)
mrope.triton_mrope = _triton_mrope

# RopeState.prepare_positions (vLLM's Triton kernel): a prefill chunk and a decode step.
dev, i32 = 'cuda', torch.int32
table = torch.arange(2 * 3 * 16, device=dev, dtype=i32).reshape(2 * 3, 16)
args = (table, torch.tensor([0, 7], device=dev, dtype=i32), torch.tensor([0, 1], device=dev, dtype=i32),
        torch.tensor([0, 4, 5], device=dev, dtype=i32), torch.tensor([6, 3], device=dev, dtype=i32),
        torch.tensor([1, 5], device=dev, dtype=i32))
out = torch.full((3, 6), -1, device=dev, dtype=torch.int64)
rope.backends.vllm.position_step.prepare_positions_vllm(*args, 3, out)
expected = prepare_positions(*args, 3)
print(f'prepare_positions_vllm on cuda: {out[:, :5].tolist()} '
      f'({"matches" if torch.equal(out[:, :5], expected) else "DIFFERS FROM"} the reference)')
assert torch.equal(out[:, :5], expected)
PY

if [ $# -eq 0 ]; then
    set -- -q -p no:cacheprovider --rope-device cuda --rope-impl vllm-cuda --rope-impl vllm-native \
        --rope-position-step-impl vllm properties/rotation/test_rotation.py properties/position_step/test_runner_positions.py
fi
echo "pytest $*"
python3 -m pytest "$@"
