"""A deadline on one call of an implementation: the harness does not trust it to return.

:func:`deadline` arms the process's watchdog thread (one thread serves every deadline).  When
the call runs past its time the watchdog first runs ``on_expiry`` (the harness writes the case
file there, so a record exists even if the call never comes back), then interrupts the main
thread with a signal whose handler raises :class:`ImplementationHung`.  That interrupts Python
code and waits such as ``time.sleep``; a call stuck in C code that never returns to the
interpreter (a hung GPU kernel inside ``synchronize``) cannot be interrupted, and the per-test
timeout (pytest-timeout, set by the plugin) ends the worker instead, after the case file was
written.

:class:`ImplementationHung` derives from ``BaseException``: an implementation's own
``except Exception`` cannot swallow it, and Hypothesis does not shrink through it (each shrink
step would wait out the deadline again); the test fails on the first hang, with its case file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

CALL_TIMEOUT_ENV = "ROPE_CALL_TIMEOUT"
DEFAULT_CALL_TIMEOUT_S = 120.0
# Not SIGALRM: pytest-timeout's signal method owns that one.
_SIGNAL = getattr(signal, "SIGUSR2", None)


class ImplementationHung(BaseException):
    """An implementation did not return within its deadline."""


def call_timeout() -> float | None:
    """Seconds one implementation call may take: ``$ROPE_CALL_TIMEOUT`` (``--rope-call-timeout``
    sets it), default 120; 0 or ``off``: no deadline."""
    raw = os.environ.get(CALL_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_CALL_TIMEOUT_S
    if raw.lower() == "off":
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{CALL_TIMEOUT_ENV}={raw!r}: must be a number of seconds, 0 or 'off'") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{CALL_TIMEOUT_ENV}={raw!r}: must be a finite number of seconds >= 0")
    return seconds or None


def _can_interrupt() -> bool:
    return (_SIGNAL is not None and hasattr(signal, "pthread_kill")
            and threading.current_thread() is threading.main_thread())


class _Watchdog:
    """One daemon thread serving every deadline of the process.  Arming and disarming take a lock
    and a notify: a thread started per call (threading.Timer) cost about 0.4 ms a check.  An armed
    deadline that expires runs its ``expire`` on this thread, outside the lock; ``disarm`` of that
    deadline waits until ``expire`` has returned."""

    def __init__(self):
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, object]] = {}      # token -> (expires at, expire)
        self._running: set[int] = set()                        # tokens whose expire is running
        self._next = 0
        self._pid = None                                       # the process the thread serves

    def arm(self, seconds: float, expire) -> int:
        with self._cond:
            if self._pid != os.getpid():      # first use, or a forked child: the thread is not here
                self._armed.clear()
                self._running.clear()
                self._pid = os.getpid()
                threading.Thread(target=self._serve, name="rope-deadline", daemon=True).start()
            self._next += 1
            self._armed[self._next] = (time.monotonic() + seconds, expire)
            self._cond.notify()
            return self._next

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)
            while token in self._running:
                self._cond.wait()

    def _serve(self) -> None:
        with self._cond:
            while True:
                if not self._armed:
                    self._cond.wait()
                    continue
                token, (at, expire) = min(self._armed.items(), key=lambda kv: kv[1][0])
                left = at - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                del self._armed[token]
                self._running.add(token)
                self._cond.release()
                try:
                    expire()
                except Exception:      # noqa: BLE001 - the watchdog must outlive any expiry
                    pass
                finally:
                    self._cond.acquire()
                    self._running.discard(token)
                    self._cond.notify_all()


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def deadline(seconds: float | None, on_expiry=None, *, what: str = "the implementation"):
    """Run the block under a deadline of ``seconds`` (None: none).  On expiry ``on_expiry()``
    runs on the watchdog thread (its exceptions are swallowed: it must not kill the watchdog),
    then :class:`ImplementationHung` is raised in the block when it can be interrupted."""
    if not seconds:
        yield
        return
    expired = threading.Event()
    interrupt = _can_interrupt()
    main = threading.main_thread().ident

    def expire():
        expired.set()
        if on_expiry is not None:
            try:
                on_expiry()
            except Exception:      # noqa: BLE001 - the interrupt below must happen regardless
                pass
        if interrupt:
            signal.pthread_kill(main, _SIGNAL)

    def handler(signum, frame):
        if expired.is_set():
            raise ImplementationHung(f"{what} did not return within {seconds:g} s")

    previous = signal.signal(_SIGNAL, handler) if interrupt else None
    token = _WATCHDOG.arm(seconds, expire)
    try:
        yield
    finally:
        try:
            # Waits for a running expiry: its work (the case file) is complete before anyone reads it.
            _WATCHDOG.disarm(token)
        finally:              # the expiry's signal may land in that wait: the handler goes back all the same
            if interrupt:
                signal.signal(_SIGNAL, previous)
