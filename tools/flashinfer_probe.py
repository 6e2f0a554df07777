"""Edge cases of FlashInfer's apply_rope_with_cos_sin_cache, called directly (not through the
harness), to pin what the property suite reports on the GPU box.

1. An empty batch, float32 q/k, one token (one process, errors printed).
2. ``--sweep [--all] [--dtype float16]``: even rotary dims of a head of 128 (every one with
   ``--all``) and whole-head rotary for the harness's other head sizes, NeoX and GPT-J, bf16 unless
   told otherwise, each call in a fresh process with
   CUDA_LAUNCH_BLOCKING=1 (a kernel fault poisons the CUDA context), compared with a float32
   torch rotation: ok / mismatch / the error.

Run after tools/flashinfer_gpu_check.sh has built the module (same environment):

    (. tools/flashinfer_gpu_check.sh; fi_env "$PWD"; python3 tools/flashinfer_probe.py --sweep)
"""
import concurrent.futures as cf
import multiprocessing
import os
import sys


def rotate(positions, x, head_size, cache, neox):   # float32 reference, channels past rotary_dim pass
    import torch
    x = x.float().view(x.shape[0], -1, head_size)
    rd = cache.shape[1]
    cos, sin = (c[:, None, :] for c in cache[positions].chunk(2, dim=-1))
    rot = x[..., :rd]
    if neox:
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((out, x[..., rd:]), dim=-1).flatten(1)


def one(head, rd, neox, tokens=5, heads=2, dtype_name="bfloat16"):
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    import torch
    import flashinfer.rope
    dtype = getattr(torch, dtype_name)
    L = 64
    g = torch.Generator(device="cuda").manual_seed(0)
    inv = 1.0 / 10000 ** (torch.arange(0, rd, 2, device="cuda", dtype=torch.float32) / rd)
    ang = torch.arange(L, device="cuda", dtype=torch.float32)[:, None] * inv
    cache = torch.cat((ang.cos(), ang.sin()), dim=-1)
    pos = torch.randint(0, L, (tokens,), device="cuda", generator=g)
    q = torch.randn(tokens, heads * head, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(tokens, head, device="cuda", dtype=dtype, generator=g)
    try:
        qo, ko = flashinfer.rope.apply_rope_with_cos_sin_cache(pos, q, k, head, cache, is_neox=neox)
        torch.cuda.synchronize()
    except Exception as exc:
        return (head, rd, neox, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    err = max((qo.float() - rotate(pos, q, head, cache, neox)).abs().max().item(),
              (ko.float() - rotate(pos, k, head, cache, neox)).abs().max().item())
    return (head, rd, neox, "ok" if err < 0.05 else f"mismatch (max |diff| {err:.3g})")


def edge_cases():
    import torch
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
    one(128, 128, True)                       # builds / loads the module once in this process
    edge_cases()
    if "--sweep" in sys.argv:
        sweep(sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "bfloat16")
