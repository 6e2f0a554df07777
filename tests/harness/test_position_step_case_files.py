"""The position step's case file and replay (rope.harness.position_step.case_file, .replay): a failing
step writes one, it round-trips, every bad field is a ValueError naming it, and ``rope-harness repro``
and ``pytest --rope-repro`` replay it: exit 1 while the implementation is broken, 0 once fixed, 2 when
the file cannot be replayed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from properties.mutants.broken_positions import delta_missing_in_decode
from properties.position_step.known_steps import CHUNK_2, DECODE, LONG_3D
from properties.strategies import ragged_batches
from rope.harness import case_files, causes
from rope.harness.position_step.case_file import KIND, load_case
from rope.harness.position_step.cases import RaggedBatch
from rope.harness.position_step.check import assert_positions_match
from rope.harness.position_step.replay import run_repro
from rope.harness.repro import REPLAYS
from tests.fresh_runs import run_pytest

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

MUTANT = "properties.mutants.broken_positions:delta_missing_in_decode"


@settings(max_examples=60, deadline=None)
@given(batch=ragged_batches())
def test_a_step_round_trips_through_json(batch):
    assert RaggedBatch.from_dict(json.loads(json.dumps(batch.to_dict()))) == batch


def _failed_case_file(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    with pytest.raises(AssertionError) as failure:
        assert_positions_match(MUTANT, delta_missing_in_decode, DECODE, "cpu")
    files = sorted(tmp_path.glob("*.json"))
    info = causes.failure_of(failure.value)        # the run's failure block shows them (short message lines)
    assert len(files) == 1 and info["case_file"] == case_files.display_path(files[0]), (files, info)
    assert info["replay"] == f"rope-harness repro {info['case_file']} --impl {MUTANT}"
    return files[0]


def test_a_failing_step_writes_a_case_file_that_replays(tmp_path, monkeypatch, capsys):
    path = _failed_case_file(tmp_path, monkeypatch)
    loaded = load_case(path)
    assert loaded.batch == DECODE and loaded.device == "cpu" and loaded.record["kind"] == KIND == "position_step"
    assert loaded.record["diagnosis"]["label"] == "wrong_positions"
    assert KIND in REPLAYS
    assert run_repro(path, device=None, impl=MUTANT) == 1                     # still broken
    assert "still differs" in capsys.readouterr().out
    assert run_repro(path, device=None, impl="native") == 0                   # fixed
    assert run_repro(path, device=None, impl=None) == 2                       # a module path is never imported
    assert "never imports a module path" in capsys.readouterr().err


@pytest.mark.parametrize("field, value, says", [
    ("batch", {"num_dims": 3}, "batch: must be an object with exactly"),
    ("batch", {**CHUNK_2.to_dict(), "num_dims": 7}, "batch.num_dims=7"),
    ("batch", {**CHUNK_2.to_dict(), "idx_mapping": [5]}, "batch.idx_mapping"),
    ("batch", {**CHUNK_2.to_dict(), "prefill_positions": [1, 2]}, "batch.prefill_positions"),
    ("batch", {**LONG_3D.to_dict(), "query_lens": [1 << 25]}, "more than"),
    ("batch", {**CHUNK_2.to_dict(), "padding": True}, "batch.padding"),
    ("device", "tpu", "device='tpu'"),
    ("problems", "wrong", "problems: must be a list"),
    ("diagnosis", {"label": "nope"}, "diagnosis: must be an object"),
])
def test_every_bad_field_is_a_value_error_naming_it(tmp_path, monkeypatch, field, value, says):
    path = _failed_case_file(tmp_path, monkeypatch)
    record = json.loads(path.read_text())
    record[field] = value
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace("[", r"\[")):
        load_case(path)
    assert run_repro(path, device=None, impl="native") == 2


def test_pytest_rope_repro_replays_it(tmp_path, monkeypatch):
    path = _failed_case_file(tmp_path / "cases", monkeypatch)
    replay = "properties.position_step.test_replay"
    broken = run_pytest(["-q", "-p", "no:randomly", "--pyargs", replay, "--rope-repro", str(path),
                         "--rope-position-step-impl", MUTANT], tmp_path)
    assert broken.returncode == 1 and "1 failed" in broken.stdout, broken.stdout[-2000:]
    fixed = run_pytest(["-q", "-p", "no:randomly", "--pyargs", replay, "--rope-repro", str(path),
                        "--rope-position-step-impl", "native"], tmp_path)
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, fixed.stdout[-2000:]
