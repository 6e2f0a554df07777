"""Which compile target a launch is for, and the launch options each target may use.

The launchers were tuned on an H200 (sm_90), and some of what they ask for exists there only:
programmatic dependent launch (a PTX instruction pair and a CUDA launch attribute, compute
capability 9 and later) and the q/k ``evict_first`` cache hint (measured on the H200 alone).  A
launch for an AMD or Intel GPU, or for Triton's interpreter, must not ask for them: the launcher
reads what it may use from the :class:`Target` of the device it launches on, the way
``rope.dispatch`` chooses implementations per platform.  ``TARGETS`` names the targets the kernels
are compiled for without a GPU (tests/kernels/compile_offline.py).  What each target gets is the launch
table of docs/spec.md ("Launch options per target"); tests/kernels/test_launch_options.py pins it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from rope.devices import is_interpreter
from rope.triton.pdl import HAS_PDL

__all__ = ["INTERPRETER", "TARGETS", "Target", "cuda_target", "hip_target", "launch_target", "pdl_available",
           "xpu_target"]


@dataclass(frozen=True)
class Target:
    """What a launch for one compile target may use.  ``backend``: Triton's name for it ("cuda",
    "hip", "xpu") or "interpreter"; ``arch``: "sm_90", "gfx942", ... ("" where unknown)."""

    backend: str
    arch: str
    pdl: bool                 # programmatic dependent launch
    eviction_hints: bool      # q/k loads and stores may carry evict_first

    @property
    def compiled(self) -> bool:
        """Compiled for a GPU (not the interpreter): compile options such as num_warps apply."""
        return self.backend != "interpreter"


INTERPRETER = Target("interpreter", "", pdl=False, eviction_hints=False)


def cuda_target(capability: tuple[int, int]) -> Target:
    """An NVIDIA GPU of this compute capability (PDL from 9.0, where this Triton has it)."""
    major, minor = capability
    return Target("cuda", f"sm_{major}{minor}", pdl=HAS_PDL and major >= 9, eviction_hints=True)


def hip_target(arch: str) -> Target:
    """An AMD GPU (gfx942: MI300X, gfx90a: MI250X): no PDL; the eviction hint was never measured there."""
    return Target("hip", arch, pdl=False, eviction_hints=False)


def xpu_target(arch: str = "") -> Target:
    """An Intel GPU: no PDL; the eviction hint was never measured there."""
    return Target("xpu", arch, pdl=False, eviction_hints=False)


# The targets the kernels are compiled for on a machine without a GPU, by Triton's own backends.
TARGETS = {"sm_90": cuda_target((9, 0)), "gfx942": hip_target("gfx942"), "gfx90a": hip_target("gfx90a"),
           "pvc": xpu_target("pvc")}


@lru_cache(maxsize=None)
def _gpu_target(kind: str, index: int | None) -> Target:
    if kind == "cuda" and getattr(torch.version, "hip", None):
        arch = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device())
        return hip_target(str(getattr(arch, "gcnArchName", "")).split(":")[0])
    if kind == "cuda":
        return cuda_target(torch.cuda.get_device_capability(index))
    if kind == "xpu":
        return xpu_target()
    return INTERPRETER


def launch_target(device: torch.device) -> Target:
    """The target a launch on ``device`` compiles for (looked up once per device).  Tensors that
    live on no GPU (the CPU under the interpreter, meta tensors) launch for the interpreter."""
    if is_interpreter() or device.type not in ("cuda", "xpu"):
        return INTERPRETER
    return _gpu_target(device.type, device.index)


def pdl_available(device: torch.device) -> bool:
    """A CUDA (not ROCm) device of compute capability >= 9, compiled (not the interpreter), and a
    Triton that has ``launch_pdl``: the launch target's own answer."""
    return launch_target(device).pdl
