"""Whether tensors share memory, decided from their metadata alone.

An in-place rotation of overlapping memory is a silent wrong answer: an expanded ``query``
(stride 0) rotates one row several times, a ``key`` that is ``query`` rotates it twice, and a
``query`` that overlaps ``cos_sin_cache`` overwrites the table it is reading.  These checks read
sizes, strides and addresses only: no element is read, so they cost no host sync on a GPU and
work on ``meta`` tensors.

They are exact for the layouts rotations take (2-D tensors; two views of one buffer with
unit inner stride and one row stride, such as q and k sliced from a packed qkv).  Anything
else that shares an address range is reported as overlapping: the harness cannot prove it
disjoint cheaply, and an in-place kernel must not guess.
"""

from __future__ import annotations

from math import gcd

import torch


def _spread(t: torch.Tensor) -> list[tuple[int, int]]:
    """(stride, size) of the dims that step through memory, smallest stride first."""
    return sorted((abs(stride), size) for size, stride in zip(t.shape, t.stride()) if size > 1)


def overlaps_itself(t: torch.Tensor) -> bool:
    """True when two elements of ``t`` may be one memory location."""
    dims = _spread(t)
    if not dims or t.numel() == 0:
        return False
    if dims[0][0] == 0:                      # expanded: a stride-0 dim of size > 1
        return True
    if len(dims) == 2:
        # Elements i*s1 + j*s2 (i < a, j < b) collide iff some (di, dj) != 0 with di*s1 == dj*s2;
        # the smallest such pair is (s2/g, s1/g), g = gcd(s1, s2).
        (s1, a), (s2, b) = dims
        g = gcd(s1, s2)
        return s2 // g <= a - 1 and s1 // g <= b - 1
    reach = 0                                # more dims: each stride must clear all smaller ones
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    last = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def _rows(t: torch.Tensor) -> tuple[int, int | None, int] | None:
    """(rows, row stride or None for a single row, width) when every row is a run of adjacent
    elements; None for any other layout."""
    if t.dim() == 1:
        return (1, None, t.shape[0]) if t.shape[0] <= 1 or t.stride(0) == 1 else None
    if t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1):
        return None
    return t.shape[0], (t.stride(0) if t.shape[0] > 1 else None), t.shape[1]


def share_memory(x: torch.Tensor, y: torch.Tensor) -> bool:
    """True when some element of ``x`` and some element of ``y`` may be one memory location."""
    if x.numel() == 0 or y.numel() == 0:
        return False
    if x.device != y.device or x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr():
        return False
    (x_lo, x_hi), (y_lo, y_hi) = _byte_range(x), _byte_range(y)
    if x_hi <= y_lo or y_hi <= x_lo:
        return False
    rx, ry, size = _rows(x), _rows(y), x.element_size()
    if rx is None or ry is None or y.element_size() != size or (y_lo - x_lo) % size:
        return True
    (tx, sx, wx), (ty, sy, wy) = rx, ry
    if sx is not None and sy is not None and sx != sy:
        return True
    stride = sx or sy or 1
    if stride <= 0:
        return True
    # x holds tx*R + cx, y holds d + ty*R + cy (cx < wx, cy < wy): they meet iff
    # cx - cy = d + k*R for some k = ty - tx, i.e. d + k*R lies in (-wy, wx).
    d = (y_lo - x_lo) // size
    k_lo = -((wy - 1 + d) // stride)         # ceil((1 - wy - d) / R)
    k_hi = (wx - 1 - d) // stride            # floor((wx - 1 - d) / R)
    return max(k_lo, -(tx - 1)) <= min(k_hi, ty - 1)


def _layout(t: torch.Tensor) -> str:
    return f"shape={tuple(t.shape)}, stride={tuple(t.stride())}, storage_offset={t.storage_offset()}"


def check_no_overlap(written: dict, read: dict) -> None:
    """Raise ``ValueError`` naming the tensors when a tensor an in-place call writes overlaps
    itself, another written tensor, or a tensor the call reads.  ``None`` entries are skipped."""
    written = {n: t for n, t in written.items() if t is not None}
    read = {n: t for n, t in read.items() if t is not None}
    for name, t in written.items():
        if overlaps_itself(t):
            raise ValueError(
                f"{name} ({_layout(t)}): its elements overlap in memory (an expanded or as_strided view); "
                f"an in-place rotation would rotate them more than once. Pass {name}.contiguous()")
    names = list(written)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if share_memory(written[a], written[b]):
                raise ValueError(
                    f"{a} and {b} overlap in memory ({a}: {_layout(written[a])}; {b}: {_layout(written[b])}); "
                    f"an in-place rotation would rotate the shared elements twice. Pass separate tensors")
        for b, r in read.items():
            if share_memory(written[a], r):
                raise ValueError(
                    f"{a} and {b} overlap in memory ({a}: {_layout(written[a])}; {b}: {_layout(r)}); "
                    f"rotating {a} in place would overwrite {b} while it is read")
