"""Device discovery and the Triton backend switch.

Devices are named as users know them: ``cpu`` always, ``cuda`` (NVIDIA), ``rocm`` (AMD, where
``torch.version.hip`` is set; torch still calls it "cuda"), ``xpu`` (Intel).  Without any GPU the
Triton kernels run under Triton's interpreter on CPU tensors; the switch must be thrown before
any kernel is defined, which is why ``rope/__init__.py`` calls :func:`configure_triton` first.
"""

from __future__ import annotations

import os

import torch

DEVICE_NAMES = ("cpu", "cuda", "rocm", "xpu")


def gpu_backend() -> str | None:
    """'cuda', 'rocm' or 'xpu' for the GPU torch can use here, else None."""
    if torch.cuda.is_available():
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    return None


def is_interpreter() -> bool:
    """True when Triton kernels run under the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def configure_triton() -> None:
    """Turn on Triton's interpreter when there is no GPU (before any @triton.jit runs), with the
    corrections the kernels need on older Triton releases (rope/interpreter_fixes.py)."""
    if gpu_backend() is None and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"
    if is_interpreter():
        from rope.interpreter_fixes import index_scalars_of_any_shape
        index_scalars_of_any_shape()


def available_devices() -> list[str]:
    """Every device implementations can be checked on here: cpu first, then the GPU if any."""
    found = ["cpu"]
    gpu = gpu_backend()
    if gpu is not None:
        found.append(gpu)
    return found


def torch_device(name: str) -> torch.device:
    """The torch device for a harness device name ('rocm' is torch's 'cuda')."""
    if name not in DEVICE_NAMES:
        raise ValueError(f"device={name!r}: must be one of {DEVICE_NAMES}")
    return torch.device("cuda" if name == "rocm" else name)


def device_name(device: torch.device | str) -> str:
    """Inverse of :func:`torch_device`: the harness name of a torch device."""
    kind = torch.device(device).type
    if kind == "cuda" and getattr(torch.version, "hip", None):
        return "rocm"
    return kind


def triton_runs_on(device: str) -> bool:
    """Whether Triton kernels can run on tensors of this device here."""
    if device == "cpu":
        return is_interpreter()
    return device in ("cuda", "rocm", "xpu")


def synchronize(device: str) -> None:
    if device in ("cuda", "rocm"):
        torch.cuda.synchronize()
    elif device == "xpu":
        torch.xpu.synchronize()
