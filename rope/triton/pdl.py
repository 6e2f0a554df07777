"""Programmatic dependent launch (Hopper and later; Triton >= 3.4), for every kernel of the project.

A kernel launched with ``launch_pdl=True`` calls ``gdc_wait()`` (the previous kernel in the stream
has finished and flushed) before it reads anything and ``gdc_launch_dependents()`` to let the next
kernel launch while it runs: the next launch and prologue overlap this kernel's body.  Kernel
modules import the two functions only when ``HAS_PDL`` (a constexpr-false branch never resolves
them), and launch with PDL only where ``pdl_available`` (rope/triton/targets.py: the launch
target's own answer).
"""

from __future__ import annotations


try:
    from triton.backends.nvidia.compiler import CUDAOptions
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401  (re-exported)
    HAS_PDL = "launch_pdl" in CUDAOptions.__dataclass_fields__
    __all__ = ["HAS_PDL", "gdc_launch_dependents", "gdc_wait"]
except ImportError:
    HAS_PDL = False
    __all__ = ["HAS_PDL"]

