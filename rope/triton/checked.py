"""The calls whose metadata the public entries have checked, so that a serving engine's steady
state (the same buffers every step) pays for the checks once.

A call's signature is its scalars and, for each tensor, its dtype, shape, strides, device and
address: everything the entries' checks read but the values (the overlap checks read addresses,
sizes and strides only: rope/overlap.py).  A call with a signature seen before passes them again,
and finds what the entry derived from them the first time (whether it must copy a strided input).
An entry that reads values as well (rope.spec.checks_values: the CPU, or ROPE_CHECK_VALUES=1) has no
signature: every call of it is checked whole, as it reads the values anyway.
"""

from __future__ import annotations

from rope.spec import checks_values

__all__ = ["CheckedCalls"]


def _metadata(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device, t.data_ptr())


class CheckedCalls:
    """Signatures that passed, each with what the entry derived from it, at most ``limit`` (then
    forgotten all at once)."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._seen: dict = {}

    @staticmethod
    def signature(scalars: tuple, tensors: tuple, *, values_read_from=None):
        """The call's signature, or None where there is none to trust (an argument that is not a
        tensor, a tensor without storage such as a fake one while tracing) or where the entry reads
        values: ``values_read_from``, the tensor whose device decides whether it does
        (rope.spec.checks_values, asked at every call: ROPE_CHECK_VALUES may be set at any time)."""
        try:
            signature = (*scalars, *map(_metadata, tensors))
            hash(signature)
        except (AttributeError, TypeError, RuntimeError, NotImplementedError):
            return None
        if values_read_from is not None and checks_values(values_read_from):
            return None
        return signature

    def get(self, signature):
        """What was kept for ``signature`` when it passed; None if it has not (or has no signature)."""
        return None if signature is None else self._seen.get(signature)

    def add(self, signature, derived=True) -> None:
        if signature is None:
            return
        if len(self._seen) >= self.limit:
            self._seen.clear()
        self._seen[signature] = derived

    def __len__(self) -> int:
        return len(self._seen)

    def clear(self) -> None:
        self._seen.clear()
