"""Launching a Triton kernel that Triton has compiled through the compiled kernel's own launcher.

``kernel[grid](*args, **constexprs)`` spends tens of microseconds of a serving host's Python before
the GPU sees the launch: it binds the arguments, specializes each one, builds a cache key from the
specialization and a string of the options, looks the compiled kernel up, checks the globals the
kernel read, builds launch metadata and only then calls the compiled kernel's launcher
(``CompiledKernel.run``).  A caller that has already computed its launch (grid, constexprs, compile
options: rope/triton/rotary_plan.py) needs only the last step.

:func:`launch` keeps, per kernel, the compiled kernel that Triton's own path returned for a key made
of the caller's plan and what Triton specializes the runtime arguments on: each integer's value
(Triton reads whether it is 1, divisible by 16 and its width) and each tensor's dtype and address
modulo 16 (its 16-byte alignment).  The key is finer than Triton's specialization (every integer
value, not its class), so a key seen before always names the kernel Triton would pick; a new key
takes Triton's path once (compiling, or finding the kernel in Triton's cache) and keeps the result.

Triton's path is taken every time where this shortcut could launch something else than Triton would:
the interpreter and any kernel object that is not a compiled ``JITFunction`` (tests record launches
by replacing the kernel), a backend that specializes arguments on more than divisibility (AMD's
buffer-op ranges), and launch hooks (profilers such as proton read them).  The launcher's argument
list (``gx, gy, gz, stream, function, metadata, launch_metadata, enter_hook, exit_hook, *args``) is
the one Triton's ``JITFunction.run`` and ``CompiledKernel.__getitem__`` use in Triton 3.6 to 3.9;
a Triton without ``triton.knobs`` (before 3.4) always takes its own path.  Triton knobs that change
what Triton compiles (``TRITON_DEBUG``, instrumentation) are read by its own path only: after
changing one at run time, :func:`forget` the kernel's kept launches.
"""

from __future__ import annotations

import os

from triton.backends.compiler import BaseBackend
from triton.runtime.jit import JITFunction

try:                  # Triton 3.4 and later; older ones (Intel's XPU Triton 3.3) take Triton's path always
    from triton import knobs
except ImportError:
    knobs = None

__all__ = ["LIMIT", "enabled", "forget", "kept", "launch"]

# Compiled kernels kept per kernel object (a key's entry: the launcher, the function handle, the
# packed metadata, the constexpr values in parameter order); forgotten all at once past this many.
LIMIT = 4096
_ATTRIBUTE = "_rope_compiled_launches"


def _hooks_set() -> bool:
    """Whether a launch hook is registered (Triton's HookChain from 3.5; a callable before)."""
    runtime = knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _base_specialization(backend) -> bool:
    """Whether the backend specializes ints and tensors as Triton's base backend does (divisibility
    by 16 only), the facts the key holds."""
    cls = type(backend)
    return all(getattr(BaseBackend, name, None) is not None
               and getattr(cls, name, None) is getattr(BaseBackend, name)
               for name in ("get_int_specialization", "get_tensor_specialization"))


class _Compiled:
    """What the launches of one kernel need from Triton, found once."""

    def __init__(self):
        self.current_device, self.current_stream = _driver_functions()
        self.entries: dict = {}
        self.eligible: dict = {}          # device -> whether the backend's specialization is the base one

    def device_eligible(self, kernel, device) -> bool:
        eligible = self.eligible.get(device)
        if eligible is None:
            caches = getattr(kernel, "device_caches", None)
            backend = caches[device][3] if caches is not None and device in caches else None
            if backend is None:
                return False           # Triton has not bound this device yet: its own path does that first
            eligible = self.eligible[device] = _base_specialization(backend)
        return eligible


def _driver_functions():
    """Triton's active driver's current device and stream (what its own launch path reads)."""
    from triton.runtime import driver
    return driver.active.get_current_device, driver.active.get_current_stream


def _argument_key(args) -> tuple | None:
    """Each integer's value, each tensor's dtype and address modulo 16; None for anything else."""
    try:
        return tuple([a if a.__class__ is int else (a.dtype, a.data_ptr() & 15) for a in args])
    except AttributeError:
        return None


def enabled() -> bool:
    """ROPE_TRITON_LAUNCHER=0 sends every launch through Triton's own path (for comparing the two);
    so does a Triton without ``triton.knobs`` (before 3.4), whose launch hooks live elsewhere."""
    return knobs is not None and os.environ.get("ROPE_TRITON_LAUNCHER", "1") != "0"


def launch(kernel, grid: tuple, args: tuple, constexprs: dict, plan_key) -> None:
    """Launch ``kernel[grid](*args, **constexprs)``; ``plan_key`` names the grid and the constexprs
    (and the compile options among them) of this call, hashable."""
    if not (_ENABLED and isinstance(kernel, JITFunction)):
        kernel[grid](*args, **constexprs)
        return
    compiled = kernel.__dict__.get(_ATTRIBUTE)
    if compiled is None:
        compiled = kernel.__dict__[_ATTRIBUTE] = _Compiled()
    device = compiled.current_device()
    arguments = _argument_key(args)
    key = (plan_key, device, arguments)
    entry = compiled.entries.get(key) if arguments is not None else None
    if entry is not None and not _hooks_set():
        run, function, metadata, constants = entry
        run(*grid, compiled.current_stream(device), function, metadata, None, None, None, *args, *constants)
        return
    found = kernel[grid](*args, **constexprs)
    if arguments is not None:
        _keep(compiled, kernel, found, grid, len(args), constexprs, key)


def _keep(compiled: _Compiled, kernel: JITFunction, found, grid: tuple, num_args: int, constexprs: dict,
          key: tuple) -> None:
    """Keep the compiled kernel Triton's path launched, under this call's key, where the key is exact."""
    if len(grid) != 3:
        return                                        # callers pass 3-D grids; keeps run() a plain unpack
    if hasattr(found, "result"):                      # Triton's asynchronous compile mode: a future
        found = found.result()
    if found is None or not compiled.device_eligible(kernel, key[1]):
        return
    # The launcher takes every parameter in order, constexprs included (it skips them): the
    # keywords must be exactly the parameters after the positional ones, plus compile options.
    rest = [p.name for p in kernel.params][num_args:]
    if {name for name in constexprs if name not in _COMPILE_OPTIONS} != set(rest):
        return                                        # a parameter left to its default: Triton's path binds it
    constants = tuple(constexprs[name] for name in rest)
    if len(compiled.entries) >= LIMIT:
        compiled.entries.clear()
    compiled.entries[key] = (found.run, found.function, found.packed_metadata, constants)


_COMPILE_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "launch_pdl",
                              "launch_cooperative_grid", "maxnreg", "debug"})
_ENABLED = enabled()


def forget(kernel) -> None:
    """Drop the compiled kernels kept for ``kernel`` (tests; a kernel recompiled under new knobs)."""
    if isinstance(kernel, JITFunction):
        kernel.__dict__.pop(_ATTRIBUTE, None)


def kept(kernel) -> int:
    """How many keys of ``kernel`` launch through the compiled kernel's launcher."""
    compiled = kernel.__dict__.get(_ATTRIBUTE) if isinstance(kernel, JITFunction) else None
    return 0 if compiled is None else len(compiled.entries)
