"""Triton's interpreter without its repeated patching of ``triton.language`` on every helper call.

Under ``TRITON_INTERPRET=1`` a kernel runs one program at a time in Python.  The grid executor
patches ``triton.language``'s builtins once, for the whole grid (``_patch_lang``); then every call
of a ``@triton.jit`` helper from the kernel patches them again (``InterpretedFunction.__call__``:
``inspect.getmembers`` over ``tl``, ``tl.math`` and the tensor class, per call, never undone by
the helper).  The harness's rotation kernel calls six helpers per program, and that repetition
was half of an interpreted case's time (a 4,097-token boundary case: 19.7-24.5 s, 10.8-11.6 s
without it).

:func:`skip_repeated_patching` replaces the helper call by one that patches only when the helper
sees a language module not yet patched in the running grid (``tl.cdiv`` and the rest of
``triton.language.standard`` use ``triton.language.core``, where a kernel's module imports
``triton.language``: patched at the first such call, as Triton never undoes a helper's patch),
and is otherwise the same call.  A helper then runs on the very builtins the grid patched, so
every result is the same (properties/test_interpreter_speed.py compares the bits).  It changes
nothing unless Triton's helper call and grid executor are the code this was written against
(Triton 3.9's): a version whose code differs keeps its own behaviour, only slower.
"""

from __future__ import annotations

import inspect
import re

_APPLIED = [False]
_ORIGINALS: dict[str, object] = {}     # Triton's own GridExecutor.__call__ and InterpretedFunction.__call__

# InterpretedFunction.__call__ as Triton writes it (whitespace and comments aside).
_HELPER_CALL = """def __call__(self, *args, **kwargs):
    _patch_lang(self.fn)
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise InterpreterError(repr(e)) from e"""


def _normalized(source: str) -> str:
    lines = (re.sub(r"#.*", "", line).rstrip() for line in inspect.cleandoc(source).splitlines())
    return "\n".join(line for line in lines if line.strip())


def skip_repeated_patching() -> bool:
    """Install the faster helper call in Triton's interpreter (idempotent); True when installed."""
    if _APPLIED[0]:
        return True
    try:
        from triton.runtime import interpreter
        import triton.language as tl
        helper_call = interpreter.InterpretedFunction.__call__
        grid_call = interpreter.GridExecutor.__call__
        known = (_normalized(inspect.getsource(helper_call)) == _normalized(_HELPER_CALL)
                 and "patch_scope = _patch_lang(self.fn)" in inspect.getsource(grid_call))
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    if not known:
        return False

    language = (tl, tl.core)
    modules_of: dict = {}                      # fn -> ids of the language modules its globals hold
    grids: list[set] = []                      # the language modules patched in each running grid

    def language_modules(fn) -> frozenset:
        if fn not in modules_of:
            modules_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                       if inspect.ismodule(v) and any(v is m for m in language))
        return modules_of[fn]

    def grid_executor_call(self, *args, **kwargs):
        grids.append(set(language_modules(self.fn)))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            grids.pop()

    def interpreted_helper_call(self, *args, **kwargs):
        modules = language_modules(self.fn)
        if not grids or not modules <= grids[-1]:
            # Triton never undoes a helper's patch: its modules stay patched for the rest of the grid.
            interpreter._patch_lang(self.fn)
            if grids:
                grids[-1] |= modules
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:      # noqa: BLE001 - as Triton's own helper call
            raise interpreter.InterpreterError(repr(e)) from e

    _ORIGINALS.update(grid=grid_call, helper=helper_call)
    interpreter.GridExecutor.__call__ = grid_executor_call
    interpreter.InterpretedFunction.__call__ = interpreted_helper_call
    _APPLIED[0] = True
    return True


def restore_patching() -> None:
    """Put Triton's own calls back (after :func:`skip_repeated_patching`; for comparisons)."""
    if not _APPLIED[0]:
        return
    from triton.runtime import interpreter
    interpreter.GridExecutor.__call__ = _ORIGINALS["grid"]
    interpreter.InterpretedFunction.__call__ = _ORIGINALS["helper"]
    _APPLIED[0] = False
