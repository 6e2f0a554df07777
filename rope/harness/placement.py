"""Where work runs on a box with several GPUs: which GPU each test and each pytest-xdist worker
uses, and how many workers ``-n auto`` starts.

* Every test that takes a GPU ``device`` is assigned ONE visible GPU, round robin over the
  collected tests, so the tests spread evenly over all GPUs.  The assignment is a pure function of
  the collection order, which every xdist worker computes identically (xdist requires the same
  collection everywhere), and it is in the test id: ``test_x[triton-cuda:1-...]``.  The test runs
  with that GPU as the current device (tensors on ``"cuda"`` and Triton launches land there).
* Every xdist worker also takes its own GPU as its default, round robin over the visible GPUs
  (``gw0`` -> 0, ``gw1`` -> 1, ...): work that names no GPU (the CPU tests' stray ``"cuda"``
  tensors, benchmarks, mutants) spreads over the GPUs instead of piling onto GPU 0.
* ``-n auto`` starts one worker per GPU plus CPU workers as the cores allow:
  ``num_gpus + max(0, cores - num_gpus)`` workers, at least one.

Visibility is torch's: ``CUDA_VISIBLE_DEVICES`` (and ``HIP_VISIBLE_DEVICES`` on ROCm) and
``ZE_AFFINITY_MASK`` (XPU) are honoured because torch's device counts honour them; GPU ``k``
here is the k-th *visible* device.
"""

from __future__ import annotations

import contextlib
import os
import re

import torch

from rope.devices import DEVICE_NAMES, gpu_backend

GPU_KINDS = ("cuda", "rocm", "xpu")
_LABEL = re.compile(r"^(cpu|cuda|rocm|xpu)(?::(\d+))?$")


def gpu_count(kind: str | None = None) -> int:
    """Visible GPUs of ``kind`` (default: the GPU backend found here); 0 without one."""
    kind = kind or gpu_backend()
    if kind in ("cuda", "rocm"):
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "xpu":
        xpu = getattr(torch, "xpu", None)
        return xpu.device_count() if xpu is not None and xpu.is_available() else 0
    return 0


def parse_device(label: str) -> tuple[str, int | None]:
    """``"cuda:1"`` -> ``("cuda", 1)``; ``"cpu"`` -> ``("cpu", None)``."""
    m = _LABEL.match(label) if isinstance(label, str) else None
    if m is None or (m.group(1) == "cpu" and m.group(2) is not None):
        raise ValueError(f"device={label!r}: must be one of {DEVICE_NAMES}, or a GPU with an index such as 'cuda:1'")
    return m.group(1), None if m.group(2) is None else int(m.group(2))


def worker_index(worker_id: str | None) -> int | None:
    """The number of a pytest-xdist worker id (``"gw3"`` -> 3); None outside xdist."""
    if not worker_id:
        return None
    m = re.fullmatch(r"gw(\d+)", worker_id)
    if m is None:
        raise ValueError(f"worker_id={worker_id!r}: not a pytest-xdist worker id (gw<N>)")
    return int(m.group(1))


def worker_gpu(worker_id: str | None, num_gpus: int) -> int | None:
    """The default GPU of a worker: round robin over the visible GPUs; None without GPUs."""
    if num_gpus <= 0:
        return None
    index = worker_index(worker_id)
    return 0 if index is None else index % num_gpus


def auto_workers(num_gpus: int, cores: int) -> int:
    """``-n auto``: one worker per GPU, plus CPU workers for the cores the GPU workers leave."""
    return max(1, num_gpus + max(0, cores - num_gpus))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def assign_round_robin(keys: list, gpus: list[int]) -> dict:
    """Each distinct key (a test without its GPU index), in order of first appearance, gets the
    next GPU of ``gpus``: the tests spread evenly, and the same list gives the same answer
    in every process."""
    if not gpus:
        raise ValueError("gpus: at least one GPU index is needed")
    out = {}
    for key in keys:
        if key not in out:
            out[key] = gpus[len(out) % len(gpus)]
    return out


def device_label(kind: str) -> str:
    """What a result ran on, for ids and reports: ``cpu`` or ``cuda:<current device>``."""
    if kind in ("cuda", "rocm") and torch.cuda.is_available():
        return f"{kind}:{torch.cuda.current_device()}"
    if kind == "xpu" and getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        return f"xpu:{torch.xpu.current_device()}"
    return kind


@contextlib.contextmanager
def on_gpu(kind: str, index: int):
    """Make GPU ``index`` of ``kind`` the current device (new tensors on ``"cuda"`` and Triton
    launches go there), restoring the previous one afterwards."""
    if kind in ("cuda", "rocm"):
        with torch.cuda.device(index):
            yield
    elif kind == "xpu":
        with torch.xpu.device(index):
            yield
    else:
        raise ValueError(f"kind={kind!r}: must be one of {GPU_KINDS}")


def pin_worker(worker_id: str | None) -> int | None:
    """Give this xdist worker its default GPU (see :func:`worker_gpu`); returns the index."""
    kind = gpu_backend()
    index = worker_gpu(worker_id, gpu_count(kind))
    if index is not None:
        if kind in ("cuda", "rocm"):
            torch.cuda.set_device(index)
        elif kind == "xpu":
            torch.xpu.set_device(index)
    return index
