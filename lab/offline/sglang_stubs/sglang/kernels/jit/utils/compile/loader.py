"""Stands in for ``sglang/kernels/jit/utils/compile/loader.py`` (sglang 0.5.23) in the trimmed carry
(lab/offline/sglang_carry.sh).

Only ``load_jit``, and it refuses: the carry holds none of SGLang's JIT CUDA sources and no tvm-ffi
toolchain to build them with.  The JIT kernels that ``sglang.kernels.ops.attention.rope`` declares
are built on their first call, so importing that module still works; the harness's two entries
(``forward_native`` and the Triton kernel behind ``forward_triton``) never call them.
"""


def load_jit(*args, **kwargs):
    raise RuntimeError("lab/offline/sglang_carry.sh carries no JIT CUDA kernels (no sources, no tvm-ffi); "
                       "only SGLang's Python and Triton rotary paths run from .sgl")
