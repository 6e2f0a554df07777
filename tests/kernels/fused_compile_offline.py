"""Compile the fused-op kernels' launches for a GPU on a machine that has none (the way
tests/kernels/compile_offline.py does for the rotation kernel): the launchers' own arguments,
grid and constexprs recorded with the kernel call intercepted and the launch told it targets sm_90,
then ``triton.compile`` with Triton's NVIDIA backend and ptxas, no driver.  The interpreter runs
bodies the compiler refuses; this is where such a body shows on a CPU machine.

Run in a process of its own with TRITON_INTERPRET=0::

    TRITON_INTERPRET=0 python -m tests.kernels.fused_compile_offline [--all]

One JSON line per compiled launch; exit 1 if any failed.  Without ``--all``, six launches that
turn each switch of the code both ways (NeoX/GPT-J, the map computed or read from its table, no
FP8/e4m3fn/e5m2, NHD/HND) and two of the KV-cache kernel's MLA form (bf16 and e4m3fn latent caches);
with it, every spec x dtype x cache kind x layout of the table below and MLA's dtypes x cache kinds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
from triton.backends.compiler import GPUTarget

import rope.triton.fused_qk_norm_rope as qk_norm_module
import rope.triton.rope_kv_cache as kv_cache_module
from rope.spec import RopeSpec
from rope.triton.targets import TARGETS

SPECS = (RopeSpec(128, 64, False, (8, 12, 12), "chunked"), RopeSpec(128, 128, True, (24, 20, 20), "interleaved"),
         RopeSpec(256, 64, True, None), RopeSpec(128, 128, False, (22, 22, 20), "ernie45"))
_POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64",
            torch.int32: "*i32", torch.uint8: "*u8"}
_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "launch_pdl")


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def _record(module, kernel_name: str, launch) -> list:
    kernel, target = getattr(module, kernel_name), module.launch_target
    recorder = _Recorder()
    setattr(module, kernel_name, recorder)
    module.launch_target = lambda device: TARGETS["sm_90"]
    try:
        launch()
    finally:
        setattr(module, kernel_name, kernel)
        module.launch_target = target
    return [(kernel, args, kwargs) for _, args, kwargs in recorder.calls]


def _signature(kernel, args, kwargs):
    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
    signature = {}
    for name, value in zip(kernel.arg_names, args):
        if isinstance(value, torch.Tensor):
            signature[name] = _POINTER[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}: argument {name}={value!r} has no signature type here")
    signature.update({name: "constexpr" for name in kwargs})
    return signature, kwargs, options


# Without --all: each switch of the code both ways, in five compiles (index into SPECS, cache kind,
# layout; the QK-norm kernel at the specs of the first two).
DEFAULT = ((0, torch.float8_e4m3fn, "HND"), (1, None, "NHD"), (2, torch.float8_e5m2, "NHD"), (3, None, "HND"))


def _launches_of(spec: RopeSpec, dtype, cache_dtypes, layouts, qk_norm: bool):
    tokens, d = 64, spec.head_size
    positions = torch.zeros((spec.num_dims, tokens) if spec.num_dims > 1 else (tokens,), dtype=torch.int64)
    cache = torch.empty(8, spec.rotary_dim, dtype=dtype)
    qkv = torch.empty(tokens, 12 * d, dtype=dtype)
    weight = torch.empty(d, dtype=dtype)
    if qk_norm:
        yield from _record(qk_norm_module, "_qk_norm_rope_kernel", lambda: qk_norm_module.launch_qk_norm_rope(
            spec, positions, qkv, 8, 2, weight, weight, 1e-6, cache))
    for cache_dtype in cache_dtypes:
        for layout in layouts:
            shape = (4, 16, 2, d) if layout == "NHD" else (4, 2, 16, d)
            key_cache = torch.empty(shape, dtype=cache_dtype or dtype)
            yield from _record(kv_cache_module, "_rope_kv_cache_kernel", lambda: kv_cache_module.launch_rope_kv_cache(
                spec, positions, qkv[:, :8 * d], qkv[:, 8 * d:10 * d], qkv[:, 10 * d:], key_cache, key_cache.clone(),
                torch.zeros(tokens, dtype=torch.int64), cache, kv_layout=layout, k_scale=0.5, v_scale=0.5))


MLA_SPEC = RopeSpec(64, 64, False, None)        # DeepSeek's rope part: 64 channels, GPT-J pairs


def _mla_launches(dtype, cache_dtypes):
    """The kernel's LATENT form (MLA): q [T, 16, 128 + 64] heads-major, kv_lora_rank 512."""
    tokens = 64
    q = torch.empty(16, tokens, 192, dtype=dtype).transpose(0, 1)
    kv_a = torch.empty(tokens, 576, dtype=dtype)
    for cache_dtype in cache_dtypes:
        kv_cache = torch.empty(4, 16, 576, dtype=cache_dtype or dtype)
        yield from _record(kv_cache_module, "_rope_kv_cache_kernel", lambda: kv_cache_module.launch_mla_rope_kv_cache(
            MLA_SPEC, torch.zeros(tokens, dtype=torch.int64), q[..., 128:], kv_a[:, 512:], kv_a[:, :512], kv_cache,
            torch.zeros(tokens, dtype=torch.int64), torch.empty(8, 64, dtype=dtype), scale=0.5))


def launches(every: bool):
    """(kernel, args, constexprs) of each launch: DEFAULT and MLA's bf16 and e4m3fn caches, or
    (``every``) each spec x dtype x cache kind x layout and MLA's dtypes x cache kinds."""
    if not every:
        for index, cache_dtype, layout in DEFAULT:
            yield from _launches_of(SPECS[index], torch.bfloat16, (cache_dtype,), (layout,), qk_norm=index in (1, 3))
        yield from _mla_launches(torch.bfloat16, (None, torch.float8_e4m3fn))
        return
    for spec in SPECS:
        for dtype in (torch.bfloat16, torch.float16):
            yield from _launches_of(spec, dtype, (None, torch.float8_e4m3fn, torch.float8_e5m2), ("NHD", "HND"), True)
    for dtype in (torch.bfloat16, torch.float16):
        yield from _mla_launches(dtype, (None, torch.float8_e4m3fn, torch.float8_e5m2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every combination of the table")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        parser.error("run with TRITON_INTERPRET=0: the interpreter replaces the kernels at import")
    target, seen, failed = GPUTarget("cuda", 90, 32), set(), 0
    for kernel, call_args, kwargs in launches(args.all):
        signature, constexprs, options = _signature(kernel, call_args, kwargs)
        key = (kernel.__name__, tuple(signature.items()), tuple(constexprs.items()))
        if key in seen:
            continue
        seen.add(key)
        start, record = time.perf_counter(), {"kernel": kernel.__name__, "constexprs": constexprs, "ok": True}
        try:
            triton.compile(triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=target, options=options)
        except Exception as error:          # the compiler's report is the result
            record.update(ok=False, error=f"{type(error).__name__}: {error}"[-2000:])
            failed += 1
        record["seconds"] = round(time.perf_counter() - start, 2)
        print(json.dumps(record, default=str), flush=True)
    print(json.dumps({"summary": {"compiled": len(seen), "failed": failed}}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
