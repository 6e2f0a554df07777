"""What every checked thing's modes share: whether an implementation is checked in a mode on a
device (its ``modes`` declaration, rope.implementation.MODES, and what the device can run), and the
capture of one call in a CUDA (HIP) graph as engines capture theirs.

Engines do not call a kernel eagerly once: vLLM's model runner keeps persistent input buffers,
refills them in place every step and replays a CUDA graph captured on them once.  Each slice holds
its own calls to that (rope.harness.rotation.modes, rope.harness.position_step.modes); the warm-up,
the capture and the failure of a capture are these, the same for all.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

from rope.implementation import Implementation

__all__ = ["GraphCaptureFailed", "capture_graph", "declared_mode_reason", "graph_device", "mode_words"]

T = TypeVar("T")


def mode_words(mode: str) -> str:
    return {"eager": "eagerly", "compile": "under torch.compile", "graph": "in a CUDA graph"}[mode]


def declared_mode_reason(impl: Implementation, mode: str, device: str) -> str | None:
    """Why ``impl`` is not checked in ``mode`` on ``device`` for want of a declaration or of a GPU
    (None: nothing here stops it; a slice adds its own reasons, e.g. the rotation's compile probe)."""
    if mode not in impl.modes:
        return f"{impl.name or 'the implementation'} declares modes={impl.modes}: not called {mode_words(mode)}"
    if mode == "graph" and not device.startswith(("cuda", "rocm")):
        return f"a CUDA/HIP graph needs a GPU (device {device})"
    return None


def graph_device(device: str) -> torch.device:
    """The torch device of a device label (HIP runs under torch's ``cuda``)."""
    return torch.device(device if device != "rocm" else "cuda")


class GraphCaptureFailed(Exception):
    """The call raised while being captured (a host sync, an allocation the capture forbids)."""


def capture_graph(call: Callable[[], T], fill: Callable[[], None], device: str,
                  warmups: int = 2) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm ``call`` up eagerly, ``fill`` (which writes the first inputs into the static buffers
    ``call`` reads) before each warm-up, on a side stream, as torch.cuda.graphs.make_graphed_callables
    does; fill again and capture one call.  Returns the graph and what the captured call returned
    (tensors in the graph's memory, rewritten by each replay).  A warm-up that raises propagates as
    it is (an eager failure); a capture that raises is GraphCaptureFailed."""
    dev = graph_device(device)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fill()
            call()
    torch.cuda.current_stream(dev).wait_stream(side)
    fill()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            returned = call()
    except Exception as exc:  # noqa: BLE001 - an implementation that declares the mode and cannot be captured
        raise GraphCaptureFailed(f"its call cannot be captured in a CUDA graph: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return graph, returned
