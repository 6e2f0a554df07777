"""An adapter module imported over a stand-in ``flashinfer`` package (no GPU, no FlashInfer), or over
the real one where it runs (:func:`real_adapter`).  The stand-in's submodules hold the callables
given, and the real modules come back at once (the adapter binds its ``flashinfer.*`` modules at
import), so a real FlashInfer imports as before."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

VERSION = "0.7.4-stand-in"


def import_over_stand_in(adapter: str, callables: dict[str, dict]):
    """``adapter`` imported with ``flashinfer.<sub>`` holding ``callables[sub]`` ({name: callable})."""
    package = types.ModuleType("flashinfer")
    package.__version__ = VERSION
    modules = {"flashinfer": package}
    for sub, names in callables.items():
        module = types.ModuleType(f"flashinfer.{sub}")
        for name, fn in names.items():
            setattr(module, name, fn)
        setattr(package, sub, module)
        modules[f"flashinfer.{sub}"] = module
    with pytest.MonkeyPatch.context() as mp:
        for name, module in modules.items():
            mp.setitem(sys.modules, name, module)
        mp.delitem(sys.modules, adapter, raising=False)
        before = set(sys.modules)
        imported = importlib.import_module(adapter)
        # The adapter and every adapter it imported bound the stand-in: none of them stays importable
        # (rope.backends.flashinfer, say, would report FlashInfer installed to the tests after these).
        for name in set(sys.modules) - before:
            if name.startswith("rope.backends."):
                del sys.modules[name]
    return imported


def real_adapter(adapter: str):
    """``adapter`` over the real FlashInfer, or a skip saying what is missing (a GPU, the package)."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("FlashInfer's kernels run on CUDA only")
    try:
        return importlib.import_module(adapter)
    except ImportError as exc:
        pytest.skip(f"FlashInfer is not importable here ({exc}); on the GPU box: . lab/offline/gpu_peers_env.sh")
