"""FlashInfer's apply_rope_with_cos_sin_cache called directly (not through the property suite),
checked against the project's float64 reference (reference.rotate, rope.cache.cos_sin_cache).

1. ``--check``: the import (time, versions, optional stacks present), the first call (the JIT build
   of the rope module) and NeoX / GPT-J on 37 tokens, head 128, rotary 64 (lab/offline/flashinfer_gpu_check.sh
   runs this before the property tests).
2. An empty batch, float32 q/k, one token (errors printed).
3. ``--map OUT.json``: every head size the properties draw x every even rotary_dim x NeoX/GPT-J x
   bf16/fp16, measured (CUDA_LAUNCH_BLOCKING=1: a fault raises at its call) and set beside
   rope/backends/known_faults.py's predicates (fault / wrong / ok).  Shapes predicted to work or to
   be wrong run in one fresh process per head size (a fault poisons the CUDA context; a process
   that dies re-runs its shapes one per process); predicted faults are sampled (small and large
   rotary_dims, bf16), one process each.  Prints the disagreements; the JSON is what
   tests/backends/test_backends.py pins the predicates to.  (It replaced ``--sweep``, which gave
   lab/runs/flashinfer-probe-h200-2026-11-29.log: head 128 and whole heads only.)

On the GPU box, in flashinfer_gpu_check.sh's environment:

    (. lab/offline/flashinfer_gpu_check.sh; fi_env "$PWD"; python -m lab.bench.flashinfer_probe --map map.json)
"""
import json
import concurrent.futures as cf
import importlib.util
import os
import subprocess
import sys
import time

# FLASHINFER_PROBE_DEVICE=cpu runs the tool itself against a stub flashinfer package (a dry run here).
DEVICE = os.environ.get("FLASHINFER_PROBE_DEVICE", "cuda")

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
    cache = cos_sin_cache(spec, torch.float32, DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    pos = torch.randint(0, spec.max_position, (tokens,), device=DEVICE, generator=g)
    q = torch.randn(tokens, heads * head, device=DEVICE, dtype=dtype, generator=g)
    k = torch.randn(tokens, head, device=DEVICE, dtype=dtype, generator=g)
    try:
        qo, ko = flashinfer.rope.apply_rope_with_cos_sin_cache(pos, q, k, head, cache, is_neox=neox)
        if DEVICE == "cuda":
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


def _measured(what: str) -> str:
    if what == "ok":
        return "ok"
    if what.startswith("mismatch"):
        return "wrong"
    return "fault" if "misaligned" in what or "illegal" in what else what


def _predicted(head, rd, neox) -> str:
    from rope.backends.known_faults import flashinfer_expected
    from rope.spec import RopeSpec
    return flashinfer_expected(RopeSpec(head, rd, neox, None))


def _run_task(configs):
    """Shapes in one fresh process (python this_file --task JSON): [(head, rd, neox, dtype, what)],
    or one "worker died" row per shape when the process does not come back."""
    cmd = [sys.executable, os.path.abspath(__file__), "--task", json.dumps(configs)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode == 0:
        return [tuple(r) for r in json.loads(done.stdout.strip().splitlines()[-1])]
    return [(*c, f"worker died: exit {done.returncode}") for c in configs]


def fault_samples(head):
    return sorted({rd for rd in (2, 4, 6, 8, 10, 12, 14, 20, 24, 28, 40, head - 8, head - 4, head - 2)
                   if 2 <= rd <= head})


def map_shapes(out_path: str):
    from rope.harness.rotation.cases import HEAD_SIZES
    groups, singles = {}, []
    for head in sorted(HEAD_SIZES):
        for rd in range(2, head + 1, 2):
            for neox in (True, False):
                if _predicted(head, rd, neox) != "fault":
                    groups.setdefault(head, []).extend([head, rd, neox, dt] for dt in ("bfloat16", "float16"))
                elif rd in fault_samples(head):
                    singles.append([[head, rd, neox, "bfloat16"]])
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(_run_task, [*groups.values(), *singles]))
        died = [row[:4] for rows in results[:len(groups)] for row in rows
                if len(rows) > 1 and row[4].startswith("worker died")]
        rows = [row for rows in results for row in rows if not (len(rows) > 1 and row[4].startswith("worker died"))]
        rows += [row for rows in pool.map(_run_task, [[c] for c in died]) for row in rows]   # who killed it
    records = [{"head_size": h, "rotary_dim": rd, "style": "neox" if neox else "gptj", "dtype": dt,
                "measured": _measured(what), "detail": what, "predicted": _predicted(h, rd, neox)}
               for h, rd, neox, dt, what in sorted(rows)]
    bad = [r for r in records if r["measured"] != r["predicted"]
           and not (r["predicted"] == "race" and r["measured"] in ("wrong", "ok"))]
    counts = {k: sum(r["measured"] == k for r in records) for k in ("ok", "wrong", "fault")}
    print(f"map: {len(records)} shapes in {time.perf_counter() - t:.0f} s ({counts}); "
          f"{len(records) - len(bad)} as predicted, {len(bad)} not:", flush=True)
    for r in bad:
        print(f"  head {r['head_size']} rotary_dim {r['rotary_dim']} {r['style']} {r['dtype']}: "
              f"predicted {r['predicted']}, measured {r['detail']}", flush=True)
    import torch
    import flashinfer
    doc = {"flashinfer": flashinfer.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
           "tokens": 5, "q_heads": 2, "kv_heads": 1, "tolerance": 0.05, "records": records}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=0)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    if "--task" in sys.argv:                  # one process of --map: its shapes, as a JSON line
        rows = [(h, rd, neox, dt, one(h, rd, neox, dtype_name=dt)[3])
                for h, rd, neox, dt in json.loads(sys.argv[sys.argv.index("--task") + 1])]
        print(json.dumps(rows))
        sys.exit(0)
    if "--check" in sys.argv:
        check()
        sys.exit(0)
    one(128, 128, True)                       # builds / loads the module once in this process
    if "--map" in sys.argv:
        map_shapes(sys.argv[sys.argv.index("--map") + 1])
        sys.exit(0)
    edge_cases()
