"""vLLM's rotary embedding ops (``vllm.model_executor.layers.rotary_embedding``; read on vllm 0.33.0).

``MRotaryEmbedding`` takes the harness's layout as is: positions ``[T]`` or ``[3, T]``, q/k
``[T, heads * head_size]``, a cos|sin cache ``[L, rotary_dim]`` held in the public ``cos_sin_cache``
buffer.  The adapter builds one op per spec and dtype and points that buffer at the harness's cache
(cast to q's dtype, as ``_match_cos_sin_cache_dtype`` does; it then has nothing to change).  Entries:

* ``vllm-native`` -> ``forward_native``: gather, axis map, rotation in the activation dtype;
* ``vllm-cuda`` -> ``forward_cuda``: the Triton kernel ``triton_mrope`` for ``[3, T]`` positions
  (computes in the cos dtype), ``ApplyRotaryEmb`` for ``[T]``;
* layout "ernie45" -> ``Ernie4_5_VLRotaryEmbedding`` (sections [h, w, t]) on both entries: its
  ``forward_cuda`` is its ``forward_native`` (no kernel);
* ``vllm-xd`` -> ``XDRotaryEmbedding.forward_native`` (XD-RoPE, 3 or 4 rows, NTK alpha) where the
  installed vLLM has it (0.33.0 does not: it is then unsupported, with that reason).

vLLM asserts a key; without one the op gets a one-head scratch key that is thrown away.
"""

from __future__ import annotations

import functools
import os

import torch

from rope.backends import declare, require, triton_reason
from rope.backends.known_faults import empty_batch_raises, first_defect, vllm_triton_mrope_defect
from rope.spec import RopeSpec, check_rotation_inputs

# Without a GPU vLLM swaps Triton for a placeholder (no active driver), so the Triton M-RoPE kernel
# could not run under the interpreter.  vLLM keeps real Triton when CUDA_VISIBLE_DEVICES is empty (its
# "distributed environment" rule); on a GPU-less host that is a true statement, so say it.
if not torch.cuda.is_available():
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
INSTALL = ("pip install vllm (CUDA); on a CPU box scripts/vllm_cpu_env.sh (its own venv): see "
            "docs/implementations.md, \"Serving engines' own code as implementations\"")
_rotary = require("vllm.model_executor.layers.rotary_embedding", distribution="vllm", install=INSTALL)
_mrope = require("vllm.model_executor.layers.rotary_embedding.mrope", distribution="vllm", install=INSTALL)
_config = require("vllm.config", distribution="vllm", install=INSTALL)
XDRotaryEmbedding = getattr(_rotary, "XDRotaryEmbedding", None)
try:        # Ernie-4.5-VL's own class (models/ernie45_vl_moe.py builds it; get_rope never does)
    from vllm.model_executor.layers.rotary_embedding.ernie45_vl_rope import Ernie4_5_VLRotaryEmbedding
except ImportError:
    Ernie4_5_VLRotaryEmbedding = None


def _construct(cls, *args, **kwargs):
    """A CustomOp is built inside a vLLM config context (what vLLM's own op tests do, with defaults)."""
    device = None if torch.cuda.is_available() else _config.DeviceConfig(device="cpu")
    config = _config.VllmConfig(device_config=device) if device else _config.VllmConfig()
    with _config.set_current_vllm_config(config):
        return cls(*args, **kwargs)


def _version() -> str:
    import vllm
    return getattr(vllm, "__version__", "?")


@functools.lru_cache(maxsize=32)
def _mrope_op(spec: RopeSpec, dtype: torch.dtype):
    # positions_factor=1: the cache is replaced by the harness's one anyway (no 4x table to build).
    if spec.layout == "ernie45":        # mrope_section [h, w, t], as ernie45_vl_moe.py passes it
        return _construct(Ernie4_5_VLRotaryEmbedding, spec.head_size, spec.rotary_dim, spec.max_position, spec.base,
                          spec.is_neox_style, dtype, mrope_section=list(spec.sections), positions_factor=1)
    return _construct(
        _mrope.MRotaryEmbedding, spec.head_size, spec.rotary_dim, spec.max_position, spec.base, spec.is_neox_style, dtype,
        mrope_section=list(spec.sections) if spec.sections else None,
        mrope_interleaved=spec.layout == "interleaved", positions_factor=1)


@functools.lru_cache(maxsize=32)
def _xd_op(spec: RopeSpec, dtype: torch.dtype):
    return _construct(XDRotaryEmbedding, spec.head_size, spec.rotary_dim, spec.max_position, spec.base, spec.is_neox_style,
                             spec.ntk_alpha if spec.ntk_alpha is not None else 1.0, dtype, list(spec.sections))


def _bind(op, method: str, spec: RopeSpec, positions, query, key, cos_sin_cache):
    """``op.method`` on these inputs, bound once: a function of no arguments returning (q, k)."""
    k_in = key if key is not None else query.new_zeros(query.shape[0], spec.head_size)
    forward = getattr(op, method)

    def rotate():
        op.cos_sin_cache = cos_sin_cache        # the op is shared by every caller of this spec and dtype
        with torch.no_grad():
            q_out, k_out = forward(positions, query, k_in)
        return q_out, (k_out if key is not None else None)
    return rotate


def engine_call(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """``forward_cuda`` on these inputs, bound once: the cos/sin gather and ``triton_mrope`` as vLLM
    runs them, what the bench times."""
    return _bind(_mrope_op(spec, query.dtype), "forward_cuda", spec, positions, query, key, cos_sin_cache)


def rotate_vllm_native(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    return _bind(_mrope_op(spec, query.dtype), "forward_native", spec, positions, query, key, cos_sin_cache)()


def rotate_vllm_cuda(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    return engine_call(spec, positions, query, key, cos_sin_cache)()


def rotate_vllm_xd(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    if XDRotaryEmbedding is None:
        raise ValueError(f"vllm {_version()} has no XDRotaryEmbedding")
    return _bind(_xd_op(spec, query.dtype), "forward_native", spec, positions, query, key, cos_sin_cache)()


def _mrope_reason(spec: RopeSpec) -> str | None:
    if spec.num_dims not in (1, 3):
        return f"MRotaryEmbedding takes [T] or [3, T] positions (spec has {spec.num_dims} rows; XD-RoPE is vllm-xd)"
    if spec.num_dims == 1 and spec.sections is not None:
        return "one-row sections are not a vLLM configuration (1-D RoPE has mrope_section=None)"
    if spec.ntk_alpha is not None:
        return "MRotaryEmbedding has no NTK-alpha base (that is XDRotaryEmbedding)"
    if spec.layout == "ernie45":
        if Ernie4_5_VLRotaryEmbedding is None:
            return f"vllm {_version()} has no Ernie4_5_VLRotaryEmbedding"
        return None
    if spec.layout not in ("chunked", "interleaved"):
        return (f"MRotaryEmbedding maps frequencies chunked or interleaved, Ernie4_5_VLRotaryEmbedding the "
                f"Ernie-4.5 map (layout={spec.layout!r})")
    return None


def _native_reason(spec: RopeSpec, dtype, device: str) -> str | None:
    return _mrope_reason(spec)


def _cuda_reason(spec: RopeSpec, dtype, device: str) -> str | None:
    why = _mrope_reason(spec)
    if why or spec.sections is None or spec.layout == "ernie45":     # no Triton kernel on these paths
        return why
    return triton_reason(device, dtype, bf16_arithmetic=True)


def _xd_reason(spec: RopeSpec, dtype, device: str) -> str | None:
    if XDRotaryEmbedding is None:
        return f"vllm {_version()} has no XDRotaryEmbedding"
    if spec.sections is None or spec.num_dims not in (3, 4) or spec.layout != "chunked":
        return "XDRotaryEmbedding is chunked XD-RoPE with 3 or 4 position rows"
    return None


rotate_vllm_native = declare(rotate_vllm_native, working_precision="activation", reason=_native_reason,
                             defect=empty_batch_raises("vLLM 0.33.0 MRotaryEmbedding.forward_native"))
# forward_cuda views q as (num_tokens, -1, head_size) on its path for [T] positions, and so does
# Ernie4_5_VLRotaryEmbedding's, which is its forward_native, for [3, T] ones too.
rotate_vllm_cuda = declare(rotate_vllm_cuda, working_precision="activation", reason=_cuda_reason,
                           defect=first_defect(
                               empty_batch_raises("vLLM 0.33.0 forward_cuda ([T] positions; Ernie4_5_VLRotaryEmbedding "
                                                  "for any)", when=lambda s: s.sections is None or s.layout == "ernie45"),
                               vllm_triton_mrope_defect))
# forward_cuda runs triton_mrope for [3, T] positions and another kernel for [T] (vLLM's compiled
# rotary op, or ApplyRotaryEmb): text tokens through the two need not agree bit for bit (on the H200 their
# float32 outputs differed below the printed digits), so the property holds each to the reference instead.
rotate_vllm_cuda.separate_1d_kernel = True
rotate_vllm_xd = declare(rotate_vllm_xd, working_precision="activation", reason=_xd_reason)
