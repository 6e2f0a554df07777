"""Known faults of external implementations: shapes on which the external code crashes the process
or its device context (a CUDA fault poisons every later CUDA call of the process), measured on real
hardware.  An adapter declares its predicate (``declare(..., fault=...)``); the registry reports a
faulting combination the way it reports an unsupported one, with "known fault" in the reason, so the
properties draw around it (the rejections are listed in the run report) instead of taking the
worker down with the first fault.  Each entry names where it was measured; the reproducer runs the
shapes in fresh processes.  Kept apart from the adapters so the predicates import (and are tested)
without the external package.
"""

from __future__ import annotations

import torch

from rope import row_maps
from rope.spec import RopeSpec


# FlashInfer 0.7.4's apply_rope_with_cos_sin_cache (csrc/rope.cu -> include/flashinfer/pos_enc.cuh,
# BatchQKApplyRotaryPosIdsCosSinCache): head sizes 64, 128, 256 and 512 take the head-specialised
# kernel with vec_size = max(8, head_size / 32) channels per thread (2-byte dtypes); every other head
# size is routed to RopeQuantizeKernel with vec_size = 16.  A thread rotates its vec_size consecutive
# channels as one unit:
#   NeoX:  it loads its partner vector at +-rotary_dim/2 and picks the sign once per thread, so a
#          vector that straddles the half boundary mixes the halves: wrong, deterministically,
#          unless rotary_dim/2 is a multiple of vec_size;
#   GPT-J: the pairs stay inside a vector, but the last vector always covers vec_size channels, so
#          unless rotary_dim is a multiple of vec_size it writes rotated garbage (cos/sin read past
#          the half) over the 8 channels after rotary_dim: pass-through channels that another block
#          copies at the same time, or the next head's first channels (past the end of the output
#          for the last head of the last token).  A write-write race: the H200 map measured it
#          wrong for rotary_dim 8, 24, head-24 and head-8 and right (the copy landed last) between.
# A vector load at an offset that is not a multiple of 16 bytes faults instead (flashinfer_fault).
# Measured on an H200: tests/backends/data/flashinfer-map-h200-2026-11-29.json (lab/bench/flashinfer_probe.py
# --map), pinned against these predicates by tests/backends/test_backends.py.
FLASHINFER_HEAD_KERNEL_SIZES = (64, 128, 256, 512)


def flashinfer_vec_size(head_size: int) -> int:
    """Channels one thread of FlashInfer 0.7.4's rope kernel rotates as a unit (float16/bfloat16)."""
    return max(8, head_size // 32) if head_size in FLASHINFER_HEAD_KERNEL_SIZES else 16


def flashinfer_fault(spec: RopeSpec, dtype: torch.dtype, device: str) -> str | None:
    """FlashInfer 0.7.4 ``apply_rope_with_cos_sin_cache`` on an H200 (lab/bench/flashinfer_probe.py
    --map): a CUDA misaligned-address fault unless rotary_dim is a multiple of 16 (NeoX: the partner
    vector at rotary_dim/2 must start on 16 bytes) or 8 (GPT-J: the sin half of the float32 cache row)."""
    if spec.rotary_dim % (16 if spec.is_neox_style else 8):
        return (f"CUDA misaligned-address fault when rotary_dim is not a multiple of "
                f"{16 if spec.is_neox_style else 8} ({'NeoX' if spec.is_neox_style else 'GPT-J'}; rotary_dim "
                f"{spec.rotary_dim}); reproduce with python -m lab.bench.flashinfer_probe in the repository")
    return None


FLASHINFER_STRADDLE = "straddle"      # NeoX: wrong every time
FLASHINFER_RACE = "race"              # GPT-J: garbage written past rotary_dim, racing another write


def flashinfer_wrong(spec: RopeSpec) -> str | None:
    """Why FlashInfer 0.7.4 returns wrong values on ``spec`` without faulting (float16 and bfloat16
    alike), or None: the unit a thread rotates (rotary_dim/2 for NeoX, rotary_dim for GPT-J) is not
    a multiple of its vec_size.  Only head sizes routed to RopeQuantizeKernel (vec_size 16) get here:
    NeoX with rotary_dim an odd multiple of 16 (FLASHINFER_STRADDLE: heads 16, 80, 112 whole; 48 of
    96), GPT-J with an odd multiple of 8 (FLASHINFER_RACE: 8 of 32; the value depends on timing)."""
    if flashinfer_fault(spec, torch.bfloat16, "cuda"):
        return None
    unit = spec.rotary_dim // 2 if spec.is_neox_style else spec.rotary_dim
    if unit % flashinfer_vec_size(spec.head_size) == 0:
        return None
    return FLASHINFER_STRADDLE if spec.is_neox_style else FLASHINFER_RACE


def flashinfer_expected(spec: RopeSpec) -> str:
    """What a call on ``spec`` is expected to do: "fault", "wrong" (NeoX straddle), "race" (wrong or
    right by timing) or "ok" (the classes of the H200 map and of lab/bench/flashinfer_probe.py --map)."""
    if flashinfer_fault(spec, torch.bfloat16, "cuda"):
        return "fault"
    why = flashinfer_wrong(spec)
    return "race" if why == FLASHINFER_RACE else "wrong" if why else "ok"


# FlashInfer 0.7.4's fused rope_quantize_fp8_append_paged_kv_cache (csrc/rope.cu ->
# include/flashinfer/pos_enc.cuh, RopeQuantizeAppendPagedKVCacheKernel) has no head-specialised
# path: every head size runs vec_size = 32 bytes / 2 = 16 channels per thread (float16/bfloat16),
# and a thread rotates its 16 consecutive rope channels as one unit, NeoX picking its partner vector
# at +-rope_dim/2 and the sign once per thread, as the unfused RopeQuantizeKernel above does.  Its
# own check asks for rope_dim a multiple of 16 only, so NeoX with rope_dim an odd multiple of 16
# (16, 48, 80, 112) passes it and straddles: the vector [16k, 16k + 16) that holds the half boundary
# takes the first half's sign (and its partner's loads) for all 16 channels, and the cos/sin rows are
# read at the same shifted offsets.  GPT-J pairs stay inside a vector.  The same for the MLA form
# (rope_dim is q_pe's width).  Measured on the H100 through the harness (docs/findings.md, "FlashInfer's
# fused FP8 rope + paged append"); pinned by tests/backends/test_flashinfer_fused.py on a GPU.
FLASHINFER_FUSED_VEC = 16


def flashinfer_fused_straddle(spec: RopeSpec) -> str | None:
    """Why FlashInfer 0.7.4's fused FP8 rope + paged append answers wrongly on ``spec`` (NeoX with
    rotary_dim / 2 not a multiple of its 16-channel vector), or None."""
    if not spec.is_neox_style or (spec.rotary_dim // 2) % FLASHINFER_FUSED_VEC == 0:
        return None
    return (f"known defect: FlashInfer's fused rope + append rotates 16 channels per thread as a unit and "
            f"NeoX's half boundary at {spec.rotary_dim // 2} falls inside one (rotary_dim {spec.rotary_dim}; "
            f"wrong values, docs/findings.md)")


# Shapes measured wrong on the H200 every time they ran (bf16 and fp16; the probe, the map and the
# property runs; max |diff| in bf16), pinned through the harness by
# test_backend_known_wrong_shapes_still_mismatch.
FLASHINFER_WRONG_SHAPES = (
    # (head_size, rotary_dim, is_neox_style)
    (16, 16, True),      # 4.99e30: the straddling vector reads past the row
    (80, 80, True),      # 1.53e38
    (112, 112, True),    # 2.3e33
    (96, 48, True),      # 1.85: freqs 0-7 of the second half (property run, case 8515e31ffe5c36a6)
    (8, 8, False),       # 3.77: the vector covers the next head
    (32, 8, False),      # 1.92: pass-through channels 8-15 rotated (property run, case 1afb378aa6ab428d)
)


def sglang_triton_fault(spec: RopeSpec, dtype: torch.dtype, device: str) -> str | None:
    """SGLang 0.5.23 ``_triton_mrope_forward_fused`` on a GPU: its interleaved branch loads cos/sin for
    the padding lanes [rotary_dim/2, next_power_of_2(head_size)/2) (docs/upstream-sglang-mrope-padding-
    lanes.md); at the last cache rows those loads run past the cache allocation.  On an H200 the
    qwen35 trigger and the suite's interleaved draws ended in a CUDA illegal-address fault (the
    interpreter's memory tracer pins the same reads on the CPU: tests/backends/regressions/
    sglang-triton).  The GLM round-robin branch (``mrope_interleaved_glm``, which sets
    ``mrope_interleaved`` too) loads its axis map for those lanes unmasked as well, then cos/sin at
    the rows it finds there (pinned the same way)."""
    if not str(device).startswith(("cuda", "rocm")) or spec.layout not in ("interleaved", "glm_round_robin"):
        return None
    padded = 1 << max(0, spec.head_size - 1).bit_length()
    if padded <= spec.rotary_dim:
        return None
    return (f"CUDA illegal-address fault: the {spec.layout} branch reads cos/sin for padding lanes "
            f"{spec.rotary_dim // 2}..{padded // 2 - 1} past the cache row (head {spec.head_size}, rotary_dim "
            f"{spec.rotary_dim}; docs/upstream-sglang-mrope-padding-lanes.md)")


# Known defects: calls an adapter claims that the external code answers wrongly or raises on,
# measured and pinned (tests/backends/test_backends.py, tests/backends/regressions/).  The suite
# checks them like any call (so a fix upstream shows); ``--rope-known-defects avoid`` draws around
# them, for a long run that is to find what is not known yet.

# A defect predicate: defect(spec, num_tokens, dtype, device, *, num_heads, num_kv_heads) -> why or None.

def empty_batch_raises(what: str, *, when=None):
    """The defect of code that does ``query.view(num_tokens, -1, head_size)`` before its kernel: with
    0 tokens the -1 is ambiguous and it raises ("cannot reshape tensor of 0 elements").
    ``when(spec)``: the specs whose path does so (None: every spec)."""
    def defect(spec: RopeSpec, num_tokens: int, dtype: torch.dtype, device: str, *, num_heads: int,
               num_kv_heads: int) -> str | None:
        if num_tokens or (when is not None and not when(spec)):
            return None
        return f"{what} raises on 0 tokens (view(num_tokens, -1, head_size) cannot infer -1)"
    return defect


def flashinfer_defect(spec: RopeSpec, num_tokens: int, dtype: torch.dtype, device: str, *, num_heads: int,
                      num_kv_heads: int) -> str | None:
    """FlashInfer 0.7.4 ``apply_rope_with_cos_sin_cache``: wrong values on the shapes of
    :func:`flashinfer_wrong`, and a raise on 0 tokens."""
    why = flashinfer_wrong(spec)
    if why is not None:
        what = ("straddles the rotary half" if why == FLASHINFER_STRADDLE
                else "runs past rotary_dim, racing another write")
        return (f"wrong values: a thread's vector {what} (head {spec.head_size}, rotary_dim {spec.rotary_dim}; "
                f"docs/upstream-flashinfer-rope-shapes.md)")
    return empty_batch_raises("apply_rope_with_cos_sin_cache")(spec, num_tokens, dtype, device, num_heads=num_heads,
                                                               num_kv_heads=num_kv_heads)


def sglang_native_glm_map(spec: RopeSpec, num_tokens: int, dtype: torch.dtype, device: str, *, num_heads: int,
                          num_kv_heads: int) -> str | None:
    """SGLang 0.5.23 ``MRotaryEmbedding.forward_native`` (and ``get_cos_sin_with_position``) with
    ``mrope_interleaved_glm``: it applies the interleaved rule whenever ``mrope_interleaved`` is set
    and never reads the GLM round-robin ``axis_map`` that its fused Triton kernel reads, so wherever
    the two maps differ (sections [8, 12, 12]: 11/11/10 frequencies for T/H/W instead of 8/12/12) the
    native path rotates by another map than the kernel (docs/findings.md; pinned in
    tests/backends/regressions/sglang/)."""
    if spec.layout != "glm_round_robin" or spec.axis_map() == row_maps.interleaved(spec.sections):
        return None
    return ("known mismatch: SGLang 0.5.23 MRotaryEmbedding.forward_native applies the interleaved map where "
            "mrope_interleaved_glm asks the GLM round-robin one (only its Triton kernel reads axis_map)")


def first_defect(*defects):
    """One predicate answering with the first of ``defects`` that applies."""
    def defect(spec: RopeSpec, num_tokens: int, dtype: torch.dtype, device: str, *, num_heads: int,
               num_kv_heads: int) -> str | None:
        for each in defects:
            why = each(spec, num_tokens, dtype, device, num_heads=num_heads, num_kv_heads=num_kv_heads)
            if why is not None:
                return why
        return None
    return defect


# vLLM 0.33.0's triton_mrope (_triton_mrope_forward) under Triton 3.6.0, whose bundled ptxas is
# 12.8.93: GPT-J pairs, head 128, whole rotary, sections 3/1/60, one token (Triton specializes
# num_tokens == 1 to a constant), 28 or 32 query heads with 28 key heads.  ptxas spills one bf16 key
# result per thread and schedules its reload (LDL.LU.S16 at 0x0cb0 of the sm_90a SASS) before the
# spill (STL at 0x0cc0): the even channel of every fourth pair of key heads 16-23 is stored from a
# stack slot nothing wrote (128 elements, garbage that changes from launch to launch).  The PTX is
# right; ptxas 12.9.86 (which Triton 3.9 bundles for GPUs before sm_90; it compiles sm_90 with a 13.x)
# and 13.0 spill before they reload.  Measured on the H200:
# 200 of 200 launches wrong with the bundled ptxas, 0 of 200 with TRITON_PTXAS_PATH at CUDA 13.0's,
# the same launch with 8/8, 28/4 heads, 2 tokens or sections 16/24/24 right
# (docs/upstream-triton-ptxas-spill-vllm-mrope.md; pinned in tests/backends/regressions/vllm-cuda/).
PTXAS_SPILL_HEADS = ((28, 28), (32, 28))
PTXAS_SPILL_FIXED = (12, 9)


def triton_ptxas_version() -> tuple[int, int, int] | None:
    """The version of the ptxas Triton compiles sm_90 kernels with here (TRITON_PTXAS_PATH or the one
    it bundles), or None where that cannot be told (no NVIDIA backend, no ptxas)."""
    import re
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version
        found = re.search(r"V(\d+)\.(\d+)\.(\d+)", get_ptxas_version(90))
    except Exception:   # noqa: BLE001 - any way of not finding it is "unknown"
        return None
    return tuple(int(g) for g in found.groups()) if found else None


def cuda_capability(device: str) -> tuple[int, int] | None:
    """The compute capability of a CUDA ``device`` (None on a build without CUDA or a ROCm one)."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(torch.device(device)))


def old_ptxas_on_sm90(device: str, fixed: tuple[int, int]) -> str | None:
    """The version of Triton's ptxas (as "12.8.93") where ``device`` is an sm_90 GPU and that ptxas
    is older than ``fixed``, the first version measured to compile a launch right; else None."""
    if cuda_capability(device) != (9, 0):
        return None
    ptxas = triton_ptxas_version()
    if ptxas is None or ptxas[:2] >= fixed:
        return None
    return ".".join(map(str, ptxas))


def vllm_triton_mrope_defect(spec: RopeSpec, num_tokens: int, dtype: torch.dtype, device: str, *, num_heads: int,
                             num_kv_heads: int) -> str | None:
    """vLLM 0.33.0 ``forward_cuda`` for [3, T] positions (``triton_mrope``): wrong key values on the
    launches ptxas < 12.9 miscompiles (above), measured on sm_90 in bf16."""
    if (not str(device).startswith("cuda") or dtype != torch.bfloat16 or num_tokens != 1
            or (num_heads, num_kv_heads) not in PTXAS_SPILL_HEADS or spec.is_neox_style
            or (spec.head_size, spec.rotary_dim, spec.sections, spec.layout) != (128, 128, (3, 1, 60), "chunked")):
        return None
    ptxas = old_ptxas_on_sm90(device, PTXAS_SPILL_FIXED)
    if ptxas is None:
        return None
    return (f"wrong key values: ptxas {ptxas} (Triton's) reloads a spilled bf16 key result "
            f"before spilling it, key heads 16-23 ({num_heads} query / {num_kv_heads} key heads, one token; "
            f"docs/upstream-triton-ptxas-spill-vllm-mrope.md)")


# Liger-Kernel 0.8.5's _triton_qwen2vl_mrope under Triton 3.6.0 (ptxas 12.8.93), float32, one token
# (Triton specializes the sequence length 1 to a constant): 96 query heads with 41 key heads, head
# 160.  The [pad_n_qh, pad_hd/2] = [128, 128] fp32 q tile spills heavily (32 registers, 5.9 KB of
# spill stores), and cos/sin reach the tile's layout through shared memory: each lane reads
# smem + (tid & 31) * 16.  ptxas spills tid, reuses its register for a masked load's zero, and
# computes the address from that register before reloading tid (LOP3 at 0x2a70, LDL at 0x2b70 of
# the sm_90a SASS), so every lane reads lane 0's four frequencies: frequency f is rotated by the
# angle of f % 4, on every head of q and k.  The PTX is right.  Measured on the H200: the launch
# wrong every time, also freshly compiled; right under the interpreter.  Offline, the same SASS
# from ptxas 12.9.86 and 13.4.59, right from 13.4.59 with --regAllocOptLevel=2 (how Triton 3.9
# compiles sm_90), and the same fault at 96/42 heads and at head 192 with 96/41 (compiled, not
# run); 88-128 query heads with 41 key heads, 96 with 33-63 key heads, head 144/176/200/240, fp16
# and bf16 compile without it.  Pinned in tests/backends/regressions/liger/.
LIGER_SPILL_SHAPES = ((96, 41, 160), (96, 42, 160), (96, 41, 192))   # (query heads, key heads, head size)
LIGER_SPILL_FIXED = (13, 0)


# Liger 0.8.5's rope backwards (LigerRopeFunction, LigerQwen2VLMRopeFunction): the backward kernel
# rotates ``dq.transpose(1, 2).contiguous()`` in place, which is the upstream gradient itself whenever
# its storage is [B, L, heads, head_dim]-contiguous (every [T, heads * head_size] output's gradient
# is).  Its gradients are right; the tensor autograd handed in is overwritten.  Measured on the H100
# and under the interpreter; pinned both ways by tests/backends/test_liger_backward.py.
LIGER_BACKWARD_DEFECT = ("known defect: Liger's backward rotates the upstream gradient in its own storage (the "
                         "tensor autograd handed in is overwritten; its gradients are right: docs/findings.md)")


def liger_mrope_defect(spec: RopeSpec, num_tokens: int, dtype: torch.dtype, device: str, *, num_heads: int,
                       num_kv_heads: int) -> str | None:
    """Liger 0.8.5 ``liger_multimodal_rotary_pos_emb``: the float32 launches ptxas < 13 miscompiles
    on sm_90 (above)."""
    if (not str(device).startswith("cuda") or dtype != torch.float32 or num_tokens != 1
            or (num_heads, num_kv_heads, spec.head_size) not in LIGER_SPILL_SHAPES):
        return None
    ptxas = old_ptxas_on_sm90(device, LIGER_SPILL_FIXED)
    if ptxas is None:
        return None
    return (f"wrong values: ptxas {ptxas} (Triton's) computes the cos/sin shared-memory "
            f"address from a spilled register before reloading it, so frequency f gets the angle of f % 4 "
            f"({num_heads} query / {num_kv_heads} key heads, head {spec.head_size}, one token, float32; "
            f"docs/findings.md)")
