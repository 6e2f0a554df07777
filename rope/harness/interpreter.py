"""Triton's interpreter without its repeated patching of ``triton.language`` on every helper call,
and without CPython's frame-stack churn.

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
every result is the same (tests/harness/test_interpreter_speed.py compares the bits).  It changes
nothing unless Triton's helper call and grid executor are the code this was written against
(Triton 3.9's): a version whose code differs keeps its own behaviour, only slower.

The grid also runs inside one large chunk of CPython's frame stack (:func:`in_one_stack_chunk`).
Since 3.11 CPython keeps a thread's frames in chunks of 16 KiB, maps a new chunk when a call does
not fit in the current one and unmaps it when that call returns.  The interpreter makes a few
hundred calls per program, each a dozen frames deep; where a program's frames happen to end near
a chunk's end, every one of those calls maps, faults in and unmaps a chunk.  Which depth that is
depends on the caller's stack (pytest, Hypothesis, the test), so the same launch took 0.9 s at one
depth and 3.3 s at another, a third of it system time (334,000 page faults), and the CPU suite
spent about a third of its time in the kernel.  A grid started from a frame that reserves half a
MiB of stack it never touches runs its programs in the rest of that frame's 1 MiB chunk: one
mapping per launch (the CPU suite on 2 cores: 763 s -> 342 s).  Upstream
(python/cpython#142183) newer CPython releases keep one chunk cached per thread; 3.11 and 3.12
unmap it every time.

:func:`skip_discarded_overflow_checks` drops work whose result the interpreter throws away.  Its
options ask for integer-overflow sanitizing and not for debug; every integer ``+``, ``-`` and ``*``
of a kernel then builds the check (the operands widened to 64 bits, the operation again, two
comparisons) and hands it to ``device_assert``, which returns at once without debug.  Building
them is 39% of an interpreted rotation (a 4,097-token case on one 16-channel head).  With
sanitizing off nothing is built and nothing is lost: the check is never asserted.  Under debug (or a Triton whose
``device_assert`` does not return that way) the options are left as they are.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types

_APPLIED = [False]
_ORIGINALS: dict[str, object] = {}     # Triton's own GridExecutor.__call__, InterpretedFunction.__call__ and
                                       # the interpreter builder's options

# InterpretedFunction.__call__ as Triton writes it (whitespace and comments aside).
_HELPER_CALL = """def __call__(self, *args, **kwargs):
    _patch_lang(self.fn)
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise InterpreterError(repr(e)) from e"""


def _call(fn, args, kwargs):
    return fn(*args, **kwargs)


# CPython maps a chunk of at least (frame size + 1000 words) * 8 bytes, rounded up to 16 KiB times
# a power of two, for a frame that does not fit.  A frame of 2**16 words of (unused) value stack
# gets a 1 MiB chunk and leaves just under half of it to the calls it makes; its stack slots are
# never written, so the pages behind them are never touched.
_RESERVED_STACK_WORDS = 1 << 16
_call_in_one_chunk = types.FunctionType(
    _call.__code__.replace(co_stacksize=_RESERVED_STACK_WORDS, co_name="_call_in_one_chunk"),
    _call.__globals__, "_call_in_one_chunk")


def in_one_stack_chunk(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with its frames in one fresh 1 MiB chunk of CPython's frame stack
    (3.11 and later; before 3.11 frames are separate objects and this is a plain call)."""
    if sys.version_info < (3, 11):
        return fn(*args, **kwargs)
    return _call_in_one_chunk(fn, args, kwargs)


def _normalized(source: str) -> str:
    lines = (re.sub(r"#.*", "", line).rstrip() for line in inspect.cleandoc(source).splitlines())
    return "\n".join(line for line in lines if line.strip())


def skip_repeated_patching() -> bool:
    """Install the faster helper call in Triton's interpreter (idempotent); True when installed.
    The grid runs in one stack chunk either way."""
    if _APPLIED[0]:
        return True
    _restore_calls()        # a grid wrapped by an earlier call that found an unknown helper call
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
        _install_grid_call(interpreter, grid_call)
        return False

    language = (tl, tl.core)
    modules_of: dict = {}                      # fn -> ids of the language modules its globals hold
    grids: list[set] = []                      # the language modules patched in each running grid

    def language_modules(fn) -> frozenset:
        if fn not in modules_of:
            modules_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                       if inspect.ismodule(v) and any(v is m for m in language))
        return modules_of[fn]

    def tracked_grid_call(self, *args, **kwargs):
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

    _install_grid_call(interpreter, tracked_grid_call)
    _ORIGINALS["helper"] = helper_call
    interpreter.InterpretedFunction.__call__ = interpreted_helper_call
    _APPLIED[0] = True
    return True


def _install_grid_call(interpreter, run) -> None:
    """The grid executor's call becomes ``run`` (Triton's own call, or one that wraps it) in one
    stack chunk; Triton's own is kept for :func:`restore_patching`."""
    _ORIGINALS["grid"] = interpreter.GridExecutor.__call__

    def grid_executor_call(self, *args, **kwargs):
        return in_one_stack_chunk(run, self, *args, **kwargs)

    interpreter.GridExecutor.__call__ = grid_executor_call


# TritonSemantic.device_assert's first lines as Triton writes them: without debug, nothing is asserted.
_ASSERT_ONLY_UNDER_DEBUG = "if not self.builder.options.debug:\n    return"


def skip_discarded_overflow_checks() -> bool:
    """Turn off the interpreter's overflow sanitizing where its checks are built only to be
    discarded (no debug; see the module's docstring); True when turned off (idempotent).  Every
    result is the same: tests/harness/test_interpreter_speed.py compares the bits."""
    try:
        from triton.runtime import interpreter
        from triton.language.semantic import TritonSemantic
        builder = interpreter.interpreter_builder
        options = builder.options
        discards = (_ASSERT_ONLY_UNDER_DEBUG in _normalized(inspect.getsource(TritonSemantic.device_assert))
                    and "sanitize_overflow" in {f.name for f in dataclasses.fields(options)})
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    if not discards or options.debug:
        return False
    if options.sanitize_overflow:
        _ORIGINALS.setdefault("options", options)
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def restore_patching() -> None:
    """Put Triton's own calls and options back (after :func:`skip_repeated_patching` and
    :func:`skip_discarded_overflow_checks`; for comparisons)."""
    _restore_calls()
    if "options" in _ORIGINALS:
        from triton.runtime import interpreter
        interpreter.interpreter_builder.options = _ORIGINALS.pop("options")


def _restore_calls() -> None:
    if "grid" not in _ORIGINALS and "helper" not in _ORIGINALS:
        return
    from triton.runtime import interpreter
    if "grid" in _ORIGINALS:
        interpreter.GridExecutor.__call__ = _ORIGINALS.pop("grid")
    if "helper" in _ORIGINALS:
        interpreter.InterpretedFunction.__call__ = _ORIGINALS.pop("helper")
    _APPLIED[0] = False
