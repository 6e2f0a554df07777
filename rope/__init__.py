"""rope-harness: optimized rotary-embedding implementations and their contract.

The public names load on first use (PEP 562), so that importing the package, as pytest does for
the harness's plugin in every run of an environment it is installed in, costs nothing and switches
nothing: the Triton interpreter switch is thrown by ``rope.triton`` and ``rope.backends``, before
their kernels are defined.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "Implementation": "rope.implementation",
    "RopeSpec": "rope.spec",
    "cos_sin_cache": "rope.cache",
    "get_implementation": "rope.registry",
    "get_positions_implementation": "rope.registry",
    "implementations": "rope.registry",
    "positions_implementations": "rope.registry",
}

__all__ = sorted(_PUBLIC)
__rope_harness__ = True   # rope.harness checks this marker: another package named `rope` lacks it


def _refuse_a_shared_package() -> None:
    """PyPI's ``rope`` (the refactoring library python-lsp installs) owns this import package too:
    installed beside rope-harness, the second install overwrote the first's ``__init__.py`` (this
    file may be sitting in place of theirs) and ``pip check`` is silent.  Refuse at import, for
    both projects' users, with what to do (rope.harness.ownership says the same, in more detail)."""
    from importlib import metadata
    try:
        other = metadata.distribution("rope")
    except Exception:   # noqa: BLE001 - not installed (PackageNotFoundError), or unreadable metadata
        return
    raise ImportError(
        f"the import package 'rope' is claimed twice in this environment: by rope-harness and by the "
        f"distribution rope {other.version} (the refactoring library); each overwrote or shares the other's "
        f"files, so neither can be trusted. Give rope-harness a virtual environment of its own (python3 -m "
        f"venv .venv && .venv/bin/pip install rope-harness), or pip uninstall rope rope-harness and reinstall "
        f"the one you need with pip install --force-reinstall.")


_refuse_a_shared_package()


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
