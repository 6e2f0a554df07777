"""llama.cpp's ggml rope as a rotation implementation (registry name ``ggml``; read on ggml 0.20.2,
the CPU build the ``libggml-python`` wheel ships).

The op is called as llama.cpp calls it, through the C API with ctypes: ``ggml_rope_ext`` for 1-D
RoPE (mode 0, adjacent GPT-J pairs; mode 2, NeoX halves) and ``ggml_rope_multi`` for M-RoPE (mode 8,
``GGML_ROPE_TYPE_MROPE``: chunked sections, 3 or 4 rows; mode 40, ``GGML_ROPE_TYPE_IMROPE``: the
interleaved map), on q and k viewed as ``[tokens, heads, head_size]`` (ggml's ``ne = (head_size,
heads, tokens)``), ``n_dims = rotary_dim`` (the channels past it pass through), positions int32
``[4 * tokens]`` row after row, YaRN off.  Each call builds a small ggml context, a one-op graph, and
computes it on one thread.

ggml does not take a cos/sin cache: it computes the angles itself, ``theta = p`` then
``theta *= theta_scale`` once per pair with ``theta_scale = powf(base, -2 / n_dims)``, all float32,
then ``cosf`` / ``sinf``.  The adapter declares ``angles = "own-float32"``: the harness compares it
with the exact float64 angles and widens the bound by the error of that recurrence
(rope/harness/rotation/bound.py, ``own_angle_error``).

What ggml cannot express is declared unsupported: M-RoPE with GPT-J pairs (its multi-row modes are
NeoX only), maps other than chunked and interleaved, bfloat16 (ggml 0.20.2's CPU rope aborts the
process on a BF16 tensor), devices other than the CPU.  float32 and float16 tensors run (ggml
computes in float32 and rounds a float16 result once).  An NTK-alpha spec passes its adjusted base,
as llama.cpp would.  IMROPE reads a fourth row for the frequencies past ``3 * s_h`` / ``3 * s_w``
(Qwen3-VL's [24, 20, 20]: 61 and 62) where the models read T: the adapter passes T as that row, as
llama.cpp does for text tokens (docs/findings.md: for image tokens llama.cpp's mtmd passes 0 there).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import torch

from rope.backends import declare, require
from rope.spec import RopeSpec, check_rotation_inputs

_INSTALL = "pip install libggml-python (the CPU build of ggml with its shared libraries)"
LIBRARY_ENV = "ROPE_GGML_LIB_DIR"
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_I32 = 0, 1, 26
# torch dtype -> (ggml type, numpy dtype).  No bfloat16: ggml 0.20.2's CPU rope aborts the process on
# a BF16 tensor (ggml_compute_forward_rope: "fatal error"), so it is never called with one.
TYPES = {torch.float32: (GGML_TYPE_F32, np.float32), torch.float16: (GGML_TYPE_F16, np.float16)}
MODE_NORMAL, MODE_NEOX, MODE_MROPE, MODE_IMROPE = 0, 2, 8, 40


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _library_dir() -> Path:
    """Where libggml-base.so and libggml-cpu.so are: $ROPE_GGML_LIB_DIR, else the libggml package's."""
    if os.environ.get(LIBRARY_ENV):
        return Path(os.environ[LIBRARY_ENV])
    package = require("libggml", distribution="libggml-python", install=_INSTALL)
    return Path(package.__file__).parent / "lib64"


@functools.lru_cache(maxsize=1)
def _ggml():
    """(libggml-base, libggml-cpu) with the signatures the adapter calls."""
    where = _library_dir()
    try:
        base = ctypes.CDLL(str(where / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(where / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise ImportError(f"libggml-python's libraries do not load from {where} ({exc}); install it with: "
                          f"{_INSTALL}, or name their directory in ${LIBRARY_ENV}") from exc
    vp, f = ctypes.c_void_p, ctypes.c_float
    base.ggml_init.argtypes, base.ggml_init.restype = [_InitParams], vp
    base.ggml_free.argtypes, base.ggml_free.restype = [vp], None
    base.ggml_new_tensor_1d.argtypes, base.ggml_new_tensor_1d.restype = [vp, ctypes.c_int, ctypes.c_int64], vp
    base.ggml_new_tensor_3d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    base.ggml_new_tensor_3d.restype = vp
    base.ggml_get_data.argtypes, base.ggml_get_data.restype = [vp], vp
    base.ggml_rope_ext.argtypes = [vp, vp, vp, vp, ctypes.c_int, ctypes.c_int, ctypes.c_int] + [f] * 6
    base.ggml_rope_ext.restype = vp
    base.ggml_rope_multi.argtypes = [vp, vp, vp, vp, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                     ctypes.c_int] + [f] * 6
    base.ggml_rope_multi.restype = vp
    base.ggml_new_graph.argtypes, base.ggml_new_graph.restype = [vp], vp
    base.ggml_build_forward_expand.argtypes, base.ggml_build_forward_expand.restype = [vp, vp], None
    cpu.ggml_cpu_init.argtypes, cpu.ggml_cpu_init.restype = [], None
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_cpu_init()
    return base, cpu


_ggml()          # import time: a missing or broken library is an ImportError naming the fix


def _rope(spec: RopeSpec, x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """ggml's rope of x [T, heads * head_size] (float32 or float16, as ggml's tensor of that type) at
    int32 positions ``rows`` [1 or 4, T]; the result in x's dtype."""
    base, cpu = _ggml()
    num_tokens, hs = x.shape[0], spec.head_size
    heads = x.shape[1] // hs
    ggml_type, view = TYPES[x.dtype]
    data = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=view)
    pos = np.ascontiguousarray(rows, dtype=np.int32).reshape(-1)
    size = 2 * data.nbytes + pos.nbytes + (1 << 20)             # input, output, positions, graph
    ctx = base.ggml_init(_InitParams(size, None, False))
    if not ctx:
        raise MemoryError(f"ggml_init could not allocate {size} bytes")
    try:
        a = base.ggml_new_tensor_3d(ctx, ggml_type, hs, heads, num_tokens)
        b = base.ggml_new_tensor_1d(ctx, GGML_TYPE_I32, pos.size)
        ctypes.memmove(base.ggml_get_data(a), data.ctypes.data, data.nbytes)
        ctypes.memmove(base.ggml_get_data(b), pos.ctypes.data, pos.nbytes)
        theta_base, f = float(spec.effective_base), ctypes.c_float
        yarn_off = (f(1.0), f(0.0), f(1.0), f(0.0), f(0.0))     # freq_scale, ext_factor, attn_factor, beta_*
        if spec.num_dims == 1:
            mode = MODE_NEOX if spec.is_neox_style else MODE_NORMAL
            out = base.ggml_rope_ext(ctx, a, b, None, spec.rotary_dim, mode, 0, f(theta_base), *yarn_off)
        else:
            sections = (ctypes.c_int * 4)(*(list(spec.sections) + [0] * (4 - spec.num_dims)))
            mode = MODE_IMROPE if spec.layout == "interleaved" else MODE_MROPE
            out = base.ggml_rope_multi(ctx, a, b, None, spec.rotary_dim, sections, mode, 0, f(theta_base),
                                       *yarn_off)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        status = cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned {status}")
        raw = (ctypes.c_char * data.nbytes).from_address(base.ggml_get_data(out))
        result = np.frombuffer(bytes(raw), dtype=view).copy()
    finally:
        base.ggml_free(ctx)
    return torch.from_numpy(result).view(num_tokens, heads * hs).to(x.device)


def _position_rows(spec: RopeSpec, positions: torch.Tensor) -> np.ndarray:
    """int32 [1, T] (1-D) or [4, T]: M-RoPE's rows, the fourth (read by IMROPE past 3 * s) = T."""
    rows = positions.detach().cpu().to(torch.int64).reshape(spec.num_dims, -1).numpy()
    if spec.num_dims == 3:
        rows = np.concatenate([rows, rows[:1]])
    return rows


def rotate_ggml(spec: RopeSpec, positions, query, key, cos_sin_cache):
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache, check_values=True)
    if query.shape[0] == 0:
        return query.clone(), None if key is None else key.clone()
    rows = _position_rows(spec, positions)
    q_out = _rope(spec, query, rows)
    k_out = None if key is None else _rope(spec, key, rows)
    return q_out, k_out


def _reason(spec: RopeSpec, dtype, device: str) -> str | None:
    if device != "cpu":
        return "the libggml-python wheel is ggml's CPU build"
    if dtype not in TYPES:
        return (f"the adapter feeds ggml float32 and float16 tensors ({dtype}: ggml 0.20.2's CPU rope aborts the "
                f"process on BF16)")
    if spec.num_dims > 1 and not spec.is_neox_style:
        return "ggml's multi-row modes rotate NeoX halves only (GGML_ROPE_TYPE_MROPE implies NEOX)"
    if spec.num_dims > 1 and spec.layout not in ("chunked", "interleaved"):
        return f"ggml maps frequencies chunked (MROPE) or interleaved (IMROPE), not {spec.layout!r}"
    if spec.layout == "interleaved" and spec.num_dims != 3:
        return "ggml's IMROPE is the 3-row Qwen3-VL map"
    return None


rotate_ggml = declare(rotate_ggml, working_precision="float32", reason=_reason)
rotate_ggml.angles = "own-float32"
