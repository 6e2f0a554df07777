"""FlashInfer's apply_rope_with_cos_sin_cache called directly (not through the property suite),
checked against the project's float64 reference (reference.rotate, rope.cache.cos_sin_cache).

1. ``--check``: the import (time, versions, optional stacks present), the first call (the JIT build
   of the rope module) and NeoX / GPT-J on 37 tokens, head 128, rotary 64 (tools/flashinfer_gpu_check.sh
   runs this before the property tests).
2. An empty batch, float32 q/k, one token (errors printed).
3. ``--sweep [--all] [--dtype float16]``: even rotary dims of a head of 128 (every one with
   ``--all``) and whole-head rotary for the harness's other head sizes, NeoX and GPT-J, bf16 unless
   told otherwise, each call in a fresh process with CUDA_LAUNCH_BLOCKING=1 (a kernel fault poisons
   the CUDA context): ok / mismatch / the error.

On the GPU box, in flashinfer_gpu_check.sh's environment:

    (. tools/flashinfer_gpu_check.sh; fi_env "$PWD"; python3 tools/flashinfer_probe.py --sweep)
"""
import concurrent.futures as cf
import importlib.util
import multiprocessing
import os
import sys
import time


def one(head, rd, neox, tokens=5, heads=2, dtype_name="bfloat16", tolerance=0.05):
    """One call of FlashInfer on fresh inputs: (head, rd, neox, "ok" | "mismatch (...)" | "error: ...")."""
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    import torch
    import flashinfer.rope
    import reference
    from rope.cache import cos_sin_cache
    from rope.spec import RopeSpec
    dtype = getattr(torch, dtype_name)
    spec = RopeSpec(head, rd, neox, None, max_position=64)
    cache = cos_sin_cache(spec, torch.float32, "cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    pos = torch.randint(0, spec.max_position, (tokens,), device="cuda", generator=g)
    q = torch.randn(tokens, heads * head, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(tokens, head, device="cuda", dtype=dtype, generator=g)
    try:
        qo, ko = flashinfer.rope.apply_rope_with_cos_sin_cache(pos, q, k, head, cache, is_neox=neox)
        torch.cuda.synchronize()
    except Exception as exc:
        return (head, rd, neox, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    ref_q, ref_k = reference.rotate(spec, pos, q, k, cache)
    err = max((qo.double() - ref_q).abs().max().item(), (ko.double() - ref_k).abs().max().item())
    return (head, rd, neox, "ok" if err < tolerance else f"mismatch (max |diff| {err:.3g})")


def check():
    t = time.perf_counter()
    import flashinfer.jit.env
    import flashinfer.rope
    import torch
    import tvm_ffi
    print(f"(a) import flashinfer.rope: {time.perf_counter() - t:.1f} s; flashinfer {flashinfer.__version__} from "
          f"{os.path.dirname(flashinfer.__file__)}, tvm_ffi {tvm_ffi.__version__}, torch {torch.__version__}, "
          f"python {sys.version.split()[0]}", flush=True)
    for mod in ("cutlass", "cuda.tile", "cudnn"):      # optional stacks the trimmed tree assumes absent
        try:
            if importlib.util.find_spec(mod):
                print(f"    note: {mod} is importable here; flashinfer may import modules .fi left out")
        except ModuleNotFoundError:
            pass
    t = time.perf_counter()
    for neox in (True, False):
        head, rd, neox, what = one(128, 64, neox, tokens=37, heads=4, tolerance=3e-2)
        if neox:
            print(f"(b) first call (JIT build of rope for sm_90a + load + run): {time.perf_counter() - t:.1f} s -> "
                  f"{flashinfer.jit.env.FLASHINFER_JIT_DIR}/rope/rope.so", flush=True)
        print(f"    is_neox={neox}: {what} (bf16 output against the float64 reference, tolerance 3e-2)", flush=True)
        assert what == "ok", what


def edge_cases():
    for tokens, dtype in ((0, "bfloat16"), (0, "float32"), (3, "float32"), (1, "bfloat16")):
        print(f"tokens={tokens} {dtype}: {one(64, 64, True, tokens=tokens, dtype_name=dtype)[3]}", flush=True)


def sweep(dtype_name: str = "bfloat16"):
    dims = range(2, 129, 2) if "--all" in sys.argv else (2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 64, 96, 128)
    configs = [(128, rd, neox) for rd in dims for neox in (True, False)]
    configs += [(h, h, neox) for h in (8, 16, 32, 80, 96, 112, 160, 192, 256) for neox in (True, False)]
    results = []
    with cf.ProcessPoolExecutor(max_workers=16, max_tasks_per_child=1,
                                mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(one, *c, dtype_name=dtype_name): c for c in configs}
        for fut in cf.as_completed(futures):
            try:
                results.append(fut.result())
            except Exception as exc:          # the worker died (e.g. a fatal CUDA error)
                results.append((*futures[fut], f"worker died: {type(exc).__name__}"))
    results.sort()
    bad = [r for r in results if r[3] != "ok"]
    print(f"{dtype_name}: {len(results)} configurations, {len(results) - len(bad)} ok; not ok:", flush=True)
    for head, rd, neox, what in bad:
        print(f"  head {head} rotary_dim {rd} {'neox' if neox else 'gptj'}: {what}", flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
        sys.exit(0)
    one(128, 128, True)                       # builds / loads the module once in this process
    edge_cases()
    if "--sweep" in sys.argv:
        sweep(sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "bfloat16")
