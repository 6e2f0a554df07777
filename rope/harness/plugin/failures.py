"""A run's failures, one block per cause (rope.harness.causes): each failed suite test's report
carries its cause; the terminal prints the smallest case of each cause in full, counts the others
under it, and ends with the causes; the run report gets the same.

``--full-trace`` or ``-v`` keeps every failure's block and every frame."""

from __future__ import annotations

import re

from rope.harness import causes
from rope.harness.suite import COMPARISONS_PROPERTY, is_suite_module



def _keeps_everything(config) -> bool:
    return bool(config.getoption("fulltrace", False)) or config.get_verbosity() > 0


def _in_suite(item) -> bool:
    return is_suite_module(getattr(getattr(item, "module", None), "__name__", None))


def before_report(item, call) -> None:
    """Before pytest renders a failure: the harness's frames leave a suite test's traceback, and
    (unless -v) Hypothesis's notes that say nothing of the implementation: its explanation (the
    lines of the harness only failing cases ran) and the repr of each drawn case (tens of lines;
    the failure message has the case's two-line summary)."""
    if call.excinfo is None or not _in_suite(item) or item.config.getoption("fulltrace", False):
        return
    import pytest
    if call.excinfo.errisinstance((pytest.skip.Exception, pytest.xfail.Exception, pytest.exit.Exception)):
        return            # not a failure: pytest locates a skip by its frames
    try:
        causes.hide_harness_frames(call.excinfo)
        if not _keeps_everything(item.config):
            quiet_notes(call.excinfo.value)
    except Exception:   # noqa: BLE001 - a traceback left whole is better than a lost failure
        pass


_DRAW_NOTE = re.compile(r"^Draw (\d+)(?: \(([^)]*)\))?: ")


def quiet_notes(exc: BaseException) -> None:
    """Drop Hypothesis's explanation notes and fold each multi-line draw repr into one line, on
    ``exc`` and the exceptions it groups (Hypothesis reports several distinct failures as a group)."""
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        notes = getattr(e, "__notes__", None)
        if notes:
            kept = []
            for note in notes:
                if note.startswith("Explanation:"):
                    continue
                match = _DRAW_NOTE.match(note)
                if match and "\n" in note:
                    name = f" ({match.group(2)})" if match.group(2) else ""
                    note = f"Draw {match.group(1)}{name}: summarized above (case:, spec:); -v prints it whole"
                kept.append(note)
            e.__notes__ = kept
        stack.extend(getattr(e, "exceptions", ()) or ())
        stack.extend(x for x in (e.__cause__, e.__context__) if x is not None)


# The option that names the implementation each kind of suite test takes.
_IMPL_OPTIONS = {"impl_name": "--rope-impl", "positions_impl_name": "--rope-position-step-impl",
                 "position_ids_impl_name": "--rope-position-ids-impl", "table_impl_name": "--rope-table-impl"}
_IMPL_OPTIONS["fused_impl_name"] = "--rope-fused-impl"


def rerun_command(item) -> str:
    """A command that reruns this one test from any directory: the suite test named by its module
    (``--pyargs``: no path that holds only where the run stood), without a fail-fast round, with
    the implementation and the device it took, from the directory the run started in (where the
    user's module and the Hypothesis database are)."""
    import shlex

    from rope.harness.plugin.rounds import without_round
    module = getattr(getattr(item, "module", None), "__name__", "")
    name = without_round(f"x::{item.name}").split("::", 1)[1]
    args = ["pytest", "-p", "no:randomly", "--pyargs", f"{module}::{name}"]
    params = getattr(getattr(item, "callspec", None), "params", {})
    for fixture, option in _IMPL_OPTIONS.items():
        if fixture in params:
            args += [option, str(params[fixture])]
    if "device" in params:
        args += ["--rope-device", str(params["device"])]
    profile = item.config.getoption("hypothesis_profile", None)
    if profile:
        args += ["--hypothesis-profile", profile]
    here = str(item.config.invocation_params.dir)
    return f"cd {shlex.quote(here)} && {shlex.join(args)}"


def after_report(item, call, report, comparisons_before: int) -> None:
    """The cause of a failed call, and the comparisons the test made, on its report (xdist sends
    user properties to the controller)."""
    from rope.harness import report as run_report
    if report.when != "call":
        return
    report.user_properties.append((COMPARISONS_PROPERTY, run_report.COMPARISONS[0] - comparisons_before))
    if report.failed and call.excinfo is not None:
        try:
            info = causes.failure_of(call.excinfo.value)
        except Exception as exc:   # noqa: BLE001
            info = {"cause": "unknown", "headline": f"(cause not found: {type(exc).__name__}: {exc})"}
        if _in_suite(item):
            try:
                info["rerun"] = rerun_command(item)
                report.sections.append(("rope-harness: rerun this test (from any directory)", info["rerun"]))
            except Exception:   # noqa: BLE001 - the failure is reported all the same
                pass
        report.user_properties.append((causes.REPORT_PROPERTY, info))


def failure_info(report) -> dict | None:
    for name, value in getattr(report, "user_properties", ()):
        if name == causes.REPORT_PROPERTY and isinstance(value, dict):
            return {"test": node_id(report), **value}
    return None


def node_id(report) -> str:
    """The report's node id, with its file where pytest leaves it out (a module named by ``--pyargs``
    outside the rootdir has the id ``::test_name``)."""
    if report.nodeid.startswith("::") and getattr(report, "location", None):
        return f"{report.location[0]}{report.nodeid}"
    return report.nodeid


def record_failure(report) -> None:
    """The controller's record of a failed suite test (summary.md groups them by cause); the caller
    records on the controller only."""
    info = failure_info(report)
    if info is None:
        return
    from rope.harness import report as run_report
    run_report.record(kind="failure", **info)


def _groups(terminalreporter) -> list[dict]:
    failures = [(r, failure_info(r)) for r in terminalreporter.stats.get("failed", [])]
    by_test = {info["test"]: r for r, info in failures if info is not None}
    groups = causes.group([info for _, info in failures if info is not None])
    for g in groups:
        g["reports"] = [by_test[f["test"]] for f in [g["representative"], *g["others"]]]
    return groups


def shorten_failures(terminalreporter) -> list[dict]:
    """Before pytest prints the failures: only the representative of each cause (its smallest
    case) is printed in full, with a section naming how many other tests failed of it; the others
    leave the failures section (unless -v or --full-trace) and come back for pytest's short summary
    and counts (:class:`RestoreFailed`)."""
    groups = _groups(terminalreporter)
    if not groups:
        return groups
    stats = terminalreporter.stats
    everything = list(stats.get("failed", []))
    grouped = [r for g in groups for r in g["reports"]]
    ungrouped = [r for r in everything if all(r is not g for g in grouped)]
    stats["failed"] = [r for g in groups for r in g["reports"]] + ungrouped
    if _keeps_everything(terminalreporter.config):
        return groups
    terminalreporter.config._rope_all_failed = everything
    stats["failed"] = [g["reports"][0] for g in groups] + ungrouped
    for g in groups:
        if g["others"]:
            g["reports"][0].sections.append((
                "rope-harness", f"{len(g['others'])} more failed of this cause ({g['cause']}): listed at the "
                                f"end and in reports/summary.md; -v prints each"))
    return groups


class RestoreFailed:
    """Puts every failed test back after pytest printed the failures section (a plain
    pytest_terminal_summary runs between the terminal's printing of the failures and its short
    summary)."""

    def pytest_terminal_summary(self, terminalreporter, config):
        everything = getattr(config, "_rope_all_failed", None)
        if everything is not None:
            terminalreporter.stats["failed"] = everything
            config._rope_all_failed = None


def write_causes(terminalreporter, groups: list[dict]) -> None:
    """After the failures: the causes, the largest first, with the smallest case of each."""
    if not groups:
        return
    total = sum(g["count"] for g in groups)
    terminalreporter.write_sep("=", f"rope-harness: {total} failed, {len(groups)} "
                                    f"cause{'s' if len(groups) != 1 else ''}", red=True, bold=True)
    for line in causes.terminal_lines(groups):
        terminalreporter.write_line(line)
