"""rope-harness: optimized rotary-embedding implementations and their contract.

The public names load on first use (PEP 562), so that importing the package, as pytest does for
the harness's plugin in every run of an environment it is installed in, costs nothing and switches
nothing: the Triton interpreter switch is thrown by ``rope.triton`` and ``rope.backends``, before
their kernels are defined.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "RopeSpec": "rope.spec",
    "cos_sin_cache": "rope.cache",
    "get_implementation": "rope.registry",
    "get_positions_implementation": "rope.registry",
    "implementations": "rope.registry",
    "positions_implementations": "rope.registry",
}

__all__ = sorted(_PUBLIC)
__rope_harness__ = True   # rope.harness checks this marker: another package named `rope` lacks it


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
