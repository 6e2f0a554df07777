"""SGLang's ``MRotaryEmbedding`` (``sglang.srt.layers.rotary_embedding.mrope``; read on sglang 0.5.23).

Its interface is the harness's own: positions ``[T]`` or ``[3, T]``, q/k ``[T, heads * head_size]``,
``cos_sin_cache`` ``[L, rotary_dim]`` (cos | sin) held as a buffer of the module.  The adapter builds one
module per spec and dtype (``max_position_embeddings`` = the spec's cache length) and points its public
``cos_sin_cache`` buffer at the harness's cache, the one attribute every forward reads.  Two entries:

* ``sglang`` -> ``forward_native``: gather, axis map (chunked or Qwen3-VL interleaved), rotation in
  the activation dtype, out of place;
* ``sglang-triton`` -> ``forward_triton``: the fused Triton kernel ``triton_mrope_fused`` (chunked,
  interleaved, GLM round-robin axis map, NeoX or GPT-J, partial rotary), in place, computing in the
  cache dtype.

SGLang's M-RoPE has exactly 3 rows: 4-row XD-RoPE is not in it.  The GLM round-robin map
(``mrope_interleaved_glm``, read only with ``mrope_interleaved``) is the spec's layout
"glm_round_robin", driven where the installed MRotaryEmbedding takes that flag; its forward_native
ignores it (a declared defect, docs/findings.md).  Layout "ernie45" goes to Ernie-4.5-VL's own code:
``Ernie4_5_VLRotaryEmbedding.forward_native`` and the fused kernel
``triton_ernie45_rope_fused_inplace`` (sections [h, w, t], positions rows T, H, W).
"""

from __future__ import annotations

import functools
import inspect
import os

import torch

from rope.backends import declare, require, triton_reason
from rope.backends.known_faults import empty_batch_raises, first_defect, sglang_native_glm_map, sglang_triton_fault
from rope.spec import RopeSpec, check_rotation_inputs

# SGLang's own switch for a GPU-less host: without it the module reaches for vLLM's CUDA ops.
if not torch.cuda.is_available():
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
_mrope = require("sglang.srt.layers.rotary_embedding.mrope", distribution="sglang",
                 install="pip install sglang; on a CPU box scripts/sglang_cpu_site.sh (PYTHONPATH=SITE): see "
                         "docs/implementations.md, \"Serving engines' own code as implementations\"")


@functools.lru_cache(maxsize=32)
def _module(spec: RopeSpec, dtype: torch.dtype, device: torch.device):
    """SGLang's rotary module for ``spec`` on ``device``, as the model holds it after ``.to(device)``:
    its buffers (the GLM map's ``axis_map`` among them, which the Triton kernel reads) live there."""
    return _new_module(spec, dtype).to(device)


def _new_module(spec: RopeSpec, dtype: torch.dtype):
    if spec.layout == "ernie45":
        # Ernie-4.5-VL's own class (models/ernie45_moe_vl.py builds it with mrope_section [h, w, t]).
        return _mrope.Ernie4_5_VLRotaryEmbedding(spec.head_size, spec.rotary_dim, spec.max_position, spec.base,
                                                 spec.is_neox_style, dtype, mrope_section=list(spec.sections))
    return _mrope.MRotaryEmbedding(
        spec.head_size, spec.rotary_dim, spec.max_position, spec.base, spec.is_neox_style, dtype,
        mrope_section=list(spec.sections) if spec.sections else None,
        # SGLang reads mrope_interleaved_glm only where mrope_interleaved is set as well.
        mrope_interleaved=spec.layout in ("interleaved", "glm_round_robin"),
        **({"mrope_interleaved_glm": True} if spec.layout == "glm_round_robin" else {}))


def _bind(method: str, spec: RopeSpec, positions, query, key, cos_sin_cache):
    """SGLang's ``method`` on these inputs, bound once: a function of no arguments returning (q, k)."""
    if spec.ntk_alpha is not None:
        raise ValueError(f"ntk_alpha={spec.ntk_alpha}: SGLang's MRotaryEmbedding has no NTK-alpha base")
    op = _module(spec, query.dtype, query.device)
    forward = getattr(op, method)

    def call(k_in):
        op.cos_sin_cache = cos_sin_cache        # the module is shared by every caller of this spec
        return forward(positions, query, k_in)
    return _bound(call, spec, query, key)


def _bound(call, spec: RopeSpec, query, key):
    """``call(k)`` -> (q, k) bound once, with a scratch one-head key where there is none (SGLang
    asserts a key) that is thrown away."""
    k_in = key if key is not None else query.new_zeros(query.shape[0], spec.head_size)

    def rotate():
        q_out, k_out = call(k_in)
        return q_out, (k_out if key is not None else None)
    return rotate


def rotate_sglang(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    return _bind("forward_native", spec, positions, query, key, cos_sin_cache)()


def engine_call(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """``forward_triton`` (the fused gather and rotation) on these inputs, bound once: what the
    bench times as SGLang runs it."""
    if spec.sections is None:
        raise ValueError("sections=None: forward_triton is the M-RoPE kernel (1-D goes through forward_native)")
    # The kernel addresses cache row p as ``cos_sin_cache_ptr + p * rotary_dim`` (no stride argument):
    # it takes a contiguous [L, rotary_dim] cache, which is what SGLang always holds (a buffer built by
    # torch.cat, or a .to() copy of it).  A row-strided view (the guard regions' padded rows) would be
    # misread, so it goes in as a contiguous copy (a no-op for a contiguous cache).  Positions and q/k
    # take their row strides (positions.stride(0), q/k.stride(0)) but assume unit last stride: positions
    # get a copy where that does not hold (q/k are rotated in place; every harness layout has it).
    if positions.stride(-1) != 1:
        positions = positions.contiguous()
    if spec.layout == "ernie45":
        return _ernie_kernel_call(spec, positions, query, key, cos_sin_cache.contiguous())
    return _bind("forward_triton", spec, positions, query, key, cos_sin_cache.contiguous())


def _ernie_kernel():
    """SGLang's fused Ernie-4.5 kernel (what its Ernie4_5_VLRotaryEmbedding runs on a GPU)."""
    return require("sglang.kernels.ops.attention.rotary_triton", distribution="sglang",
                   install="pip install sglang").triton_ernie45_rope_fused_inplace


def _ernie_kernel_call(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """``triton_ernie45_rope_fused_inplace(q, k, cache, positions, [h, w, t], head_size, rotary_dim,
    is_neox_style)`` on these inputs, bound once (in place; positions [3, T] rows T, H, W)."""
    kernel = _ernie_kernel()

    def call(k_in):
        kernel(query, k_in, cos_sin_cache, positions, list(spec.sections), spec.head_size, spec.rotary_dim,
               spec.is_neox_style)
        return query, k_in
    return _bound(call, spec, query, key)


def rotate_sglang_triton(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    return engine_call(spec, positions, query, key, cos_sin_cache)()


def _spec_reason(spec: RopeSpec) -> str | None:
    if spec.num_dims not in (1, 3):
        return f"SGLang's MRotaryEmbedding has exactly 3 position rows (spec has {spec.num_dims})"
    if spec.ntk_alpha is not None:
        return "SGLang's MRotaryEmbedding has no NTK-alpha (XD-RoPE) base"
    if spec.num_dims == 1 and spec.sections is not None:
        return "one-row sections are not an SGLang configuration (1-D RoPE has mrope_section=None)"
    if spec.layout not in ("chunked", "interleaved", "glm_round_robin", "ernie45"):
        return (f"SGLang maps frequencies chunked, interleaved, GLM round-robin (MRotaryEmbedding) or Ernie-4.5 "
                f"(Ernie4_5_VLRotaryEmbedding) (layout={spec.layout!r})")
    if spec.layout == "glm_round_robin" and not _has_glm_map():
        return "this SGLang's MRotaryEmbedding has no mrope_interleaved_glm"
    return None


@functools.lru_cache(maxsize=1)
def _has_glm_map() -> bool:
    return "mrope_interleaved_glm" in inspect.signature(_mrope.MRotaryEmbedding).parameters


def _native_reason(spec: RopeSpec, dtype, device: str) -> str | None:
    return _spec_reason(spec)


def _triton_reason(spec: RopeSpec, dtype, device: str) -> str | None:
    if spec.sections is None:
        return "forward_triton is the M-RoPE kernel; 1-D positions go through forward_native"
    return _spec_reason(spec) or triton_reason(device, dtype, bf16_arithmetic=True)


rotate_sglang = declare(rotate_sglang, working_precision="activation", reason=_native_reason,
                        defect=first_defect(empty_batch_raises("SGLang 0.5.23 MRotaryEmbedding.forward_native"),
                                            sglang_native_glm_map))
rotate_sglang_triton = declare(rotate_sglang_triton, working_precision="activation", reason=_triton_reason,
                               fault=sglang_triton_fault)
