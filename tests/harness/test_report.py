"""The run report merges every worker's records, survives a crashed worker, and plots."""

from __future__ import annotations

import json
import os

import pytest
import torch

from properties.mutants.broken_rotations import neox_for_gptj
from properties.strategies import RotationCase, build_rotation_inputs
from rope.harness import report
from rope.spec import RopeSpec

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPE_REPORTS_DIR", str(tmp_path))
    monkeypatch.delenv(report.DISABLE_ENV, raising=False)
    previous = os.environ.get(report.RUN_ENV)
    path = report.start_run()
    yield path
    if previous is None:
        os.environ.pop(report.RUN_ENV, None)
    else:
        os.environ[report.RUN_ENV] = previous


def _comparison(fn, case):
    import reference
    from rope.harness.rotation.bound import compare_rotation
    x = build_rotation_inputs(case)
    out_q, out_k = fn(case.spec, x.positions, x.query.clone(), None if x.key is None else x.key.clone(), x.cache)
    rq, rk = reference.rotate(case.spec, x.positions, x.query, x.key, x.cache)
    return compare_rotation(case.spec, x.positions, x.query, x.key, x.cache, out_q, out_k, rq, rk, "float32")


GLM = RopeSpec(128, 64, False, (8, 12, 12), max_position=512)


def test_records_from_workers_merge_and_a_torn_line_is_dropped(run_dir, monkeypatch, tmp_path):
    from rope.native import rotate_native
    case = RotationCase(GLM, 5, 2, 1, "float32", "uniform", False, 3)
    good, bad = _comparison(rotate_native, case), _comparison(neox_for_gptj, case)
    for worker, comp in (("gw0", good), ("gw1", bad)):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        report.record_comparison(test="t", impl="x", device="cpu", dtype="float32", variant=GLM.variant(),
                                 comparison=comp, case_file="reports/cases/abc.json" if not comp.ok else None)
    report.record(kind="skip", test="t2", reason="unsupported: y does not run on xpu")
    # A worker that died mid-write leaves a torn last line; everything before it counts.
    (run_dir / "gw7-999.jsonl").write_text(json.dumps({"kind": "skip", "test": "t3", "reason": "r"}) + "\n{\"kind\": \"comp")
    paths = report.write_summary(run_dir, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["examples"] == 2 and summary["failures"] == 1
    [cell] = summary["matrix"]
    assert cell["impl"] == "x" and cell["examples"] == 2 and cell["failures"] == 1
    assert cell["worst_ratio"] == "inf" or cell["worst_ratio"] > 1
    assert {s["test"] for s in summary["skips"]} == {"t2", "t3"}
    md = (tmp_path / "summary.md").read_text()
    assert "| x | cpu | float32 | chunked3-gptj-partial | 2 |" in md and "`rope-harness repro reports/cases/abc.json`" in md
    assert report.VARIANT_LEGEND in md and "`partial` rotary_dim < head_size" in md       # the names explained
    # An implementation named by import path: the printed replay names it again (--impl).
    report.record_comparison(test="t", impl="mypkg.rope:fn", device="cpu", dtype="float32", variant=GLM.variant(),
                             comparison=bad, case_file="reports/cases/def.json")
    report.write_summary(run_dir, tmp_path)
    assert "`rope-harness repro reports/cases/def.json --impl mypkg.rope:fn`" in (tmp_path / "summary.md").read_text()
    names = {p.name for p in paths}
    assert {"summary.md", "summary.json", "error_bound.png", "failure_00_heatmap.png"} <= names
    assert (tmp_path / "failure_00_heatmap.png").read_bytes()[:4] == b"\x89PNG"


def test_heat_map_points_at_the_wrong_channels(run_dir):
    # NeoX pairing for a GPT-J spec: every rotated channel of every head is wrong, pass-through is not.
    case = RotationCase(GLM, 4, 2, 0, "float32", "uniform", False, 5)
    heat = report._heat_map(_comparison(neox_for_gptj, case))["query"]
    grid = torch.tensor(heat)
    assert grid.shape == (2, 128)
    assert torch.all(grid[:, 64:] == 0) and (grid[:, :64] > 1).float().mean() > 0.9


def test_disabled_recording_writes_nothing(run_dir, monkeypatch):
    monkeypatch.setenv(report.DISABLE_ENV, "1")
    report.record(kind="skip", test="t", reason="r")
    assert not list(run_dir.glob("*.jsonl"))


def test_a_new_run_never_removes_a_run_in_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPE_REPORTS_DIR", str(tmp_path))
    previous = os.environ.get(report.RUN_ENV)
    try:
        first = report.start_run()
        runs = [report.start_run() for _ in range(8)]     # e.g. nested pytest runs of a mutation sweep
        assert first.exists() and all(r.exists() for r in runs)
        os.environ[report.RUN_ENV] = str(first)
        import shutil
        shutil.rmtree(first)                               # even if it vanished, recording never raises
        report.record(kind="skip", test="t", reason="r")
    finally:
        if previous is None:
            os.environ.pop(report.RUN_ENV, None)
        else:
            os.environ[report.RUN_ENV] = previous


def test_rejected_draws_add_up_per_test_and_reason(run_dir, tmp_path):
    # One row per (test, reason) with the draws summed over its copies and rounds (a FlashInfer
    # campaign listed 792 skip rows, one per count), apart from the skipped tests.
    why = "known defect: f on 1d-neox bfloat16 on cuda: wrong values"
    for draws in (1, 25, 43):
        report.record(kind="rejected", test="t", reason=why, draws=draws)
    report.record(kind="rejected", test="t", reason="unsupported: f does not run chunked3", draws=2)
    report.record(kind="skip", test="u", reason="no GPU")
    report.write_summary(run_dir, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted((r["reason"], r["draws"]) for r in summary["rejected"]) == [
        (why, 69), ("unsupported: f does not run chunked3", 2)]
    assert summary["skips"] == [{"test": "u", "reason": "no GPU", "count": 1}]
    md = (tmp_path / "summary.md").read_text()
    assert f"| t | {why} | 69 |" in md and "## Draws rejected" in md


_EXPECTED = """
import pytest
from rope.harness.rotation.check import assert_matches_reference
from rope.harness.rotation.cases import RotationCase
from rope.native import rotate_native
from rope.spec import RopeSpec
from properties.mutants.broken_rotations import neox_for_gptj

CASE = RotationCase(RopeSpec(128, 64, False, (8, 12, 12), max_position=512), 5, 2, 1, "float32", "uniform", False, 3)

@pytest.mark.xfail(strict=True, reason="pinned upstream mismatch")
def test_pinned(device):
    assert_matches_reference("neox_for_gptj", neox_for_gptj, CASE, "cpu")

def test_pinned_in_the_body(device):
    # The mismatch is checked, then declared expected: pytest.xfail after the case file was written.
    with pytest.raises(AssertionError, match="does not match the reference"):
        assert_matches_reference("neox_for_gptj", neox_for_gptj, CASE, "cpu")
    pytest.xfail("known mismatch: pinned in the test's body")

def test_right(device):
    assert_matches_reference("native", rotate_native, CASE, "cpu")
"""


def test_an_expected_failure_is_listed_apart_not_counted_and_writes_no_case_file(tmp_path):
    # A green run says green: a strict xfail's mismatch (a pinned upstream bug) is not one of the
    # run's failures and leaves no case file; summary.md lists it under its own heading.
    from tests.fresh_runs import run_pytest
    (tmp_path / "mytests").mkdir()
    (tmp_path / "mytests" / "test_pinned.py").write_text(_EXPECTED)
    (tmp_path / "pytest.ini").write_text("[pytest]\nrope_harness_test_dirs = mytests\n")
    run = run_pytest(["-q", "mytests/test_pinned.py", "--rope-device", "cpu"], tmp_path)
    assert run.returncode == 0 and "1 passed, 2 xfailed" in run.stdout, run.stdout[-2000:]
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert summary["failures"] == 0 and summary["examples"] == 1 and summary["verdict"] == "passed", summary
    pinned, in_the_body = summary["expected_failures"]
    assert pinned["test"].endswith("test_pinned[cpu]") and pinned["failed"] == 1 and "pinned upstream" in pinned["reason"]
    assert in_the_body["test"].endswith("test_pinned_in_the_body[cpu]") and in_the_body["failed"] == 1, in_the_body
    # Neither left a case file: not the marked one, nor the one that called pytest.xfail after its
    # mismatch had written one.
    assert not list((tmp_path / "reports").glob("cases/*.json"))
    md = (tmp_path / "reports" / "summary.md").read_text()
    assert md.splitlines()[2] == ("**Passed.** rotation: 1 comparison, 0 failed; 2 expected failures, not counted."), md
    assert "## Expected failures" in md


# ------------------------------------------------------------------ summary.md opens with the verdict
_SENTENCE = ("the boundary between position rows sits one frequency too far: the first frequency of each section "
             "after the first takes the previous section's position row (bucketize with right=False), so every "
             "token whose rows differ is rotated by the wrong angle there")


def _records_of_a_failed_run() -> list[dict]:
    def comparison(test, ok, variant="chunked3-neox", dtype="bfloat16"):
        return {"kind": "comparison", "test": test, "impl": "mypkg.rope:fn", "device": "cpu", "dtype": dtype,
                "variant": variant, "ok": ok, "worst_ratio": 0.5 if ok else "inf", "mismatched": 0 if ok else 3,
                "elements": 10, "problems": [], "case_file": None if ok else "reports/cases/abc.json"}
    rotation = "properties/rotation/test_rotation.py::test_rotation_matches_reference"
    step = "properties/position_step/test_runner_positions.py::test_positions_match_reference"
    return [comparison(rotation, True), comparison(rotation, True), comparison(rotation, False),
            comparison(step, True, "positions-3rows", "int64"),
            {"kind": "failure", "test": f"{rotation}[mypkg.rope:fn-cpu]", "cause": "section_boundary_shifted",
             "headline": _SENTENCE, "case_file": "reports/cases/abc.json", "size": 7, "case": "7 tokens",
             "replay": "rope-harness repro reports/cases/abc.json --impl mypkg.rope:fn"},
            {"kind": "skip", "test": "properties/rotation/test_prefill.py::test_huge", "reason": "Skipped: GPU only"}]


def test_summary_opens_with_the_verdict_the_totals_and_the_causes(tmp_path):
    # Title, one line of totals per checked thing with the verdict, then the causes (count, label,
    # sentence, replay) before any table: a reader in a hurry reads the first lines only.
    report.write_report(_records_of_a_failed_run(), tmp_path)
    lines = (tmp_path / "summary.md").read_text().splitlines()
    assert lines[0] == "# rope-harness run report" and lines[1] == ""
    assert lines[2] == ("**Failed.** rotation: 3 comparisons, 1 failed; position step: 1 comparison, 0 failed; "
                        "1 test failed, 1 cause."), lines[2]
    assert lines[4] == "## Causes", lines[:8]
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    causes_block = "\n".join(lines[4:first_table])
    assert "**1 failed: section_boundary_shifted.**" in causes_block
    assert "`rope-harness repro reports/cases/abc.json --impl mypkg.rope:fn`" in causes_block
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["verdict"] == "failed" and summary["totals"][0] == {
        "thing": "rotation", "comparisons": 3, "failed": 1, "failed_tests": 1}, summary["totals"]


def test_a_long_cause_sentence_wraps_and_is_never_cut(tmp_path):
    from rope.harness import causes
    # The sentence as the harness tags it, through the test report (failure_of) to both outputs.
    info = causes.failure_of(causes.tag(AssertionError("x"), cause="section_boundary_shifted", headline=_SENTENCE))
    assert info["headline"] == _SENTENCE
    records = [r if r.get("kind") != "failure" else {**r, "headline": info["headline"]} for r in _records_of_a_failed_run()]
    report.write_report(records, tmp_path)
    md = (tmp_path / "summary.md").read_text()
    section = md[md.index("## Causes"):md.index("## Comparisons by variant")]
    assert _SENTENCE in " ".join(section.split()), section
    assert all(len(line) <= causes.LINE_WIDTH for line in section.splitlines() if "`" not in line), section
    terminal = causes.terminal_lines(causes.group([info | {"test": "t"}]))
    assert _SENTENCE in " ".join(" ".join(terminal).split()) and "..." not in " ".join(terminal), terminal
    assert all(len(line) <= causes.LINE_WIDTH for line in terminal), terminal
    # A diagnosis read from a message: its wrapped continuation lines belong to the sentence.
    from rope.harness.case_files import wrap
    message = "\n".join(["impl on cpu does not match the reference", *wrap(f"diagnosis: axis_map_wrong: {_SENTENCE}"),
                         "mismatched 3 of 10"])
    assert causes.failure_of(AssertionError(message))["headline"] == _SENTENCE


def test_a_skip_reason_is_one_line_without_hypothesis_example(tmp_path):
    # A skip raised in an @example's call: Hypothesis appends the example over many lines, which
    # broke the table; the reason is one row, the same reason one row however it was raised.
    dump = ("Skipped: asserts the harness's own validation messages | built-ins only\n"
            "Failing explicit example: test_x(\n    impl_name='mine',\n    seed=0,\n)")
    records = [{"kind": "skip", "test": "t", "reason": dump},
               {"kind": "skip", "test": "t", "reason": "Skipped: asserts the harness's own validation messages | "
                                                       "built-ins only"},
               {"kind": "skip", "test": "u", "reason": "Skipped: needs\n  a GPU"}]
    report.write_report(records, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["skips"] == [
        {"test": "t", "reason": "asserts the harness's own validation messages | built-ins only", "count": 2},
        {"test": "u", "reason": "needs a GPU", "count": 1}], summary["skips"]
    md = (tmp_path / "summary.md").read_text()
    rows = md[md.index("## Skipped"):].split("\n\n")[1].splitlines()
    assert rows[2:] == ["| t | asserts the harness's own validation messages \\| built-ins only | 2 |",
                        "| u | needs a GPU | 1 |"], rows
    assert md.splitlines()[2] == "**Nothing compared.** No comparison against the float64 reference was made."
