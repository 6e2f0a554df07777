"""Compile the project's Triton kernels for NVIDIA, AMD and Intel GPUs on a machine that has none.

The CPU runs every kernel under the Triton interpreter, which executes the Python of a kernel
body: it accepts programs the compiler refuses (a name bound to tiles of two shapes in the two
arms of an ``if``, a constexpr used as a runtime value, ...).  Such a kernel passes the whole
CPU suite and fails its first launch on a GPU.  This module records the launches the launchers
make for a target (the launcher's own arguments, grid and constexprs, the kernel call intercepted,
the launcher told which target it launches for: rope/triton/targets.py) and hands each distinct one
to ``triton.compile`` for that target, with no driver: sm_90 (Triton's front end, its optimizer,
the PTX backend and ptxas), AMD gfx942 (MI300X) and gfx90a (MI250X) (the AMDGPU backend and its
linker, both inside Triton's wheel), and Intel XPU where Intel's Triton (``triton-xpu``) is the
Triton installed.

Run it in a process of its own with TRITON_INTERPRET=0 (the interpreter takes over
``@triton.jit`` at import time)::

    TRITON_INTERPRET=0 python -m tests.kernels.compile_offline [--target sm_90|gfx942|gfx90a|xpu] [--all-options] [--models A,B] [--substitute SUBS.json]

One JSON line per compiled launch; exit 1 if any failed.  ``--substitute`` applies
[[old, new], ...] to the rotation kernel's modules first (rope/triton/rotary_kernel.py, rotary_plan.py,
rotary.py: each pair to the one it matches, as properties/mutants/kernel.py does), and launches
the patched kernel (tests/kernels/test_kernel_compiles.py shows with it that a kernel the
interpreter runs, and the compiler refuses, is caught).
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

from rope.models import load_models
from rope.triton.targets import TARGETS

# Intel Data Center GPU Max (Ponte Vecchio) as Intel's backend describes a device: SYCL's architecture
# number of intel_gpu_pvc and the properties its code generation reads (what a driver would report).
PVC = {"architecture": 0x030F000700, "name": "Intel(R) Data Center GPU Max 1550", "sub_group_sizes": [16, 32],
       "max_work_group_size": 1024, "max_num_sub_groups": 64, "has_fp64": True, "has_subgroup_2d_block_io": True,
       "has_subgroup_matrix_multiply_accumulate": True, "has_bfloat16_conversions": True}
# Triton's own name of each target of rope.triton.targets.TARGETS.
COMPILE_TARGETS = {"sm_90": lambda: GPUTarget("cuda", 90, 32), "gfx942": lambda: GPUTarget("hip", "gfx942", 64),
                   "gfx90a": lambda: GPUTarget("hip", "gfx90a", 64), "pvc": lambda: GPUTarget("xpu", PVC, 32)}
# Launches per model: the launcher's defaults in each band of rope.triton.rotary_plan._default_tile (decode,
# the small-batch grid's 8-head programs, the one-wave tiles on either side of their program-count
# switch, the per-lane gather's 4-token tiles, a large prefill), and the options a sweep may pick
# (test_launch_options.py holds their bits).
TOKENS = (1, 64, 128, 256, 4096, 65536)
OPTIONS = ({"split_qk": False}, {"gather_3d": False}, {"heads_fastest": False},
           {"bf16_rounding": "by_hand"}, {"block_h": 16, "block_hk": 1, "block_t": 1}, {"cache_offsets_64": True},
           {"positions_before_wait": True}, {"speculate_positions": True, "cache_offsets_64": True},
           {"speculate_positions": False})
# The models whose launches also compile with every one of OPTIONS (``--all-options``: every model):
# interleaved NeoX with 4 key heads, partial GPT-J with 2 (the defaults cover chunked and XD-RoPE).
OPTION_MODELS = ("qwen3-vl-30b-a3b", "glm-4.1v-9b")
_POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32",
            torch.int64: "*i64", torch.int32: "*i32"}
_COMPILE_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "launch_pdl")


class _Recorder:
    """Stands in for a JITFunction: ``kernel[grid](*args, **kwargs)`` records instead of launching."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def launch_signature(fn, args, kwargs):
    """Triton's signature and constexprs for one recorded call, and the compile options."""
    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in _COMPILE_OPTIONS if k in kwargs}
    signature, constexprs = {}, {}
    for name, value in zip(fn.arg_names, args):
        if isinstance(value, torch.Tensor):
            signature[name] = _POINTER[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        else:
            raise TypeError(f"{fn.__name__}: argument {name}={value!r} has no signature type here")
    for name, value in kwargs.items():
        signature[name] = "constexpr"
        constexprs[name] = value
    return signature, constexprs, options


def record_launches(module, kernel_name: str, launch, target="sm_90") -> list:
    """The kernel calls ``launch()`` makes for ``target`` (a key of rope.triton.targets.TARGETS, or
    a Target), with the module's kernel intercepted."""
    kernel = getattr(module, kernel_name)
    recorder = _Recorder()
    saved = {name: getattr(module, name) for name in (kernel_name, "launch_target")}
    setattr(module, kernel_name, recorder)
    module.launch_target = lambda device: TARGETS[target] if isinstance(target, str) else target
    try:
        launch()
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
    return [(kernel,) + call for call in recorder.calls]


def rotation_launches(rotary, all_options: bool = False, models=None, target: str = "sm_90",
                      defaults_only: bool = False):
    """(label, kernel, grid, args, kwargs): every model's defaults at TOKENS, bf16 (fp32 and fp16 too at
    one model), and OPTIONS at OPTION_MODELS (every model with ``all_options``; none with
    ``defaults_only``), launched for ``target``."""
    table = load_models()
    unknown = set(models or ()) - set(table)
    if unknown:
        raise ValueError(f"models: {sorted(unknown)} are not in rope/models.yaml")
    for name, model in table.items():
        if models and name not in models:
            continue
        spec = model.spec
        num_q, num_kv = model.sharded(1)
        dtypes = (torch.bfloat16, torch.float32, torch.float16) if name == "qwen2.5-vl-72b" else (torch.bfloat16,)
        cache = torch.empty(8, spec.rotary_dim, dtype=torch.bfloat16)
        for dtype in dtypes:
            for tokens in TOKENS:
                positions = torch.zeros((spec.num_dims, tokens) if spec.num_dims > 1 else (tokens,), dtype=torch.int64)
                query = torch.empty(tokens, num_q * spec.head_size, dtype=dtype)
                key = torch.empty(tokens, num_kv * spec.head_size, dtype=dtype)
                with_options = not defaults_only and (all_options or name in OPTION_MODELS)
                for options in ({},) + (OPTIONS if with_options else ()):
                    label = f"{name} {str(dtype)[6:]} {tokens} tokens {options or 'defaults'}"
                    calls = record_launches(rotary, "_rotary_kernel", lambda: rotary.launch_rotary(
                        spec, positions, query, key, cache.to(dtype), **options), target)
                    for call in calls:
                        yield (label,) + call


def position_launches(positions_module, target: str = "sm_90"):
    """The position kernel at one decode step of 3 requests and one 40-token prefill chunk, with and without PDL."""
    for label, lens in (("3 decodes", (1, 1, 1)), ("one 40-token chunk", (40,))):
        n = len(lens)
        starts = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
        args = dict(prefill_positions=torch.zeros(3 * 4, 64, dtype=torch.int32),
                    prefill_delta=torch.zeros(4, dtype=torch.int32), idx_mapping=torch.arange(n, dtype=torch.int32),
                    query_start_loc=starts, prefill_lens=torch.full((4,), 64, dtype=torch.int32),
                    num_computed_tokens=torch.zeros(4, dtype=torch.int32), num_dims=3,
                    out=torch.empty(3, int(starts[-1]), dtype=torch.int64))
        for pdl in (True, False):
            calls = record_launches(positions_module, "_prepare_positions_kernel",
                            lambda: positions_module.launch_prepare_positions(**args, pdl=pdl), target)
            for call in calls:
                yield (f"positions: {label}, pdl={pdl}",) + call


def compile_all(launches, target: str = "sm_90"):
    """Compile each distinct (kernel, signature, constexprs, options) once for ``target``; yield one
    record per compile."""
    gpu_target = COMPILE_TARGETS[target]()
    seen = set()
    for label, kernel, _grid, args, kwargs in launches:
        signature, constexprs, options = launch_signature(kernel, args, kwargs)
        key = (kernel.__name__, tuple(signature.items()), tuple(constexprs.items()), tuple(sorted(options.items())))
        if key in seen:
            continue
        seen.add(key)
        start = time.perf_counter()
        record = {"launch": label, "kernel": kernel.__name__, "target": target, "constexprs": constexprs,
                  "options": options}
        try:
            triton.compile(triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=gpu_target, options=options)
            record["ok"] = True
        except Exception as error:          # the compiler's report is the result
            record["ok"] = False
            record["error"] = f"{type(error).__name__}: {error}"[-2000:]
        record["seconds"] = round(time.perf_counter() - start, 2)
        yield record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--substitute", help="JSON file: [[old, new], ...] applied to the rotation kernel's modules "
                        "(rope/triton/rotary_kernel.py, rotary_plan.py, rotary.py)")
    parser.add_argument("--rotation-only", action="store_true", help="skip the position kernel")
    parser.add_argument("--all-options", action="store_true", help="every model with every option (about 190 compiles)")
    parser.add_argument("--models", help="comma-separated model keys (default: every model of rope/models.yaml)")
    parser.add_argument("--target", default="sm_90", choices=sorted(COMPILE_TARGETS),
                        help="the GPU to compile for (default sm_90)")
    parser.add_argument("--defaults-only", action="store_true",
                        help="the launchers' default launches only, none of the options a caller may pass")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        parser.error("run with TRITON_INTERPRET=0: the interpreter replaces the kernels at import")
    if args.target == "pvc":
        # Intel's backend builds a small C++ helper with $CC, found as the C compiler: g++ links its
        # C++ runtime, gcc leaves it unresolved.
        os.environ.setdefault("CC", "g++")
    import rope.triton.positions as positions_module
    import rope.triton.rotary as rotary
    if args.substitute:
        from rope.harness.mutation.kernel_mutant import KernelMutant
        with open(args.substitute) as f:
            substitutions = [tuple(pair) for pair in json.load(f)]
        rotary = KernelMutant("substituted", rotary, "rotate_triton", substitutions, "").module
    models = args.models.split(",") if args.models else None
    launches = list(rotation_launches(rotary, args.all_options, models, args.target, args.defaults_only))
    if not args.rotation_only:
        launches += list(position_launches(positions_module, args.target))
    failed = compiled = 0
    for record in compile_all(launches, args.target):
        failed += not record["ok"]
        compiled += 1
        print(json.dumps(record, default=str), flush=True)
    # What was recorded, before duplicates were dropped (a model whose launches equal another's compiles nothing new).
    print(json.dumps({"summary": {"target": args.target, "launches": len(launches), "compiled": compiled, "failed": failed,
                                  "launched": sorted({launch[0].split(" ")[0] for launch in launches})}}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
