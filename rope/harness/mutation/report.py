"""The mutation report's three forms: the terminal table (rich), OUT/mutants.md and
OUT/mutants.json, the files written atomically (rope.harness.atomic)."""

from __future__ import annotations

import json
from pathlib import Path

from rope.harness.mutation.catalogue import kind_label
from rope.harness.mutation.results import MutationReport, SuiteResult, describe

NOTE_SECONDS = ("seconds: wall time of the pytest subprocess(es) until the first genuine failure / pytest's own "
                "reported duration; the limit applies to pytest's duration")
NOTE_DISPATCH = ("dispatch mutants are op classes, not registry implementations: they run through their dedicated "
                 "tests in properties/dispatch (test_dispatch_property_rejects_broken_op[NAME], marked mutant_search), "
                 "which pass "
                 "when the dispatch property rejects the broken op")
NOTE_DRAWN = ("drawn only: the harness again with its fixed cases off (no @example, no test marked fixed_cases: "
              "known-bug triggers, the regression corpus, real models' rows, fixed-size boundaries); its seconds "
              "are the time to the first failure")
NOTE_CONTROL = ("a failure counts only if the same test passes on the mutant's unmutated parent; failures the parent "
                "shares are false alarms, skipped")


def cell(s: SuiteResult | None, *, markup: bool) -> tuple[str, str]:
    """(caught?, seconds) cells of a suite result."""
    if s is None:
        return "n/a", "-"
    if s.caught:
        word = "yes (SLOW)" if s.slow else "yes"
        if markup:
            word = f"[yellow]{word}[/]" if s.slow else f"[green]{word}[/]"
    else:
        word = f"NO ({s.status})"
        if markup:
            word = f"[bold red]{word}[/]"
    if s.false_alarms:
        word += f" {len(s.false_alarms)} false alarm{'s' if len(s.false_alarms) > 1 else ''} skipped"
    pyt = f"{s.pytest_s:.1f}" if s.pytest_s is not None else "-"
    return word, f"{s.wall_s:.1f} / {pyt}"


def summary_lines(report: MutationReport) -> list[str]:
    s = report.summary()
    h, b, hr = s["harness"], s["baseline"], s["harness_on_rotation_mutants"]
    lines = [f"harness: caught {h['caught']}/{h['mutants']} mutants "
             f"({hr['caught']}/{hr['mutants']} rotation mutants), {h['suite_s_caught_total']:.1f} s of suite time "
             f"over the catches; over the {report.limit_s:.0f} s limit: {', '.join(h['slow']) or 'none'}"]
    if b is not None:
        lines.append(f"baseline: caught {b['caught']}/{b['mutants']} rotation mutants, "
                     f"{b['suite_s_caught_total']:.1f} s of suite time over the catches "
                     f"({b['suite_s_total']:.1f} s in all); false alarms skipped: {b['false_alarms']}; "
                     f"over the limit: {', '.join(b['slow']) or 'none'}")
    d = s["drawn"]
    if d is not None:
        lines.append(f"drawn cases alone: caught {d['caught']}/{d['mutants']} mutants, {d['suite_s_caught_total']:.1f} s "
                     f"of suite time over the catches; not caught: {', '.join(d['not_caught']) or 'none'}; over the "
                     f"{report.limit_s:.0f} s limit: {', '.join(d['slow']) or 'none'}"
                     + (f"; no drawn suite (fixed huge cases only): {', '.join(s['drawn_not_run'])}"
                        if s["drawn_not_run"] else ""))
    lines.append(f"survivors of the harness: {', '.join(s['survivors']) or 'none'}")
    for entry in s["not_run"]:
        lines.append(f"not run here: {entry['mutant']}: {entry['reason']}")
    lines.append(f"total wall time {report.total_wall_s:.1f} s, profile {report.profile}, {report.jobs} jobs, "
                 f"budget {report.budget_s:.0f} s per suite")
    return lines


def _counterexample(s: SuiteResult) -> str:
    return s.excerpt or "; ".join(s.notes[:2])


def print_table(report: MutationReport, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=max(180, Console().width))
    table = Table(title=f"rope-harness mutants (profile {report.profile})", show_lines=True,
                  caption="\n".join(_notes(report)), caption_justify="left")
    columns = [("mutant", {"no_wrap": True}), ("kind", {"max_width": 16}),
               ("harness caught?", {"max_width": 14}), ("s (wall / pytest)", {"max_width": 11})]
    if report.drawn:
        columns += [("drawn only?", {"max_width": 14}), ("s (wall / pytest)", {"max_width": 11})]
    columns += [("baseline caught?", {"max_width": 14}), ("s (wall / pytest)", {"max_width": 11}),
                ("counterexample", {"overflow": "fold", "min_width": 40})]
    for name, kw in columns:
        table.add_column(name, **kw)
    for r in report.results:
        cells = [*cell(r.harness, markup=True)] + ([*cell(r.drawn, markup=True)] if report.drawn else [])
        table.add_row(escape(r.mutant.name), escape(kind_label(r.mutant)), *cells, *cell(r.baseline, markup=True),
                      escape(_counterexample(r.harness)))
    console.print(table)
    for line in summary_lines(report):
        console.print(line, highlight=False, markup=False)


def _notes(report: MutationReport) -> list[str]:
    return ([NOTE_SECONDS] + ([NOTE_DRAWN] if report.drawn else []) + [NOTE_DISPATCH]
            + ([NOTE_CONTROL] if report.confirm else []))


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def markdown(report: MutationReport) -> str:
    lines = [f"# Mutation report ({report.created})", "",
             f"Profile `{report.profile}`; limit {report.limit_s:.0f} s of suite time; budget {report.budget_s:.0f} s "
             f"per suite; {report.jobs} jobs; baseline {'on' if report.baseline else 'off'}; "
             f"drawn cases alone {'on' if report.drawn else 'off'}; "
             f"parent control {'on' if report.confirm else 'off'}.", ""]
    lines += [f"- {line}" for line in summary_lines(report)] + [""]
    lines += [f"- {note}" for note in _notes(report)] + [""]
    drawn_head = " drawn only? | s (wall / pytest) |" if report.drawn else ""
    lines += [f"| mutant | kind | harness caught? | s (wall / pytest) |{drawn_head} baseline caught? | "
              "s (wall / pytest) | counterexample |",
              "|---|---|---|---:|" + ("---|---:|" if report.drawn else "") + "---|---:|---|"]
    for r in report.results:
        cells = [*cell(r.harness, markup=False)] + ([*cell(r.drawn, markup=False)] if report.drawn else [])
        cells += [*cell(r.baseline, markup=False)]
        lines.append(f"| `{r.mutant.name}` | {kind_label(r.mutant)} | {' | '.join(cells)} | "
                     f"{_md(_counterexample(r.harness))} |")
    lines += ["", "## Details", ""]
    for r in report.results:
        lines += [f"### `{r.mutant.name}` ({kind_label(r.mutant)})", "", r.mutant.doc, ""]
        for s in (r.harness, r.drawn, r.baseline):
            if s is None:
                continue
            lines.append(f"- **{s.suite}**: {describe(s)}" + (f" (stage: {s.stage})" if s.stage else ""))
            lines += [f"  - {n}" for n in s.notes]
            if s.assertion or s.falsifying_example:
                lines += ["", "```text", *s.assertion, *s.falsifying_example, "```", ""]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def to_json(report: MutationReport) -> str:
    return json.dumps(report.to_dict(), indent=1) + "\n"


def write_reports(report: MutationReport, out_dir: Path) -> list[Path]:
    """``mutants.json`` and ``mutants.md`` in ``out_dir``, each written atomically."""
    from rope.harness.atomic import atomic_write
    out_dir = Path(out_dir)
    paths = [out_dir / "mutants.json", out_dir / "mutants.md"]
    written = report.to_dict()
    atomic_write(paths[0], (json.dumps(written, indent=1) + "\n").encode())
    # The markdown from what the JSON holds (its figures rounded as stored), so that the two always
    # agree: a total wall time of 737.849 s is 737.85 in the JSON, and "737.8" and "737.9" otherwise.
    atomic_write(paths[1], markdown(MutationReport.from_dict(written)).encode())
    return paths
