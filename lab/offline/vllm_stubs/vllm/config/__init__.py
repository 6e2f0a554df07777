"""Stub: stands in for vLLM's ``vllm.config`` package (vllm 0.33.0) in the trimmed carry (.vllm/site).

Our own code, not vLLM's.  vLLM's configs are pydantic dataclasses (pydantic is not on the GPU box)
whose modules import most of vLLM, so the three that the carried ops and the harness's adapters
build are plain dataclasses here, holding only what those read:

* ``CompilationConfig``: the compilation mode and backend and the custom-op switches that
  ``CustomOp`` consults to pick ``forward_native`` or the platform's method;
* ``DeviceConfig``: the device, ``"auto"`` meaning the detected platform's device type;
* ``VllmConfig``: those two (and ``model_config``, only ever None here), settling the compilation
  defaults as vLLM 0.33.0 settles them for a config built with defaults: optimization level O2, so
  mode ``VLLM_COMPILE`` unless ``TORCH_COMPILE_DISABLE=1``; then, unless ``custom_ops`` already says
  ``"all"`` or ``"none"``, ``"none"`` when Inductor compiles, else ``"all"``.  Under the default
  config an op therefore dispatches ``forward_native``, as under vLLM's own; the adapters call
  ``forward_cuda`` / ``forward_native`` by name.

``ModelConfig`` is only a name (``vllm/v1/worker/gpu/mm/rope.py`` imports it for an annotation).
Everything else is vLLM's, extracted from the wheel by lab/offline/vllm_carry.sh: ``CompilationMode`` and
``CUDAGraphMode`` (``vllm.config.compilation``) and the current-config context
``set_current_vllm_config`` / ``get_current_vllm_config(_or_none)`` /
``get_cached_compilation_config`` (``vllm.config.vllm``), re-exported here as vLLM's package does.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import torch

from vllm.config.compilation import CompilationMode, CUDAGraphMode
from vllm.config.vllm import get_cached_compilation_config, set_current_vllm_config
from vllm.config.vllm import get_current_vllm_config, get_current_vllm_config_or_none

__all__ = ["CompilationConfig", "CompilationMode", "CUDAGraphMode", "DeviceConfig", "ModelConfig",
           "VllmConfig", "get_cached_compilation_config", "get_current_vllm_config",
           "get_current_vllm_config_or_none", "set_current_vllm_config"]


def _detected_platform():
    from vllm.platforms import current_platform    # resolved on first use, as vLLM does

    return current_platform


@dataclasses.dataclass
class CompilationConfig:
    """Compilation settings, cut to what custom-op dispatch reads (vLLM's defaults for each)."""

    mode: CompilationMode | int | None = None       # None: VllmConfig decides
    backend: str = ""                               # "": the platform's compile backend
    custom_ops: list[str] = dataclasses.field(default_factory=list)
    # written by CustomOp when it decides: which ops were switched on / off
    enabled_custom_ops: collections.Counter = dataclasses.field(default_factory=collections.Counter, init=False)
    disabled_custom_ops: collections.Counter = dataclasses.field(default_factory=collections.Counter, init=False)

    def __post_init__(self) -> None:
        if self.mode is not None:
            self.mode = CompilationMode(self.mode)
        self.backend = self.backend or _detected_platform().get_compile_backend()


@dataclasses.dataclass
class DeviceConfig:
    """Where the ops run: ``device`` is "auto" (the detected platform), a type name or a torch.device."""

    device: str | torch.device | None = "auto"
    device_type: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        platform = _detected_platform()
        if isinstance(self.device, torch.device):
            kind = self.device.type
        elif self.device == "auto":
            kind = platform.device_type
            if not kind:
                raise RuntimeError(f"DeviceConfig(device='auto'): vLLM detected {type(platform).__name__}, "
                                   "which has no device type; name the device (VLLM_LOGGING_LEVEL=DEBUG "
                                   "shows why detection found none)")
        elif isinstance(self.device, str):
            kind = self.device
        else:
            raise TypeError(f"DeviceConfig: device must be 'auto', a device type or a torch.device, "
                            f"not {self.device!r}")
        self.device_type = kind
        # A platform that handles inputs on the host keeps no torch device for its own type.
        on_host = platform.uses_host_device_handling() and kind == platform.device_type
        self.device = None if on_host else torch.device(kind)


class ModelConfig:
    """A name only: the carry loads no model (``RopeState`` names the type in an annotation)."""

    def __init__(self, *args, **kwargs) -> None:
        raise NotImplementedError("the vLLM carry (.vllm/site) has no ModelConfig: no model is loaded")


@dataclasses.dataclass
class VllmConfig:
    """The parts of vLLM's engine config that the carried ops read, with the defaults settled."""

    device_config: DeviceConfig | None = None
    compilation_config: CompilationConfig | None = None
    model_config: ModelConfig | None = None         # always None here

    def __post_init__(self) -> None:
        if self.device_config is None:
            self.device_config = DeviceConfig()
        if self.compilation_config is None:
            self.compilation_config = CompilationConfig()
        comp = self.compilation_config
        # vLLM's default optimization level (O2) compiles with vLLM's own Inductor pipeline;
        # TORCH_COMPILE_DISABLE=1 turns compilation off whatever was asked.
        compile_disabled = os.environ.get("TORCH_COMPILE_DISABLE") == "1"
        if compile_disabled:
            comp.mode = CompilationMode.NONE
        elif comp.mode is None:
            comp.mode = CompilationMode.VLLM_COMPILE
        if not {"all", "none"} & set(comp.custom_ops):
            inductor_compiles = comp.backend == "inductor" and comp.mode != CompilationMode.NONE
            comp.custom_ops.append("none" if inductor_compiles else "all")
