"""Adapters for external rotary implementations (vLLM, SGLang, Liger-Kernel, FlashInfer, transformers,
lmdeploy, llama.cpp's ggml).

Each adapter is a rotation implementation in the registry's sense (``rope.registry``): it converts
the harness layout (positions ``[T]`` or ``[rows, T]``, q/k ``[T, heads * head_size]``, cos|sin cache
``[L, rotary_dim]``) to what the external code takes, calls that code, and converts back.  It declares

* ``working_precision``: what the external code computes in;
* ``supports(spec, dtype, device)`` and ``unsupported_reason(spec, dtype, device)``: the variants the
  external code does not implement, each with the reason that the test report shows.

An adapter module imports its package at import time; when the package is missing, importing the
module raises ``ImportError`` with the package and the command that installs it, so
``get_implementation("liger")`` (and ``pytest --rope-impl liger``) fails with that message instead of
skipping silently.
"""

from __future__ import annotations

import importlib
from typing import Callable

from rope.devices import configure_triton, triton_runs_on

configure_triton()   # before any adapter imports an external package's @triton.jit kernels

__all__ = ["BACKENDS", "declare", "heads", "require", "triton_reason"]

# Where the engines' CPU setup is documented (the scripts live in the repository, not in the wheel).
_ENGINES_DOC = "see docs/implementations.md, \"Serving engines' own code as implementations\""

# name -> (import path, distribution, how to get it): the registry's optional entries.
BACKENDS: dict[str, tuple[str, str, str]] = {
    "liger": ("rope.backends.liger:rotate_liger", "liger-kernel", "pip install '.[backends]'"),
    "transformers": ("rope.backends.transformers.rotation:rotate_transformers", "transformers", "pip install '.[oracle]'"),
    "vllm-native": ("rope.backends.vllm.rotation:rotate_vllm_native", "vllm",
                    "pip install vllm (CUDA); on a CPU box scripts/vllm_cpu_env.sh: " + _ENGINES_DOC),
    "vllm-cuda": ("rope.backends.vllm.rotation:rotate_vllm_cuda", "vllm", "pip install vllm (CUDA build)"),
    "vllm-xd": ("rope.backends.vllm.rotation:rotate_vllm_xd", "vllm",
                "pip install vllm; on a CPU box scripts/vllm_cpu_env.sh: " + _ENGINES_DOC),
    "sglang": ("rope.backends.sglang.rotation:rotate_sglang", "sglang",
               "pip install sglang; on a CPU box scripts/sglang_cpu_site.sh: " + _ENGINES_DOC),
    "sglang-triton": ("rope.backends.sglang.rotation:rotate_sglang_triton", "sglang",
                      "pip install sglang; on a CPU box scripts/sglang_cpu_site.sh: " + _ENGINES_DOC),
    "flashinfer": ("rope.backends.flashinfer:rotate_flashinfer", "flashinfer-python",
                   "pip install flashinfer-python (GPU only)"),
    "lmdeploy": ("rope.backends.lmdeploy:rotate_lmdeploy", "lmdeploy",
                 "pip install lmdeploy (CUDA); on a CPU box scripts/lmdeploy_cpu_site.sh: " + _ENGINES_DOC),
    "ggml": ("rope.backends.ggml:rotate_ggml", "libggml-python",
             "pip install libggml-python (ggml's CPU build, as llama.cpp links it)"),
}


def require(module: str, *, distribution: str, install: str):
    """Import ``module`` or raise ImportError naming the distribution and how to install it."""
    try:
        return importlib.import_module(module)
    except Exception as exc:   # noqa: BLE001 - a package that breaks at import is as absent as a missing one
        raise ImportError(f"{distribution} is not importable here ({type(exc).__name__}: {exc}); "
                          f"install it with: {install}") from exc


def declare(fn: Callable, *, working_precision: str, reason: Callable, fault: Callable | None = None,
            defect: Callable | None = None) -> Callable:
    """Attach the registry attributes: ``reason(spec, dtype, device)`` returns why a combination is not
    supported (None when it is).  ``fault(spec, dtype, device)``: why the external code is known to
    crash on a combination it claims (rope/backends/known_faults.py).  ``supports`` is true when
    neither answers (the benchmark, say, must not run a faulting shape either).
    ``defect(spec, num_tokens, dtype, device, *, num_heads, num_kv_heads)``: why the external code is
    known to return wrong values or raise on a call it claims (a measured upstream defect, pinned by a
    regression case): the suite still checks those calls, and a run that asks to avoid known defects
    draws around them."""
    fn.working_precision = working_precision
    fn.unsupported_reason = reason
    if fault is not None:
        fn.known_fault = fault
    if defect is not None:
        fn.known_defect = defect
    fn.supports = lambda spec, dtype, device: (reason(spec, dtype, device) is None
                                               and (fault is None or fault(spec, dtype, device) is None))
    return fn


def triton_reason(device: str, dtype, *, bf16_arithmetic: bool) -> str | None:
    """Why a Triton kernel cannot run here, or None.  ``bf16_arithmetic``: the kernel computes in the
    activation dtype, which the Triton interpreter gets wrong for bf16 (it multiplies bit patterns)."""
    import torch
    if not triton_runs_on(device):
        return f"Triton kernels do not run on {device} here (no GPU, TRITON_INTERPRET unset)"
    if device == "cpu" and bf16_arithmetic and dtype == torch.bfloat16:
        return ("the Triton interpreter computes bf16 arithmetic on raw bit patterns and this kernel computes "
                "in the activation dtype (runs on a GPU)")
    return None


def heads(x, head_size: int) -> int:
    return x.shape[1] // head_size
