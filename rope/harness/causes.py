"""A failed test's cause, and a run's failures grouped by cause.

A kernel with one bug fails dozens of tests: every test that meets the bug, each with its own
traceback and case file.  The cause of a failure is what a reader would fix: the diagnosis label of
a mismatch (``axis_map_wrong``, ``wrong_positions``, ...), or, for an implementation that raised,
the exception and the line of code that raised it (``RuntimeError at mykern/rope.py:27``).  The
plugin attaches each failure's cause to its test report (:func:`failure_of`); the terminal and the
run report then show one block per cause: how many tests, the smallest case first with its case
file and the command that replays it, the others listed (:func:`group`).

The harness's own frames (this package, the reference, the suite, Hypothesis, pytest) are hidden
from a suite test's traceback (:func:`hide_harness_frames`): what is left is the failure message and
the implementation's own frames.  ``--full-trace`` shows everything.
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path

# A line of a failure message longer than this is wrapped (the terminal, summary.md).
LINE_WIDTH = 120

# What each failure says about itself, beside the report: set by the harness where it raises.
FAILURE_ATTRIBUTE = "rope_failure"
# The user property a test report carries its failure under (xdist sends it to the controller).
REPORT_PROPERTY = "rope_failure"

_LAST_CASE: list = [None]          # (size, text) of the last case this process ran


def _harness_dirs() -> tuple[str, ...]:
    """The directories whose frames are the harness's: this package, the reference, the suite, and
    the libraries that run them."""
    import _pytest
    import hypothesis
    import pluggy

    import reference
    import rope.harness
    dirs = [Path(m.__file__).resolve().parent for m in (rope.harness, reference, _pytest, hypothesis, pluggy)]
    from rope.harness.suite import suite_dir
    try:
        dirs.append(suite_dir())
    except SystemExit:
        pass
    return tuple(str(d) + "/" for d in dirs)


_DIRS: list = []


def is_harness_frame(filename: str) -> bool:
    if not _DIRS:
        _DIRS.extend(_harness_dirs())
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return path.startswith(tuple(_DIRS))


def hide_harness_frames(excinfo) -> None:
    """Drop the harness's frames from ``excinfo``'s traceback (pytest renders what is left; when
    nothing is left it prints the message alone and says how to see the frames)."""
    excinfo.traceback = excinfo.traceback.filter(lambda entry: not is_harness_frame(str(entry.path)))


def short_path(filename: str) -> str:
    """``/site/mykern/rope.py`` -> ``mykern/rope.py``: the path below the longest import root that
    holds it (the same in every process of a run), else the file's name."""
    path = str(Path(filename).resolve())
    roots = sorted((str(Path(p).resolve()) for p in sys.path if p), key=len, reverse=True)
    for root in roots:
        if path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1:]
    return Path(path).name


def raise_site(exc: BaseException) -> str:
    """Where ``exc`` was raised: the innermost frame of its traceback, as ``module/path.py:line``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    return f"{short_path(frames[-1].filename)}:{frames[-1].lineno}"


def crash_cause(exc: BaseException) -> str:
    """The cause of an exception an implementation raised: its type and the line that raised it."""
    return f"{type(exc).__name__} at {raise_site(exc)}"


def note_case(size: int, text: str) -> None:
    """The case this process runs now (its size orders a group's failures: the smallest first)."""
    _LAST_CASE[0] = (int(size), text)


def forget_case() -> None:
    _LAST_CASE[0] = None


def tag(exc: BaseException, **fields) -> BaseException:
    """Attach what the harness knows of a failure to the exception it raises (cause, headline,
    case_file, replay, size, case); :func:`failure_of` reads it back."""
    try:
        setattr(exc, FAILURE_ATTRIBUTE, {k: v for k, v in fields.items() if v is not None})
    except (AttributeError, TypeError):      # an exception type without a __dict__
        pass
    return exc


def _first_exception(exc: BaseException) -> BaseException:
    """The first failure inside an exception group (Hypothesis reports several distinct failures so)."""
    while isinstance(getattr(exc, "exceptions", None), (list, tuple)) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


# The diagnosis line of a mismatch message, with its continuation lines (case_files.wrap indents them).
_DIAGNOSIS = re.compile(r"^diagnosis: (\w+): ?(.*(?:\n {4,}\S.*)*)$", re.M)


def failure_of(exc: BaseException) -> dict:
    """What a failed test's exception says of its cause: ``cause`` (the group key), ``headline``
    (one line), and where known ``case_file``, ``replay``, ``size`` and ``case``."""
    exc = _first_exception(exc)
    info = dict(getattr(exc, FAILURE_ATTRIBUTE, None) or {})
    text = str(exc)
    if "cause" not in info:
        found = _DIAGNOSIS.search(text)
        if found:
            info["cause"] = found.group(1)
            info.setdefault("headline", found.group(2))
        elif isinstance(exc, AssertionError) and is_harness_frame(_innermost(exc)):
            # The suite's own assertion: the check that failed, named by its first line (the
            # numbers of one case masked, so one check over many cases is one cause).
            first = text.strip().splitlines()[0] if text.strip() else "assertion failed"
            info["cause"] = _label(re.sub(r"\d+", "N", first))
        else:
            info["cause"] = crash_cause(exc)
    if "headline" not in info:
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        info["headline"] = first if first.startswith(type(exc).__name__) else f"{type(exc).__name__}: {first}"
    info["headline"] = one_line(info["headline"])
    if "size" not in info and _LAST_CASE[0] is not None:
        info["size"], info["case"] = _LAST_CASE[0]
    return info


def _label(text: str) -> str:
    """A cause named by a message's first line: at most a line, shortened between words."""
    text = one_line(text)
    return text if len(text) <= LINE_WIDTH else text[:LINE_WIDTH - 4].rsplit(" ", 1)[0] + " ..."


def _innermost(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return frames[-1].filename if frames else ""


def one_line(text: str) -> str:
    """``text`` on one line, its whitespace collapsed; never cut (a sentence cut mid-word says less
    than a long one: where it is shown, :func:`wrapped` breaks it between words)."""
    return " ".join(str(text).split())


# The name the position step's check calls (rope.harness.rotation.check): one line, never cut.
clip = one_line


def wrapped(text: str, *, indent: str = "", width: int = LINE_WIDTH) -> list[str]:
    """``text`` on lines of at most ``width`` (each starting with ``indent``), broken between words,
    never cut; a word longer than the line (a path) stays whole."""
    import textwrap
    return textwrap.wrap(one_line(text), width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [indent.rstrip()]


def group(failures: list[dict]) -> list[dict]:
    """Failures (dicts with ``test`` and what :func:`failure_of` gives) grouped by cause: the
    largest group first; in a group the smallest case first (sizes unknown last), its
    representative the first with a case file (else the first)."""
    groups: dict[str, list[dict]] = {}
    for f in failures:
        groups.setdefault(f.get("cause") or "unknown", []).append(f)
    out = []
    for cause, members in groups.items():
        members = sorted(members, key=lambda f: (f.get("size") is None, f.get("size") or 0, f.get("test", "")))
        representative = next((f for f in members if f.get("case_file")), members[0])
        others = [f for f in members if f is not representative]
        out.append({"cause": cause, "count": len(members), "representative": representative, "others": others})
    return sorted(out, key=lambda g: (-g["count"], g["cause"]))


def terminal_lines(groups: list[dict], *, listed: int = 3) -> list[str]:
    """The terminal's block per cause: count, cause, what it said, the smallest case, its replay
    and the command that reruns its test from any directory, then up to ``listed`` other tests
    (summary.md lists them all)."""
    lines = []
    for g in groups:
        rep = g["representative"]
        lines.append(f"{g['count']} failed: {g['cause']}")
        lines += wrapped(rep.get("headline", ""), indent="    ")
        lines.append(f"    first: {rep['test']}")
        if rep.get("case"):
            lines.append(f"    case: {rep['case']}")
        if rep.get("replay"):
            lines.append(f"    replay: {rep['replay']}")
        if rep.get("rerun"):
            lines.append(f"    rerun: {rep['rerun']}")
        for other in g["others"][:listed]:
            lines.append(f"    also: {other['test']}")
        if len(g["others"]) > listed:
            lines.append(f"    and {len(g['others']) - listed} more (reports/summary.md lists them)")
    return lines


def markdown_lines(groups: list[dict]) -> list[str]:
    """summary.md's opening section, right under the totals: one item per cause, the largest first,
    each with its count, its label, its sentence (wrapped, never cut), its smallest case and the
    command that replays it (:func:`markdown_detail_lines` lists every failure further down)."""
    if not groups:
        return []
    total = sum(g["count"] for g in groups)
    lines = ["## Causes", "",
             f"{total} failed test{'s' if total != 1 else ''}, {len(groups)} cause{'s' if len(groups) != 1 else ''}"
             + (" (the largest first)" if len(groups) > 1 else "")
             + "; the first case of each is the smallest, its case file the one to replay.", ""]
    for g in groups:
        rep = g["representative"]
        item = wrapped(f"**{g['count']} failed: {g['cause']}.** {rep.get('headline', '')}", width=LINE_WIDTH - 2)
        lines += ["- " + item[0], *("  " + line for line in item[1:])]
        lines.append(f"  First: `{rep['test']}`" + (f" ({rep['case']})" if rep.get("case") else "") + ".")
        lines.append(f"  Replay: `{rep['replay']}`" if rep.get("replay") else "  Replay: no case file was written.")
        if rep.get("rerun"):
            lines.append(f"  Rerun the test: `{rep['rerun']}`")
    return lines


def markdown_detail_lines(groups: list[dict]) -> list[str]:
    """summary.md's closing section: every failed test under its cause, with its case file."""
    if not groups:
        return []
    lines = ["## Failures by cause", "", "Every failed test under its cause, the first the one shown under Causes."]
    for g in groups:
        lines += ["", f"### {g['cause']}: {g['count']} failed", ""]
        lines += [f"- `{f['test']}`" + (f" ({f['case']})" if f.get("case") else "")
                  + (f": `{f['case_file']}`" if f.get("case_file") else "") for f in [g["representative"], *g["others"]]]
    return lines

