"""One compile of each Triton kernel specialization across the processes of a run.

Triton keeps what it compiles in an on-disk cache that every process of the machine shares, but it
does not coordinate them: two processes that launch the same new specialization at once both
compile it, and the second write of the cache entry wins.  The test processes of a run draw from
the same strategies, so they meet the same new specializations at the same time (Hypothesis tries
the simplest case of every test first, in every process; after that, the likely shapes).  On an
H200 box, 16 processes compiling the same 48 specializations at once took 0.20-0.24 s per compile
each, where loading one that is already in the cache took 2-3 ms (both measured by
lab/bench/compile_cost.py).

:func:`install` wraps ``triton.compile`` (the name Triton's launcher calls for every
specialization a process has not launched yet).  The first process to need a specialization takes
an exclusive ``flock`` on a file named after it, in ``rope-harness-locks`` under Triton's cache
directory, compiles it and so fills the cache; any other process needing it meanwhile waits for
the lock and then finds it in the cache.  Different specializations compile in parallel as before.
The kernel releases a dead process's locks, and a wait longer than :data:`MAX_WAIT_S` compiles
anyway, so a stuck compile elsewhere never stops a run.  Where the lock cannot be used (no
``fcntl``, a read-only cache directory), the compile runs as Triton's own.

Each wait is added to the process's profile (rope.harness.profiling) as ``compile_wait``, which a
run's report shows beside the calls that compiled.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

MAX_WAIT_S = 300.0      # a compile takes 0.2 s to a few seconds (heavy spilling); a wait this long is a stuck one
_POLL_S = 0.005
_ORIGINAL: dict[str, object] = {}       # "compile": Triton's own function, while installed
_PATCHED: list[tuple[object, str]] = []  # (module, attribute) that hold the wrapper
_COMPILES = [0]                          # compiles (or cache loads) that went through a wrapper here


def lock_dir() -> Path:
    """Where the locks live: beside the compiled kernels, in Triton's cache directory."""
    try:
        from triton import knobs
        base = knobs.cache.dir
    except (ImportError, AttributeError):
        base = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return Path(base) / "rope-harness-locks"


def lock_key(src, target, options) -> str:
    """A name for one specialization: its source's hash (Triton's own, over the function, its
    signature, constexprs and attributes), the target and the compile options."""
    source = src.hash() if hasattr(src, "hash") else repr(src)
    items = sorted((str(k), repr(v)) for k, v in (options or {}).items())
    return hashlib.sha256(f"{source}|{target!r}|{items!r}".encode()).hexdigest()[:40]


class _Held:
    """An exclusive flock on one specialization's lock file, or nothing where none can be taken."""

    def __init__(self, path: Path):
        self.fd = None
        self.waited = 0.0
        try:
            import fcntl
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except (ImportError, OSError):
            return
        start = time.perf_counter()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.perf_counter() - start > MAX_WAIT_S:
                    break               # compile anyway: Triton's cache writes are atomic
                time.sleep(_POLL_S)
            except OSError:
                break
        self.waited = time.perf_counter() - start if self.fd is not None else 0.0

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)           # closing the descriptor drops the flock
            self.fd = None


def locked_compile(compile_fn):
    """``compile_fn`` (Triton's ``compile(src, target=None, options=None, ...)``) with one process
    at a time per specialization."""

    def compile(src, target=None, options=None, *args, **kwargs):
        try:
            path = lock_dir() / f"{lock_key(src, target, options)}.lock"
        except Exception:               # a source this cannot name: Triton's own compile
            return compile_fn(src, target, options, *args, **kwargs)
        held = _Held(path)
        _COMPILES[0] += 1
        try:
            if held.waited > _POLL_S:
                from rope.harness import profiling
                profiling.add("compile_wait", held.waited)
            return compile_fn(src, target, options, *args, **kwargs)
        finally:
            held.release()

    compile.__wrapped__ = compile_fn
    return compile


def compiles() -> int:
    """Calls of a wrapped compile in this process (each a compile, or a load from the cache)."""
    return _COMPILES[0]


def install() -> bool:
    """Wrap Triton's ``compile`` wherever its launcher and users look it up; False where there is
    no Triton (or none with ``triton.compiler.compile``).  Idempotent."""
    if "compile" in _ORIGINAL:
        return True
    try:
        import triton
        import triton.compiler
        import triton.compiler.compiler as compiler_module
    except ImportError:
        return False
    original = getattr(triton.compiler, "compile", None)
    if original is None:
        return False
    wrapper = locked_compile(original)
    _ORIGINAL["compile"] = original
    import triton.runtime.jit as jit_module
    for module in (triton, triton.compiler, compiler_module, jit_module):
        if getattr(module, "compile", None) is original:
            setattr(module, "compile", wrapper)
            _PATCHED.append((module, "compile"))
    return True


def uninstall() -> None:
    """Put Triton's own ``compile`` back (tests)."""
    original = _ORIGINAL.pop("compile", None)
    while _PATCHED:
        module, name = _PATCHED.pop()
        setattr(module, name, original)
