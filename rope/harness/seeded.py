"""Random tensors made on any device from a seed, the same bits on every device.

Each element is a hash of ``(seed, stream, index)``: SplitMix64's finaliser in int64 tensor
arithmetic (multiplication wraps modulo 2^64 on every torch device; the right shifts are masked to
act as logical shifts).  Element ``i`` of a stream depends on nothing else: not on how many elements
were drawn before it, not on the device.  From the hash:

- an integer in ``[low, high)``: its top 62 bits modulo the range (a bias below 2^-40 for the
  ranges drawn here);
- a normal-like value: the sum of its four 16-bit lanes read as int16, plus 2, times 2^-15 (an
  Irwin-Hall approximation of a normal: mean 0, standard deviation 1.155, every value in [-4, 4]).
  It is an integer times a power of two below 2^24, exact in float32, so its one rounding to bf16
  or fp16 is the same round-to-nearest-even on every device.  No transcendental function is used: a
  device's ``log`` or ``cos`` may differ from another's in the last bit.

:func:`draw_many` makes the tensors of many requests (each a seed, a stream, a count and a range) in
one pass over their concatenated elements: a fixed number of elementwise kernels however many
requests, where a ``torch.Generator`` on the host draws each tensor and then copies it.  Elements go
through in chunks of :data:`CHUNK` (cache-sized int64 temporaries, reused).  :func:`scalar` is one
integer element computed with Python integers on the host (a position pattern's start), with no
device round trip.  :class:`CounterDraws` and :class:`HostDraws` are the two draw sources a case's
builder takes (``draws_for(case.generator, seed, device)``): the same calls, from the counter on a
device, or from a ``torch.Generator`` on the host in call order (the cases written before the counter).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

__all__ = ["CHUNK", "NORMAL_STD", "CounterDraws", "HostDraws", "Request", "draw_many", "draws_for", "integers", "normals",
           "scalar"]

_GOLDEN = 0x9E3779B97F4A7C15          # SplitMix64's increment: element i's counter is start + (i + 1) * golden
_STREAM = 0xD1B54A32D192ED03          # a stream's offset within a seed
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
CHUNK = 1 << 18
NORMAL_STD = (4 * ((1 << 32) - 1) / 12) ** 0.5 / (1 << 15)      # 1.1547


def _signed(v: int) -> int:
    """The int64 holding the 64-bit pattern ``v``."""
    v &= _MASK64
    return v - (1 << 64) if v >> 63 else v


def _start(seed: int, stream: int) -> int:
    """The counter before element 0 of ``stream`` under ``seed`` (a 64-bit pattern)."""
    return (seed * _GOLDEN + (stream + 1) * _STREAM) & _MASK64


def _mix(z: int) -> int:
    """SplitMix64's finaliser on a 64-bit pattern held as a Python int."""
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def scalar(seed: int, stream: int, index: int, low: int, high: int) -> int:
    """Element ``index`` of the integers of ``Request(seed, stream, ..., low, high)``, on the host."""
    Request(seed, stream, index + 1, low, high)            # the same bounds, the same ValueErrors
    z = _mix((_start(seed, stream) + (index + 1) * _GOLDEN) & _MASK64)
    return low + (z >> 2) % (high - low)


@dataclass(frozen=True)
class Request:
    """``count`` elements of ``stream`` under ``seed``: integers in ``[low, high)``, or normal-like
    float32 values where ``high`` is None."""
    seed: int
    stream: int
    count: int
    low: int = 0
    high: int | None = None

    def __post_init__(self):
        if self.count < 0:
            raise ValueError(f"count={self.count}: must be >= 0")
        if self.high is not None and not self.low < self.high <= self.low + (1 << 62):
            raise ValueError(f"high={self.high}: must exceed low={self.low} by at most 2**62 (the hash's bits)")


def _hashes_(z: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 bit patterns ``z``, in place (``tmp``: scratch of z's size)."""
    for shift, multiplier in ((30, _M1), (27, _M2), (31, None)):
        torch.bitwise_right_shift(z, shift, out=tmp)
        tmp.bitwise_and_((1 << (64 - shift)) - 1)          # the logical shift's zeros at the top
        z.bitwise_xor_(tmp)
        if multiplier is not None:
            z.mul_(_signed(multiplier))
    return z


def _draw_group(requests: list[Request], integer: bool, device) -> list[torch.Tensor]:
    """The tensors of requests of one kind (all integer or all normal), one pass over their elements."""
    counts = [r.count for r in requests]
    total = sum(counts)
    out = torch.empty(total, dtype=torch.int64 if integer else torch.float32, device=device)
    if total:
        # Element j of the concatenation is element i = j - offset_r of request r: its counter is
        # start_r + (i + 1) * golden = (start_r - offset_r * golden) + (j + 1) * golden (mod 2^64).
        bases, ranges, offset = [], [], 0
        for r in requests:
            bases.append(_signed(_start(r.seed, r.stream) - offset * _GOLDEN))
            ranges.append(0 if r.high is None else r.high - r.low)
            offset += r.count
        one = len(requests) == 1          # then the request's numbers are scalars: nothing to copy to the device
        if not one:
            table = torch.tensor([list(accumulate(counts)), bases, ranges, [r.low for r in requests]],
                                 dtype=torch.int64)
            if torch.device(device).type == "cuda":    # pinned, not waited for: the calls before it go on
                table = table.pin_memory().to(device, non_blocking=True)
            else:
                table = table.to(device)
            ends, base, span, low = table
        chunk = min(CHUNK, total)
        z = torch.empty(chunk, dtype=torch.int64, device=device)
        tmp = torch.empty_like(z)
        owner = None if one else torch.empty_like(z)
        lanes = None if integer else torch.empty(chunk, dtype=torch.int32, device=device)
        for start in range(0, total, chunk):
            n = min(chunk, total - start)
            zz, tt = z[:n], tmp[:n]
            torch.arange(start, start + n, dtype=torch.int64, device=device, out=zz)
            if not one:                     # the request each element belongs to
                oo = owner[:n]
                torch.searchsorted(ends, zz, right=True, out=oo)
            zz.add_(1).mul_(_signed(_GOLDEN)).add_(bases[0] if one else base[oo])
            _hashes_(zz, tt)
            piece = out[start:start + n]
            if integer:
                torch.bitwise_right_shift(zz, 2, out=tt)
                tt.bitwise_and_((1 << 62) - 1)
                if one:
                    torch.remainder(tt, ranges[0], out=piece)
                    piece.add_(requests[0].low)
                else:
                    torch.remainder(tt, span[oo], out=piece)
                    piece.add_(low[oo])
            else:
                torch.sum(zz.view(torch.int16).view(n, 4), 1, dtype=torch.int32, out=lanes[:n])
                piece.copy_(lanes[:n])
                piece.add_(2.0).mul_(2.0 ** -15)
    return list(out.split(counts))


def draw_many(requests, device="cpu") -> list[torch.Tensor]:
    """One flat tensor per request, in order, on ``device``: int64 for an integer request, float32
    for a normal one; the same bits on every device."""
    requests = list(requests)
    out: list[torch.Tensor | None] = [None] * len(requests)
    for integer in (True, False):
        idx = [i for i, r in enumerate(requests) if (r.high is not None) == integer]
        if idx:
            for i, t in zip(idx, _draw_group([requests[i] for i in idx], integer, device)):
                out[i] = t
    return out


def integers(seed: int, stream: int, shape, low: int, high: int, device="cpu") -> torch.Tensor:
    """int64 values in ``[low, high)`` of ``shape`` (row-major: element i is the stream's i-th)."""
    shape = tuple(shape)
    return draw_many([Request(seed, stream, _numel(shape), low, high)], device)[0].reshape(shape)


def normals(seed: int, stream: int, shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """Normal-like values of ``shape`` rounded once to ``dtype`` (row-major: element i is the stream's i-th)."""
    shape = tuple(shape)
    return draw_many([Request(seed, stream, _numel(shape))], device)[0].reshape(shape).to(dtype)


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# --------------------------------------------------------------------------- draw sources
class HostDraws:
    """Draws from a ``torch.Generator`` on the host, in call order (the torch-cpu cases' source:
    ``normal`` is ``torch.randn``, ``integers`` ``torch.randint``, ``uniform`` ``torch.rand``,
    ``permutation`` ``torch.randperm``, ``scalar`` one ``torch.randint`` element), the tensors on the CPU."""

    device = "cpu"

    def __init__(self, gen: torch.Generator):
        self.gen = gen

    def normal(self, shape) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.gen)

    def integers(self, shape, low: int, high: int, dtype=torch.int64) -> torch.Tensor:
        return torch.randint(low, high, tuple(shape), generator=self.gen, dtype=dtype)

    def uniform(self, shape) -> torch.Tensor:
        return torch.rand(tuple(shape), generator=self.gen)

    def permutation(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen)

    def scalar(self, low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=self.gen))


class CounterDraws:
    """The same calls from the counter on ``device``: each call the next stream of ``seed`` (so a
    case's tensors are the same bits on every device), a scalar computed on the host.  ``normal`` has
    the standard deviation :data:`NORMAL_STD`; ``uniform`` is a multiple of 2^-24 in [0, 1);
    ``permutation`` sorts drawn 62-bit keys (stably: a tie, never seen, is broken by index)."""

    def __init__(self, seed: int, device="cpu"):
        self.seed, self.device, self.stream = seed, device, 0

    def _next(self) -> int:
        self.stream += 1
        return self.stream - 1

    def normal(self, shape) -> torch.Tensor:
        return normals(self.seed, self._next(), shape, device=self.device)

    def integers(self, shape, low: int, high: int, dtype=torch.int64) -> torch.Tensor:
        return integers(self.seed, self._next(), shape, low, high, self.device).to(dtype)

    def uniform(self, shape) -> torch.Tensor:
        return integers(self.seed, self._next(), shape, 0, 1 << 24, self.device).to(torch.float32).mul_(2.0 ** -24)

    def permutation(self, n: int) -> torch.Tensor:
        keys = integers(self.seed, self._next(), (n,), 0, 1 << 62, self.device)
        return torch.sort(keys, stable=True).indices

    def scalar(self, low: int, high: int) -> int:
        return scalar(self.seed, self._next(), 0, low, high)


def draws_for(generator: str, seed: int, device="cpu"):
    """The draw source of a case's ``generator`` ("counter": on ``device``; "torch-cpu": on the host)."""
    if generator == "counter":
        return CounterDraws(seed, device)
    if generator == "torch-cpu":
        return HostDraws(torch.Generator().manual_seed(seed))
    raise ValueError(f"generator={generator!r}: must be 'counter' or 'torch-cpu'")
