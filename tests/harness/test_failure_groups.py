"""A run's failures, one block per cause (rope.harness.causes, rope.harness.plugin.failures): a
kernel with two bugs fails many tests, and the terminal and summary.md say two causes, each with
its smallest case in full and the command that replays it; the harness's own frames stay out of
the tracebacks."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rope.harness import causes
from rope.harness.suite import plugin_args, subprocess_env, suite_path

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

# Two bugs of the field: interleaved sections read as chunked (vllm-gaudi#1437), and a raise on an
# empty batch.  Line 9 raises: the crash's cause names it.
_TWO_BUGS = '''\
import dataclasses

from rope import get_implementation

_native = get_implementation("native")

def rope(spec, positions, query, key, cos_sin_cache):
    if query.shape[0] == 0:
        raise ValueError("no tokens")
    if spec.layout == "interleaved":
        spec = dataclasses.replace(spec, layout="chunked")
    return _native(spec, positions, query, key, cos_sin_cache)

rope.working_precision = _native.working_precision      # native computes in the activation dtype
'''
_INTERLEAVED_CASES = 5        # properties/known_cases.py: the interleaved known-bug triggers
_BLOCK = re.compile(r"^E   AssertionError: two_bugs:rope on cpu does not match the reference", re.M)


def _run(tmp_path, *extra):
    (tmp_path / "two_bugs.py").write_text(_TWO_BUGS)
    env = {k: v for k, v in subprocess_env().items()
           if not k.startswith(("ROPE_", "PYTEST_")) and k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q",
               str(suite_path("rotation", "test_rotation.py")), "-k", "known_bug_triggers_match_reference",
               "--rope-impl", "two_bugs:rope", "--rope-device", "cpu", *extra]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def grouped_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("grouped")
    return tmp_path, _run(tmp_path)


def test_two_bugs_are_two_causes_each_printed_once_in_full(grouped_run):
    tmp_path, run = grouped_run
    out = run.stdout
    assert run.returncode == 1, out[-3000:] + run.stderr[-3000:]
    assert f"{_INTERLEAVED_CASES + 1} failed" in out.splitlines()[-1], out[-2000:]
    # The failures section: one full block per cause, the rest counted under it.
    assert len(_BLOCK.findall(out)) == 2, out
    assert f"{_INTERLEAVED_CASES - 1} more failed of this cause (axis_map_wrong)" in out, out
    # The closing block: the causes, largest first, with the smallest case and its replay.
    tail = out[out.index("rope-harness: 6 failed, 2 causes"):]
    lines = tail.splitlines()
    assert lines[1] == f"{_INTERLEAVED_CASES} failed: axis_map_wrong", tail
    assert "1 failed: ValueError at two_bugs.py:9" in tail, tail
    assert re.search(r"replay: rope-harness repro reports/cases/\w+\.json --impl two_bugs:rope", tail), tail
    # The smallest interleaved case first: 7 tokens (the padding-lane triggers), not the 97-token one.
    case = next(line for line in lines if line.startswith("    case:"))
    assert case.startswith("    case: 7 tokens"), tail
    # No harness source in the tracebacks: the messages alone.
    assert "def assert_matches_reference" not in out and "rope/harness/rotation/check.py" not in out, out


def test_summary_lists_the_causes_and_every_failure(grouped_run):
    tmp_path, _ = grouped_run
    summary = (tmp_path / "reports" / "summary.md").read_text()
    # The causes open the report, before any table: count, label, sentence, replay.
    lines = summary.splitlines()
    assert lines[2].startswith("**Failed.** rotation: "), lines[2]
    assert lines[2].endswith(f"; {_INTERLEAVED_CASES + 1} tests failed, 2 causes."), lines[2]
    opening = summary[summary.index("## Causes"):summary.index("## Comparisons by variant")]
    items = [line for line in opening.splitlines() if line.startswith("- **")]
    assert [item.split(" failed: ")[0] for item in items] == [f"- **{_INTERLEAVED_CASES}", "- **1"], opening
    assert "axis_map_wrong" in items[0] and "ValueError at two_bugs.py:9" in items[1], opening
    assert opening.count("Replay: `rope-harness repro reports/cases/") >= 1 and "--impl two_bugs:rope" in opening, opening
    # Every failure, further down, under its cause.
    section = summary[summary.index("## Failures by cause"):]
    assert section.count("- `properties/rotation/test_rotation.py::") == _INTERLEAVED_CASES + 1, section
    assert "## Case files" not in summary and "## Other case files" not in summary, summary


def test_verbose_prints_every_failure(tmp_path):
    run = _run(tmp_path, "-vv")          # (after the -q of _run: verbosity 1)
    assert len(_BLOCK.findall(run.stdout)) == _INTERLEAVED_CASES + 1, run.stdout[-3000:]


# ------------------------------------------------------------------ the pieces
def test_groups_put_the_largest_cause_first_and_its_smallest_case_with_a_case_file_forward():
    failures = [{"test": "a", "cause": "x", "size": 50, "case_file": "a.json"},
                {"test": "b", "cause": "y", "size": 10},
                {"test": "c", "cause": "x", "size": 5},            # smallest, but no case file
                {"test": "d", "cause": "x", "size": 20, "case_file": "d.json"},
                {"test": "e", "cause": "x"}]                        # size unknown: last
    groups = causes.group(failures)
    assert [(g["cause"], g["count"]) for g in groups] == [("x", 4), ("y", 1)]
    assert groups[0]["representative"]["test"] == "d"
    assert [f["test"] for f in groups[0]["others"]] == ["c", "a", "e"]


def test_a_cause_is_the_tag_the_diagnosis_or_the_raising_line():
    tagged = causes.tag(AssertionError("x"), cause="pairing_swapped", size=3)
    assert causes.failure_of(tagged)["cause"] == "pairing_swapped"
    diagnosed = AssertionError("impl on cpu does not match\ndiagnosis: axis_map_wrong: the map is wrong")
    assert causes.failure_of(diagnosed)["cause"] == "axis_map_wrong"
    try:
        {}["missing"]
    except KeyError as exc:
        crashed = exc
    line = crashed.__traceback__.tb_lineno
    assert causes.failure_of(crashed)["cause"] == f"KeyError at {causes.short_path(__file__)}:{line}"
    # Hypothesis reports two distinct failures as a group: the first one's cause.
    group = ExceptionGroup("two", [diagnosed, crashed]) if sys.version_info >= (3, 11) else None
    if group is not None:
        assert causes.failure_of(group)["cause"] == "axis_map_wrong"


def test_the_harness_frames_leave_a_traceback_the_implementations_stay():
    from rope.harness.rotation.check import call_rotation

    def implementation(*args):
        raise RuntimeError("kernel exploded")
    with pytest.raises(RuntimeError) as info:
        call_rotation(implementation, None, None, None, None, None)
    paths = [str(e.path) for e in info.traceback]
    assert any(p.endswith("rope/harness/rotation/check.py") for p in paths)
    causes.hide_harness_frames(info)
    kept = [str(e.path) for e in info.traceback]
    assert kept and all(p == __file__ for p in kept), kept


def test_a_long_line_is_wrapped_and_a_short_one_kept():
    from rope.harness.case_files import wrap
    long = "diagnosis: x: " + " ".join(["word"] * 60)
    pieces = wrap(long)
    assert len(pieces) > 1 and all(len(p) <= 120 for p in pieces)
    assert " ".join(" ".join(pieces).split()) == long and pieces[1].startswith("    ")
    assert wrap("short") == ["short"]


def test_a_wrong_position_step_is_one_cause_in_short_lines():
    from properties.mutants.broken_positions import BROKEN_POSITIONS
    from properties.position_step.known_steps import CHUNK_2
    from rope.harness.position_step.check import assert_positions_match
    name = next(iter(BROKEN_POSITIONS))
    with pytest.raises(AssertionError) as failure:
        assert_positions_match(name, BROKEN_POSITIONS[name], CHUNK_2, "cpu")
    info = causes.failure_of(failure.value)
    assert info["cause"] in ("wrong_positions", "writes_outside") and info["size"] == CHUNK_2.num_tokens, info
    lines = str(failure.value).splitlines()
    assert len(lines) > 1 and all(len(line) <= causes.LINE_WIDTH for line in lines[1:]), lines


def test_a_failure_under_pyargs_of_a_module_is_named_with_its_file():
    # pytest ids a module named by --pyargs outside the rootdir as "::test_name"; the cause block's
    # "first:" line would name no file.
    from types import SimpleNamespace

    from rope.harness.plugin.failures import failure_info
    props = [(causes.REPORT_PROPERTY, {"cause": "wrong_pairing"})]
    outside = SimpleNamespace(nodeid="::test_known_bug_prompts_match[x]", user_properties=props,
                              location=("../properties/position_ids/test_position_ids.py", 10, "test"))
    assert failure_info(outside)["test"] == ("../properties/position_ids/test_position_ids.py"
                                             "::test_known_bug_prompts_match[x]")
    inside = SimpleNamespace(nodeid="properties/a.py::test_b", user_properties=props, location=("x.py", 1, "t"))
    assert failure_info(inside)["test"] == "properties/a.py::test_b"
