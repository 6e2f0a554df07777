"""A step sequence's case file (rope.harness.position_step.case_file, schema version 2): a step right
alone and stale after the earlier ones on one set of buffers writes the whole sequence and its mode,
it round-trips, every bad field is a ValueError naming it, and ``rope-harness repro`` and ``pytest
--rope-repro`` run the sequence again in its mode: exit 1 while the implementation keeps a value of
an earlier step, 0 for one that does not, 2 for a graph-mode file without a GPU.  A one-step file of
version 1 reads and replays as before."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from properties.mutants.broken_positions import delta_missing_in_decode, request_state_cached_per_buffer
from properties.position_step.known_steps import DECODE
from properties.position_step.step_sequences import CHUNKED_THEN_DECODE, request_state_sequences
from rope.harness import case_files, causes
from rope.harness.position_step import case_file
from rope.harness.position_step.case_file import MAX_STEPS, case_record, load_case
from rope.harness.position_step.check import assert_positions_match
from rope.harness.position_step.modes import assert_steps_match
from rope.harness.position_step.replay import run_repro
from rope.registry import get_positions_implementation
from tests.fresh_runs import run_pytest

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

MUTANT = "properties.mutants.broken_positions:request_state_cached_per_buffer"


@settings(max_examples=25, deadline=None)
@given(steps=request_state_sequences(), mode=st.sampled_from(case_file.MODES), data=st.data())
def test_a_step_sequence_round_trips_through_its_case_file(steps, mode, data):
    stale = data.draw(st.sampled_from(steps), label="stale step")
    record = case_record(implementation="native", fn=get_positions_implementation("native"), batch=stale, device="cuda",
                         problems=["step 2 of 2 differs"], label=case_file.STALE_LABELS[mode], hypothesis=None,
                         steps=steps, mode=mode)
    with tempfile.TemporaryDirectory() as directory:
        loaded = load_case(case_files.write_case(record, directory))
    assert (loaded.steps, loaded.mode, loaded.batch) == (tuple(steps), mode, stale)
    assert loaded.record["schema_version"] == 2 and loaded.device == "cuda"


@pytest.fixture
def case_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cases"
    monkeypatch.setenv(case_files.CASES_DIR_ENV, str(directory))
    return directory


def _stale_sequence_file(case_dir) -> Path:
    """The case file the mutant's stale second step writes (vllm#10388's chunk, then its rest, then decode)."""
    with pytest.raises(AssertionError) as failure:
        assert_steps_match(MUTANT, request_state_cached_per_buffer, CHUNKED_THEN_DECODE, "cpu", mode="eager")
    (path,) = sorted(case_dir.glob("*.json"))
    info = causes.failure_of(failure.value)
    assert info["cause"] == "reused_buffers_stale" and info["case_file"] == case_files.display_path(path), info
    assert info["replay"] == f"rope-harness repro {info['case_file']} --impl {MUTANT}"
    # The path and the command go to the failure's block only: the message's lines stay short.
    lines = str(failure.value).splitlines()
    assert not any(line.startswith(("case file", "replay")) for line in lines), lines
    assert all(len(line) <= causes.LINE_WIDTH for line in lines[1:]), lines
    return path


def test_a_stale_step_writes_its_sequence_and_mode_and_replays_them(case_dir, capsys):
    path = _stale_sequence_file(case_dir)
    loaded = load_case(path)
    assert loaded.steps == tuple(CHUNKED_THEN_DECODE) and loaded.mode == "eager"
    assert loaded.batch == CHUNKED_THEN_DECODE[1] and loaded.record["schema_version"] == 2
    assert loaded.record["diagnosis"]["label"] == "reused_buffers_stale"
    assert run_repro(path, device=None, impl=MUTANT) == 1            # the second step is stale again
    out = capsys.readouterr().out
    assert "3 steps eagerly on one set of buffers, step 2 stale" in out and "step 2 of 3" in out, out
    assert run_repro(path, device=None, impl="triton") == 0         # the same kernel, nothing kept
    assert run_repro(path, device=None, impl="native") == 0
    assert "on every step" in capsys.readouterr().out
    assert run_repro(path, device=None, impl=None) == 2              # a module path is never imported


def _graph_file(path: Path) -> Path:
    """The sequence file at ``path`` as a graph replay on a GPU would have written it."""
    record = json.loads(path.read_text())
    record.update(mode="graph", device="cuda", diagnosis={"label": "graph_replay_stale", "sentence": ""})
    graph = path.with_name("graph.json")
    graph.write_text(json.dumps(record))
    return graph


def test_a_graph_mode_sequence_cannot_replay_without_a_gpu(case_dir, capsys):
    path = _graph_file(_stale_sequence_file(case_dir))
    assert load_case(path).mode == "graph"
    capsys.readouterr()
    for device in (None, "cpu"):
        assert run_repro(path, device=device, impl="native") == 2
        assert "recorded in a CUDA graph, and a CUDA/HIP graph needs a GPU" in capsys.readouterr().err


def test_a_one_step_file_reads_and_replays_as_before(case_dir, capsys):
    one_step_mutant = "properties.mutants.broken_positions:delta_missing_in_decode"
    with pytest.raises(AssertionError):
        assert_positions_match(one_step_mutant, delta_missing_in_decode, DECODE, "cpu")
    (path,) = sorted(case_dir.glob("*.json"))
    record = json.loads(path.read_text())
    assert record["schema_version"] == 1 and "steps" not in record and "mode" not in record
    loaded = load_case(path)
    assert (loaded.steps, loaded.mode, loaded.batch) == ((), None, DECODE)
    assert run_repro(path, device=None, impl=one_step_mutant) == 1
    assert run_repro(path, device=None, impl="native") == 0
    assert "on every step" not in capsys.readouterr().out


def _steps(index: int, change):
    """CHUNKED_THEN_DECODE's steps as a file holds them, step ``index`` changed (a dict: some fields; else replaced)."""
    steps = [step.to_dict() for step in CHUNKED_THEN_DECODE]
    steps[index] = {**steps[index], **change} if isinstance(change, dict) else change
    return steps


HUGE = {"query_lens": [(1 << 23) + 1]}       # one step is within the bound; two are not
BAD_FIELDS = [
    ({"mode": "jit"}, "mode='jit': must be one of ('eager', 'graph')"),
    ({"mode": None}, "mode=None: must be one of"),
    ({"steps": "all"}, "steps: must be a list of 1 to 16 steps (got str)"),
    ({"steps": []}, "steps: must be a list of 1 to 16 steps (got 0)"),
    ({"steps": [CHUNKED_THEN_DECODE[1].to_dict()] * (MAX_STEPS + 1)},
     "steps: must be a list of 1 to 16 steps (got 17)"),
    ({"steps": _steps(1, {"num_dims": 7})}, "steps[1].num_dims=7: must be an int in [1, 4]"),
    ({"steps": _steps(1, {"idx_mapping": [5]})}, "steps[1].idx_mapping: distinct slots"),
    ({"steps": _steps(2, {"padding": True})}, "steps[2].padding=True"),
    ({"steps": _steps(2, "x")}, "steps[2]: must be an object with exactly"),
    ({"steps": [{**CHUNKED_THEN_DECODE[1].to_dict(), **HUGE}] * 2}, "steps: more than 16777216 positions"),
    ({"steps": _steps(2, {"padding": 0})},
     "steps[2]: (3, 1, 192, 1, 1): every step on one set of buffers has the same shapes"),
    ({"steps": _steps(1, {"prefill_delta": [3]})}, "batch: must be one of steps"),
    ({"schema_version": 1}, "mode, steps: a step sequence needs schema_version 2 (got 1)"),
    ({"schema_version": 3}, "schema_version=3: newer than this rope-harness understands"),
    ({"diagnosis": {"label": "graph_replay_stale"}}, "diagnosis: must be an object whose label is one of"),
]


@pytest.mark.parametrize("change, says", BAD_FIELDS, ids=[f"{sorted(c)[0]}-{i}" for i, (c, _) in enumerate(BAD_FIELDS)])
def test_every_bad_sequence_field_is_a_value_error_naming_it(case_dir, change, says):
    record = json.loads(_stale_sequence_file(case_dir).read_text())
    record.update(change)
    path = case_dir / "bad.json"
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=re.escape(says)):
        load_case(path)
    assert run_repro(path, device=None, impl="native") == 2


@pytest.mark.parametrize("missing", ["mode", "steps"])
def test_a_sequence_records_both_its_mode_and_its_steps(case_dir, missing):
    record = json.loads(_stale_sequence_file(case_dir).read_text())
    del record[missing]
    path = case_dir / "half.json"
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=re.escape("mode, steps: a step sequence records both (got only")):
        load_case(path)


def test_pytest_rope_repro_runs_the_sequence_again_in_its_mode(case_dir, tmp_path):
    path = _stale_sequence_file(case_dir)
    graph = _graph_file(path)
    run = run_pytest(["-q", "-rs", "-p", "no:randomly", "--pyargs", "properties.position_step.test_replay",
                      "--rope-repro", str(path), "--rope-repro", str(graph),
                      "--rope-position-step-impl", MUTANT, "--rope-position-step-impl", "native"], tmp_path)
    # Eagerly: the mutant's second step is stale again, native passes; the graph file is not run eagerly.
    assert run.returncode == 1 and "1 failed, 1 passed, 2 skipped" in run.stdout, run.stdout[-3000:]
    assert "step 2 of 3 on the same buffers does not match" in run.stdout, run.stdout[-3000:]
    assert "recorded in a CUDA graph, and a CUDA/HIP graph needs a GPU" in run.stdout, run.stdout[-3000:]
