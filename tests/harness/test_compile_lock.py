"""One compile per kernel specialization across a run's processes (rope/harness/compile_lock.py).

The CPU tests drive the lock with a stand-in for Triton's compile in forked processes that wait
for each other inside it (a barrier, no clock): calls for one specialization are never inside
together, calls for different ones are, and a process killed while it
holds a lock does not hold up the next.  Each runs the same processes without the lock as its
control: there the same-specialization calls must overlap, or the test could not fail.  On a GPU
a launch of a new specialization goes through the installed lock.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from rope.harness import compile_lock

MEET_TIMEOUT_S = 60.0       # how long a call waits for the others to be inside too (met: they overlap)


class _Source:
    """Stands in for Triton's ASTSource: only its hash names the specialization."""

    def __init__(self, name: str):
        self.name = name

    def hash(self):
        return self.name


def _meeting_compile(barrier, inside, most_inside):
    """A stand-in compile that waits for every other process's call to be inside at the same time
    (a barrier): whether the calls overlap is then what happened, not how fast the machine was.
    ``most_inside`` keeps the most calls seen inside at once."""

    def compile(src, target=None, options=None):
        with inside.get_lock():
            inside.value += 1
            most_inside.value = max(most_inside.value, inside.value)
        try:
            barrier.wait()              # the barrier's own timeout
        except threading.BrokenBarrierError:    # the others never came in: the lock kept them out
            pass
        with inside.get_lock():
            inside.value -= 1
    return compile


def _run_compiles(names, locked: bool, meet_timeout_s: float = MEET_TIMEOUT_S) -> int:
    """Each name compiled in a forked process of its own, all started together; the most calls that
    were inside the compile at once.  Calls that may overlap meet at a barrier and all run at once;
    calls the lock serializes never meet (each waits ``meet_timeout_s`` for the others, then goes on)."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(names), timeout=meet_timeout_s)
    inside, most_inside = context.Value("i", 0), context.Value("i", 0)
    fn = _meeting_compile(barrier, inside, most_inside)
    fn = compile_lock.locked_compile(fn) if locked else fn
    procs = [context.Process(target=fn, args=(_Source(name),), kwargs={"options": {"num_warps": 4}}) for name in names]
    for p in procs:
        p.start()
    for p in procs:
        p.join(len(names) * meet_timeout_s + 60)
        assert p.exitcode == 0
    return most_inside.value


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    return tmp_path / "triton-cache"


def test_one_specialization_compiles_in_one_process_at_a_time(cache_dir):
    # With the lock the three calls never meet: each waits its short while alone, one after another.
    assert _run_compiles(["a", "a", "a"], locked=True, meet_timeout_s=0.2) == 1
    assert (cache_dir / "rope-harness-locks").is_dir()
    # Control: the same three processes without the lock are inside at once.
    assert _run_compiles(["a", "a", "a"], locked=False) == 3


def test_different_specializations_compile_in_parallel(cache_dir):
    # Three specializations: all three calls inside at once (they meet at the barrier).
    assert _run_compiles(["a", "b", "c"], locked=True) == 3


def test_a_cache_directory_that_takes_no_lock_compiles_unlocked(tmp_path, monkeypatch):
    # Where no lock file can be made (here the lock directory's place is a file), the compile runs
    # as Triton's own would, unlocked, and says nothing of a wait.
    (tmp_path / "rope-harness-locks").write_text("not a directory")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    held = compile_lock._Held(compile_lock.lock_dir() / "k.lock")
    assert held.fd is None and held.waited == 0.0
    assert compile_lock.locked_compile(lambda src, target=None, options=None: "done")(_Source("k")) == "done"


def test_the_options_and_target_name_the_specialization_too():
    src = _Source("k")
    assert compile_lock.lock_key(src, None, {"num_warps": 4}) == compile_lock.lock_key(src, None, {"num_warps": 4})
    assert compile_lock.lock_key(src, None, {"num_warps": 4}) != compile_lock.lock_key(src, None, {"num_warps": 2})
    assert compile_lock.lock_key(src, "sm90", {}) != compile_lock.lock_key(src, "sm80", {})


HOLD_S = 60     # how long a holder that is not killed holds its lock


def _hold_forever(path, ready):
    held = compile_lock._Held(path)
    assert held.fd is not None
    ready.set()
    time.sleep(HOLD_S)


def test_a_killed_holder_does_not_hold_up_the_next_compile(tmp_path):
    path = tmp_path / "locks" / "k.lock"
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(target=_hold_forever, args=(path, ready))
    holder.start()
    assert ready.wait(10)
    killed_at = time.perf_counter()
    try:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        held = compile_lock._Held(path)
        # Taken long before the holder, had it lived, would have let go: the kernel freed the lock.
        assert held.fd is not None and time.perf_counter() - killed_at < HOLD_S / 4
        held.release()
    finally:
        if holder.is_alive():
            holder.kill()


def test_a_wait_is_counted_in_the_profile(tmp_path, cache_dir):
    # Another process holds the specialization's lock and dies 0.3 s later: the compile here waits
    # for it, then runs, and the profile counts one wait.
    from rope.harness import profiling
    before = profiling.snapshot()["counts"].get("compile_wait", 0)
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    path = compile_lock.lock_dir() / f"{compile_lock.lock_key(_Source('w'), None, {})}.lock"
    holder = context.Process(target=_hold_forever, args=(path, ready))
    holder.start()
    try:
        assert ready.wait(10)
        started = time.perf_counter()
        threading.Timer(0.3, lambda: os.kill(holder.pid, signal.SIGKILL)).start()
        assert compile_lock.locked_compile(lambda src, target=None, options=None: "done")(_Source("w")) == "done"
        assert time.perf_counter() - started >= 0.25
    finally:
        holder.join(10)
    assert profiling.snapshot()["counts"].get("compile_wait", 0) == before + 1
    # The run's report shows the waits under the calls that compiled.
    combined = profiling.combine([{"seconds": {"tests": 10.0, "jit": 4.0, "compile_wait": 1.0},
                                   "counts": {"jit": 2, "compile_wait": 3}, "compiles": 2, "tests": {}}])
    rows = profiling.markdown_rows(combined)
    waits = rows.index("| of which waiting for another process's compile of the same kernel (3) | 1.0 | 10.0% | 500.00 |")
    assert rows[waits - 1].startswith("| call with a Triton compile (2 compiles) |")


def test_install_wraps_tritons_compile_and_uninstall_restores():
    triton = pytest.importorskip("triton")
    import triton.compiler
    was_installed = "compile" in compile_lock._ORIGINAL
    original = compile_lock._ORIGINAL.get("compile", triton.compiler.compile)
    try:
        assert compile_lock.install()
        for f in (triton.compile, triton.compiler.compile, triton.compiler.compiler.compile):
            assert getattr(f, "__wrapped__", None) is original
        assert compile_lock.install()          # idempotent: not wrapped twice
        assert triton.compiler.compile.__wrapped__ is original
    finally:
        if not was_installed:
            compile_lock.uninstall()
            assert triton.compiler.compile is original and triton.compile is original


def test_a_new_specialization_on_a_gpu_goes_through_the_lock(device):
    # Under the plugin on a GPU the lock is installed; a kernel with a constexpr no run has used
    # before is a new specialization, whose first launch compiles (or loads) through it.
    from rope.devices import torch_device, triton_runs_on
    if device == "cpu" or not triton_runs_on(device) or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton compiles only for a GPU")
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def fill(out, VALUE: tl.constexpr):
        tl.store(out + tl.arange(0, 16), tl.full([16], VALUE, tl.int32))

    assert "compile" in compile_lock._ORIGINAL, "the plugin did not install the lock"
    out = torch.zeros(16, dtype=torch.int32, device=torch_device(device))
    value = int(time.time_ns() % 1_000_000_007)
    before = compile_lock.compiles()
    fill[(1,)](out, VALUE=value)
    assert compile_lock.compiles() == before + 1
    fill[(1,)](out, VALUE=value)            # launched before in this process: no compile
    assert compile_lock.compiles() == before + 1
    assert out.eq(value).all()
