"""A tiny pytest plugin that writes what a run did as JSON lines, and the reader of those lines.

Loaded with ``-p rope.harness.mutation.records`` (the mutation runner loads it in every pytest run
it starts); inert unless a file is named, by ``--rope-mutation-records PATH`` or by the
environment variable ``ROPE_MUTATION_RECORDS``.  Each event is one line, appended with one
``write`` and not buffered, so a process that dies (a segfault, a kill at the budget) leaves every
line written before it died:

    {"event": "session", "pid": ..}                         pytest_sessionstart
    {"event": "collect", "nodeid", "outcome", "longrepr"}   a collection error
    {"event": "collected", "nodeids": [...]}                the items, in run order
    {"event": "start", "nodeid"}                            before each test's setup
    {"event": "report", "nodeid", "when", "outcome", "duration", "wasxfail",
     "longrepr", "crash", "exception", "caught"}            each setup / call / teardown report
    {"event": "finish", "exitstatus", "duration"}           pytest_sessionfinish

``exception`` is the raised exception of a failed phase, ``{"type", "message", "notes"}`` (notes:
``__notes__``, where Hypothesis puts its failing example; an exception group is described by its
first leaf, with ``"group": N``).  ``caught`` (call reports) lists what ``pytest.raises`` caught
during the test, in the same form: a dedicated test that passes because its ``pytest.raises``
caught the property's failure still yields the counterexample.  ``longrepr`` is pytest's failure
text (``--tb`` style) and ``crash`` its one-paragraph crash message.
"""

from __future__ import annotations

import builtins
import json
import os
import time
from pathlib import Path

import pytest

PLUGIN = __name__                       # for ``-p``
RECORDS_ENV = "ROPE_MUTATION_RECORDS"
OPTION = "--rope-mutation-records"
_GROUP = getattr(builtins, "BaseExceptionGroup", ())


def describe_exception(exc: BaseException) -> dict:
    """``{"type", "message", "notes"}`` of an exception (an exception group: of its first leaf)."""
    group = 0
    while isinstance(exc, _GROUP) and exc.exceptions:
        group = group or len(exc.exceptions)
        exc = exc.exceptions[0]
    try:
        message = str(exc)
    except Exception as err:                     # a broken __str__ must not lose the record
        message = f"<str() failed: {type(err).__name__}>"
    out = {"type": type(exc).__name__, "message": message,
           "notes": [str(note) for note in getattr(exc, "__notes__", None) or ()]}
    if group:
        out["group"] = group
    return out


class _RecordRaises:
    """A ``pytest.raises`` context that records the exception it handles."""

    def __init__(self, context, caught: list):
        self._context, self._caught = context, caught

    def __enter__(self):
        return self._context.__enter__()

    def __exit__(self, exc_type, exc, tb):
        handled = self._context.__exit__(exc_type, exc, tb)
        if handled and exc is not None:
            self._caught.append(describe_exception(exc))
        return handled

    def __getattr__(self, name):
        return getattr(self._context, name)


class Recorder:
    """The hooks, writing to one file (opened for appending)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._start = time.perf_counter()
        self._pending: dict = {}             # (nodeid, when) -> the exception of a failed phase
        self._caught: dict = {}              # nodeid -> what pytest.raises caught in the call

    def write(self, record: dict) -> None:
        data = (json.dumps(record, default=str) + "\n").encode()
        while data:                                  # one write for a line, in practice
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ session
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
        self._start = time.perf_counter()
        self.write({"event": "session", "pid": os.getpid()})

    def pytest_collectreport(self, report):
        if report.failed:
            self.write({"event": "collect", "nodeid": report.nodeid, "outcome": report.outcome,
                        "longrepr": report.longreprtext})

    def pytest_collection_finish(self, session):
        self.write({"event": "collected", "nodeids": [item.nodeid for item in session.items]})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.write({"event": "finish", "exitstatus": int(exitstatus),
                    "duration": round(time.perf_counter() - self._start, 3)})

    # ------------------------------------------------------------------ tests
    def pytest_runtest_logstart(self, nodeid, location):
        self.write({"event": "start", "nodeid": nodeid})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        """While the test runs, ``pytest.raises`` (and a module's own ``raises`` bound from
        pytest) records what it catches."""
        caught = self._caught[item.nodeid] = []
        original = pytest.raises

        def raises(*args, **kwargs):
            context = original(*args, **kwargs)
            if len(args) > 1:                     # the function-call form: already ran
                caught.append(describe_exception(context.value))
                return context
            return _RecordRaises(context, caught)

        module = getattr(item, "module", None)
        patch_module = module is not None and vars(module).get("raises") is original
        pytest.raises = raises
        if patch_module:
            module.raises = raises
        try:
            return (yield)
        finally:
            pytest.raises = original
            if patch_module:
                module.raises = original

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if call.excinfo is not None:
            self._pending[item.nodeid, call.when] = describe_exception(call.excinfo.value)
        return report

    def pytest_runtest_logreport(self, report):
        exception = self._pending.pop((report.nodeid, report.when), None)
        record = {"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                  "duration": round(report.duration, 4), "wasxfail": hasattr(report, "wasxfail")}
        if report.skipped and isinstance(report.longrepr, tuple):
            record["longrepr"] = str(report.longrepr[-1])          # the skip reason
        elif not report.passed:
            record["longrepr"] = report.longreprtext
            crash = getattr(report.longrepr, "reprcrash", None)
            record["crash"] = getattr(crash, "message", None)
            record["exception"] = exception if report.failed else None
        if report.when == "call":
            record["caught"] = self._caught.pop(report.nodeid, [])
        self.write(record)


_RECORDER = "rope-mutation-records"


def pytest_addoption(parser):
    parser.addoption(OPTION, default=None, metavar="PATH",
                     help=f"append one JSON line per test report to PATH (rope-harness mutants; "
                          f"default ${RECORDS_ENV})")


def pytest_configure(config):
    path = config.getoption(OPTION) or os.environ.get(RECORDS_ENV)
    if path and not config.pluginmanager.has_plugin(_RECORDER):
        config.pluginmanager.register(Recorder(path), _RECORDER)


def pytest_unconfigure(config):
    recorder = config.pluginmanager.get_plugin(_RECORDER)
    if recorder is not None:
        recorder.close()
        config.pluginmanager.unregister(recorder)


# =========================================================================== reading
def read_records(path: str | os.PathLike) -> list[dict]:
    """The records of a file (none if it does not exist); a line cut short by a crash is skipped."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "event" in record:
            out.append(record)
    return out
