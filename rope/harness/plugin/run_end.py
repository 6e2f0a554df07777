"""The end of a run: stop after --maxfail failures across workers (a stop file), the run's profile
recorded, and a watchdog that dumps every thread's stacks once if a process hangs after its last
test."""

from __future__ import annotations

import contextlib
import os
import sys
import time

from rope.harness.plugin.activation import is_controller


def arm_stop_file(config) -> None:
    """The controller of a fail-fast run names the stop file (rope.harness.stop) for its workers.

    Always its own: a file named in the environment already is an enclosing run's (a test that
    runs pytest inside a worker of a ``-x`` run inherits it), and reusing it would leave this run
    without a stop of its own and tie it to the other run's failures."""
    from rope.harness.stop import STOP_FILE_ENV
    if is_controller(config):
        import tempfile
        config._rope_stop_file = os.path.join(tempfile.gettempdir(), f"rope-stop-{os.getpid()}-{time.time_ns()}")
        os.environ[STOP_FILE_ENV] = config._rope_stop_file      # the workers, started later, inherit it
        _STOP_AFTER[:] = [config.getoption("maxfail"), 0]


_STOP_AFTER = [0, 0]      # [--maxfail, failures seen] in the controller of a fail-fast run


def note_failure_for_stop(report) -> None:
    """The controller counts failures; at --maxfail it tells the workers to stop (rope.harness.stop).
    (Only a fail-fast run's controller arms the count: workers and other runs return at once.)"""
    if not _STOP_AFTER[0]:
        return
    if report.failed and report.when == "call":
        _STOP_AFTER[1] += 1
        if _STOP_AFTER[1] >= _STOP_AFTER[0]:
            from rope.harness.stop import request_stop
            request_stop()


LAST_REPORT_AT = [None]      # when this process last heard of a test (the end of a run's tests)


# A process's profile is also recorded as its run goes, at most this often: a session ended by a
# signal (a campaign's deadline past its grace, a killed worker) never reaches its end, and its
# time and memory would be missing from the report.  The report keeps each process's last.
PROFILE_EVERY_S = 15.0
_PROFILE_WRITTEN = [None]     # when this process last recorded its profile (perf_counter), None: not yet


def record_profile(config, *, final: bool = True) -> None:
    """This process's time per phase (rope.harness.profiling) as a record of the run report, named by
    its process (worker and pid); ``final``: at its session's end (False: as it goes)."""
    from rope.harness import profiling, report
    started = getattr(config, "_rope_session_start", None)
    totals = profiling.snapshot()
    if started is None or not totals["counts"].get("tests"):
        return
    totals["seconds"]["session"] = round(time.perf_counter() - started, 6)
    process = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}:{os.getpid()}"
    report.record(kind="profile", process=process, final=final, **totals)


def record_profile_as_it_goes(config) -> None:
    """After a test: this process's profile so far, where PROFILE_EVERY_S have passed since the last
    (the first test only starts the clock)."""
    now, last = time.perf_counter(), _PROFILE_WRITTEN[0]
    if last is None:
        _PROFILE_WRITTEN[0] = now
    elif now - last >= PROFILE_EVERY_S:
        _PROFILE_WRITTEN[0] = now
        record_profile(config, final=False)


END_STACKS_ENV = "ROPE_END_STACKS_S"


END_STACKS_AFTER_S = 120.0


END_STACKS_FILE: list = []


def arm_end_stacks() -> None:
    """A run that hangs at its end says where.  Each process, when the teardown of its last test
    begins (session fixtures included) or else when its session ends (the xdist controller), arms
    faulthandler's watchdog (a C thread: it fires even while Python is blocked in C code): if the
    process is still alive ``$ROPE_END_STACKS_S`` seconds later (default 120; 0 or off: never),
    every thread's Python stack goes to ``end-stacks-<worker>-<pid>.txt`` in the run's record
    directory.  A process that gets as far as its exit handlers did not hang (Python joins the
    threads that would hold it before it runs them): it removes its file there, written or not (an
    xdist worker done early waits idle for the controller, and its stacks say only that), and
    points the watchdog at stderr for the rest of its shutdown."""
    from rope.harness.report import RUN_ENV
    run = os.environ.get(RUN_ENV)
    raw = os.environ.get(END_STACKS_ENV, "").strip().lower()
    try:
        seconds = END_STACKS_AFTER_S if not raw else 0.0 if raw == "off" else float(raw)
    except ValueError:
        return
    if not run or not seconds > 0 or not os.path.isdir(run):
        return
    import atexit
    import faulthandler
    if END_STACKS_FILE:
        # Armed at the last teardown: again at the session's end (pytest's faulthandler_timeout,
        # where set, cancels the watchdog after each test), for the time left, and not at all once
        # it has fired.  The watchdog reads the other threads' frames without the GIL: safe on a
        # process that is stuck, not on one still running Python (a second dump while the report
        # is written, or while the exit handlers run, can crash the process).
        out, armed_at = END_STACKS_FILE
        if os.fstat(out.fileno()).st_size > 0:
            return
        left = seconds - (time.monotonic() - armed_at)
        faulthandler.dump_traceback_later(left if left > 0 else seconds, repeat=False, file=out)
        return
    path = os.path.join(run, f"end-stacks-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.txt")
    try:
        out = open(path, "w")           # noqa: SIM115 - held open for the watchdog until the exit handlers
    except OSError:
        return
    armed_at = time.monotonic()
    END_STACKS_FILE[:] = [out, armed_at]
    faulthandler.dump_traceback_later(seconds, repeat=False, file=out)

    def at_exit():
        faulthandler.cancel_dump_traceback_later()
        out.close()
        with contextlib.suppress(OSError):
            os.remove(path)
        left = seconds - (time.monotonic() - armed_at)
        if left > 0 and sys.__stderr__ is not None:
            faulthandler.dump_traceback_later(left, repeat=False, file=sys.__stderr__)
    atexit.register(at_exit)
