"""Programmatic dependent launch (Hopper and later; Triton >= 3.4), for every kernel of the project.

A kernel launched with ``launch_pdl=True`` calls ``gdc_wait()`` (the previous kernel in the stream
has finished and flushed) before it reads anything and ``gdc_launch_dependents()`` to let the next
kernel launch while it runs: the next launch and prologue overlap this kernel's body.  Kernel
modules import the two functions only when ``HAS_PDL`` (a constexpr-false branch never resolves
them), and launch with PDL only where ``pdl_available``.
"""

from __future__ import annotations

import torch

try:
    from triton.backends.nvidia.compiler import CUDAOptions
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401  (re-exported)
    HAS_PDL = "launch_pdl" in CUDAOptions.__dataclass_fields__
except ImportError:
    HAS_PDL = False


def pdl_available(device: torch.device) -> bool:
    """A CUDA (not ROCm) device of compute capability >= 9, compiled (not the interpreter), and a
    Triton that has ``launch_pdl``: the launch target's own answer (rope/triton/targets.py)."""
    from rope.triton.targets import launch_target
    return launch_target(device).pdl
