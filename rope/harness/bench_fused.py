"""``rope-harness bench --fused``: the fused ops (docs/spec.md §10) raced against the unfused sequence
an engine runs without them and against the memory floor of their bytes.

Per model and token count: QK-norm + RoPE on a packed qkv (contract A) and RoPE + KV-cache write
(contract B, a bf16 cache and an FP8 e4m3fn one, NHD, block 16, every token slotted), by

* ``triton``: the project's fused kernels (rope/triton/fused_qk_norm_rope.py, rope_kv_cache.py);
* ``unfused``: torch's norm or cache write beside the project's rotation kernel, one launch after
  another (rope/triton/unfused.py): what the fused kernel saves;
* ``flashinfer``: FlashInfer's FP8 rope + paged append where it imports (B, FP8 caches, 1-D): it also
  quantizes q, so it moves fewer bytes than the contract's in-place q;
* ``flashinfer-unfused``: FlashInfer's own unfused pair where it imports (B, activation-dtype caches,
  1-D, heads of 64-512): its in-place rotation, then its paged append of k and v.

Each contender's result is first held to the float64 reference (rope.harness.fused.check, on a case of
the row's shape up to CHECK_TOKENS tokens); a failed check is reported and its time left out.  Every
contender of a row is timed the same way: launched from Python back to back, cycling through
enough input sets that each call finds its inputs in DRAM (rope.harness.bench.time_launched), device
events, the median of 7.  (The unfused cache write picks its slots on the host, so no contender is
captured in a CUDA graph here.)  Each row also gives every contender's host time per call
(rope.harness.bench.host_us_per_call): where it passes the timed figure, the call is host-bound.  The floor is the row's bytes at the copy bandwidth measured in the
same run: q and k read and written (A: every channel, the norm touches them all; B: the rotated
channels, with k's pass-through read for the cache), v read and the cache rows written (B), the cos
and sin rows, the positions and slots.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass

import torch

from rope.harness.bench import host_us_per_call, input_sets, time_launched
from rope.harness.fused.cases import CacheCase, QKNormCase, build_cache_case, build_qk_norm_case, model_spec
from rope.harness.fused.check import check_case
from rope.implementation import Implementation
from rope.models import load_models
from rope.registry import get_fused_implementation

__all__ = ["CHECK_TOKENS", "FUSED_MODELS", "FUSED_TOKENS", "FusedResult", "cache_write_bytes", "qk_norm_bytes",
           "run_fused"]

FUSED_MODELS = ("qwen2-7b", "qwen3-vl-8b", "glm-4.1v-9b")
FUSED_TOKENS = (1, 256, 4096, 16384)
CPU_FUSED_TOKENS = (1, 8)                 # off the GPU: the interpreter checks, nothing is timed
CHECK_TOKENS = 1024
CACHES = ("activation", "float8_e4m3fn")
SCALE = 0.3                               # FP8 caches: one scale for k and v (FlashInfer takes one)
BLOCK_SIZE = 16
OPS = ("qk_norm_rope", "rope_kv_cache")
CONTENDERS = ("triton", "unfused", "flashinfer", "flashinfer-unfused")


@dataclass
class FusedResult:
    op: str
    model: str
    tokens: int
    cache: str                  # "activation" or the FP8 dtype's name ("-" for QK-norm)
    impl: str
    ms: float
    bytes: int
    floor_ms: float             # the bytes at the run's copy bandwidth
    checked: str
    timing: str
    host_us: float = math.nan   # the host's time per call (GPU): where it passes ms, the row is host-bound


def qk_norm_bytes(case: QKNormCase) -> int:
    """q and k read and written (every channel), the two weights, the cos/sin rows, the positions."""
    spec, es = case.spec, torch.finfo(getattr(torch, case.dtype)).bits // 8
    heads = case.num_heads_q + case.num_heads_k
    return (2 * case.num_tokens * heads * spec.head_size * es + 2 * spec.head_size * es
            + case.num_tokens * spec.rotary_dim * es + case.num_tokens * spec.num_dims * 8)


def cache_write_bytes(case: CacheCase) -> int:
    """q's and k's rotated channels read and written, k's pass-through read, v read, the k and v cache
    rows written, the cos/sin rows, the positions and the slots."""
    spec, t = case.spec, case.num_tokens
    es = torch.finfo(getattr(torch, case.dtype)).bits // 8
    cache_es = es if case.cache == "activation" else 1
    d, r = spec.head_size, spec.rotary_dim
    rotated = 2 * t * (case.num_q_heads + case.num_kv_heads) * r * es
    reads = t * case.num_kv_heads * ((d - r) + d) * es
    writes = 2 * t * case.num_kv_heads * d * cache_es
    return rotated + reads + writes + t * r * es + t * spec.num_dims * 8 + t * 8


def _case(op: str, key: str, tokens: int, cache: str, seed: int = 0):
    model = load_models()[key]
    spec = model_spec(key)
    num_q, num_kv = model.sharded(1)
    if op == "qk_norm_rope":
        return QKNormCase(spec=spec, num_tokens=tokens, num_heads_q=num_q, num_heads_k=num_kv, num_heads_v=num_kv,
                          dtype="bfloat16", eps=1e-6, row_padding=0, positions_kind="uniform", seed=seed)
    return CacheCase(spec=spec, num_tokens=tokens, num_q_heads=num_q, num_kv_heads=num_kv, dtype="bfloat16",
                     cache=cache, layout="NHD", block_size=BLOCK_SIZE, num_blocks=-(-tokens // BLOCK_SIZE), padding=0.0,
                     short_slots=0, scale_as_tensor=False, k_scale=SCALE, v_scale=SCALE, packed=True,
                     joint_cache=False, positions_kind="uniform", seed=seed)


def _bound_call(op: str, fn, case, device: str):
    """The op's call of ``fn`` on a fresh input set of ``case``, bound: a function of no arguments."""
    if op == "qk_norm_rope":
        x = build_qk_norm_case(case, device)
        return lambda: fn(case.spec, x.positions, x.qkv, case.num_heads_q, case.num_heads_k, case.num_heads_v,
                          x.q_weight, x.k_weight, case.eps, x.cos_sin_cache)
    x = build_cache_case(case, device)
    return lambda: fn(case.spec, x.positions, x.query, x.key, x.value, x.key_cache, x.value_cache, x.slot_mapping,
                      x.cos_sin_cache, kv_layout=case.layout, k_scale=x.k_scale, v_scale=x.v_scale)


def _contenders(op: str, progress) -> dict:
    found = {}
    for name in CONTENDERS:
        try:
            fn = get_fused_implementation(name, op)
        except (ImportError, ValueError) as exc:
            progress(f"  fused {op}: not raced: {name}: {str(exc).splitlines()[0][:160]}")
            continue
        if fn is not None:
            found[name] = fn
    return found


def _checked(op: str, fn, case, device: str) -> str:
    """"ok" or why not: the contender's result held to the reference on the row's shape (at most
    CHECK_TOKENS tokens)."""
    shape = case if case.num_tokens <= CHECK_TOKENS else _resized(case, CHECK_TOKENS)
    try:
        result = check_case(op, fn, shape, device)
    except Exception as exc:        # noqa: BLE001 - a contender that raises is reported, the race goes on
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return "ok" if result.ok else "FAILED: " + result.problems[0][:160]


def _resized(case, tokens: int):
    if isinstance(case, CacheCase):
        return dataclasses.replace(case, num_tokens=tokens, num_blocks=-(-tokens // case.block_size))
    return dataclasses.replace(case, num_tokens=tokens)


def run_fused(models=None, tokens=None, device: str = "cuda", copy_gbps: float = math.nan, progress=print,
              only=CONTENDERS) -> list[dict]:
    """Race the fused ops' contenders (``only``) on ``models`` x ``tokens`` (None: the device's
    defaults); ``copy_gbps``: the run's copy bandwidth, the floor's.  Off the GPU the Triton kernels
    run under the interpreter: each row is checked at CPU_FUSED_TOKENS sizes, not timed."""
    gpu = device in ("cuda", "rocm")
    models = FUSED_MODELS if models is None else models
    tokens = (FUSED_TOKENS if gpu else CPU_FUSED_TOKENS) if tokens is None else tokens
    results: list[FusedResult] = []
    for op in OPS:
        contenders = {n: fn for n, fn in _contenders(op, progress).items() if n in only}
        for key in models:
            for t in tokens:
                for cache in (("-",) if op == "qk_norm_rope" else CACHES):
                    case = _case(op, key, t, cache)
                    nbytes = qk_norm_bytes(case) if op == "qk_norm_rope" else cache_write_bytes(case)
                    floor = nbytes / (copy_gbps * 1e9) * 1e3 if copy_gbps == copy_gbps else math.nan
                    row: dict[str, FusedResult] = {}
                    for name, fn in contenders.items():
                        reason = Implementation.of(name, fn, "fused").unsupported_reason
                        why = reason(case, device) if reason is not None else None
                        if why:
                            continue
                        checked = _checked(op, fn, case, device)
                        ms, how = math.nan, "interpreter: checked, not timed"
                        if gpu and checked == "ok":
                            sets = input_sets(device, nbytes, t)
                            calls = [_bound_call(op, fn, case if i == 0 else _reseeded(case, i), device)
                                     for i in range(sets)]
                            ms, how = time_launched(calls)
                            del calls
                        elif gpu:
                            how = "not timed: its check failed"
                        row[name] = FusedResult(op, key, t, cache, name, ms, nbytes, floor, checked, how)
                    timed = {n: _bound_call(op, contenders[n], case, device) for n, r in row.items() if r.ms == r.ms}
                    for name, us in (host_us_per_call(timed, device) if timed else {}).items():
                        row[name].host_us = us
                    for r in row.values():
                        results.append(r)
                        shown = f"{r.ms * 1e3:9.1f} us, host {r.host_us:6.1f} us" if r.ms == r.ms else f"({r.timing})"
                        progress(f"  fused {op:<13} {key:<14} {t:>6} {cache:<14} {r.impl:<10} {shown} "
                                 f"floor {floor * 1e3:8.1f} us  {r.checked}")
    return [asdict(r) for r in results]


def _reseeded(case, seed: int):
    return dataclasses.replace(case, seed=seed)
