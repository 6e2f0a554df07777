"""Integer arithmetic for launch grids and tile sizes on the host.

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton ``ConstexprFunction`` objects: called
from Python each costs about 2 us (their arguments are unwrapped as constexprs), and a launch
computes five of them.  These are the same functions on Python ints.
"""

from __future__ import annotations

__all__ = ["cdiv", "next_power_of_2"]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a >= 0, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, for n >= 1 (0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
