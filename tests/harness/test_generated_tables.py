"""The tables in docs/ that a command wrote are recomputed from the JSON written beside them: a
hand edit of a figure, or a report whose JSON and markdown come from different runs, fails here.

A JSON file in docs/ with a markdown file of the same name beside it is a generated pair; each pair
must be one this module knows how to render (a new kind of generated document is added here)."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest

from rope.harness import bench_report
from rope.harness.mutation.report import markdown as mutants_markdown
from rope.harness.mutation.results import SCHEMA as MUTANTS_SCHEMA, MutationReport

ROOT = Path(__file__).resolve().parents[2]


def rendered(data: dict) -> str:
    """The markdown the command that wrote ``data`` writes beside it."""
    if data.get("schema") == MUTANTS_SCHEMA:                # rope-harness mutants
        return mutants_markdown(MutationReport.from_dict(data))
    if "results" in data and "copy_gbps" in data:            # rope-harness bench
        return bench_report.markdown(data)
    raise ValueError(f"not a report this test renders (schema={data.get('schema')!r}, keys {sorted(data)[:6]})")


def drift(markdown_text: str, data: dict) -> str:
    """The unified diff from the committed markdown to the one its JSON renders ('' when none)."""
    return "".join(difflib.unified_diff(markdown_text.splitlines(True), rendered(data).splitlines(True),
                                        "committed", "rendered from its JSON", n=1))


GENERATED = sorted(p for p in (ROOT / "docs").rglob("*.json") if p.with_suffix(".md").exists())


def test_docs_hold_generated_reports():
    names = {p.relative_to(ROOT).as_posix() for p in GENERATED}
    assert {"docs/mutants-cpu.json", "docs/bench-h200/bench.json"} <= names, names


@pytest.mark.parametrize("path", GENERATED, ids=[p.relative_to(ROOT).as_posix() for p in GENERATED])
def test_generated_table_matches_its_json(path):
    diff = drift(path.with_suffix(".md").read_text(), json.loads(path.read_text()))
    assert not diff, (f"{path.with_suffix('.md').relative_to(ROOT)} is not what {path.relative_to(ROOT)} renders "
                      f"(regenerate both with the command that wrote them):\n{diff[:4000]}")


def test_a_figure_edited_by_hand_is_drift():
    path = ROOT / "docs" / "mutants-cpu.json"
    data = json.loads(path.read_text())
    committed = path.with_suffix(".md").read_text()
    assert drift(committed, data) == ""
    data["mutants"][0]["harness"]["wall_s"] += 1.0            # the JSON of another run ...
    assert "| `" + data["mutants"][0]["name"] + "`" in drift(committed, data)
    caught = re.search(r"caught (\d+)/", committed)                   # ... or the markdown edited by hand
    edited = committed.replace(caught.group(0), f"caught {int(caught.group(1)) + 1}/", 1)
    assert edited != committed and caught.group(0) in drift(edited, json.loads(path.read_text()))


def test_an_unknown_report_is_refused():
    with pytest.raises(ValueError, match="not a report"):
        rendered({"rows": []})
    with pytest.raises(ValueError, match="schema"):
        MutationReport.from_dict({"schema": "rope-harness/mutants/0"})
