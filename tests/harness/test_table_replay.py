"""The table's case file and replay (rope.harness.table.case_file / replay): a mismatch writes a case
file that loads back to the same case, every bad field is refused naming it, and the replay's exit
statuses: 0 fixed, 1 still wrong, 2 cannot replay (a module path stored in the file is never imported)."""

from __future__ import annotations

import json

import pytest
import torch

from rope.harness.table import replay
from rope.harness.table.case_file import load_case
from rope.harness.table.cases import TableCase
from rope.harness.table.check import assert_table_matches
from rope.spec import RopeSpec

MUTANT = "properties.mutants.broken_tables:mscale_dropped"
CASE = TableCase(RopeSpec(64, 64, max_position=8192, scaling={"rope_type": "yarn", "factor": 4.0,
                                                              "original_max_position": 2048}), 8192, torch.float32, 5)


@pytest.fixture
def case_file(tmp_path, monkeypatch):
    from properties.mutants.broken_tables import mscale_dropped
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    with pytest.raises(AssertionError, match="case file: "):
        assert_table_matches(MUTANT, mscale_dropped, CASE)
    (path,) = tmp_path.glob("*.json")
    return path


def test_the_case_file_loads_back_to_the_case(case_file):
    loaded = load_case(case_file)
    assert loaded.case == CASE and loaded.device == "cpu" and loaded.implementation == MUTANT
    assert loaded.record["diagnosis"]["label"] == "mscale_missing"


def test_replay_exit_statuses(case_file, capsys):
    assert replay.run_repro(case_file, device=None, impl=None) == 2           # the stored path is not imported
    assert "never imports a module path" in capsys.readouterr().err
    assert replay.run_repro(case_file, device=None, impl=MUTANT) == 1
    assert "diagnosis: mscale_missing" in capsys.readouterr().out
    assert replay.run_repro(case_file, device=None, impl="ours") == 0


@pytest.mark.parametrize("field, value, names", [
    ("case", {"spec": {}, "max_position": 4, "dtype": "float32", "seed": 0}, "case:"),
    ("case", {**CASE.to_dict(), "dtype": "int8"}, "dtype="),
    ("case", {**CASE.to_dict(), "max_position": 1 << 24}, "max_position x rotary_dim"),
    ("case", {**CASE.to_dict(), "seed": -1}, "seed="),
    ("device", "tpu", "device="),
    ("diagnosis", {"label": "nope"}, "diagnosis"),
    ("implementation", "", "implementation="),
])
def test_every_bad_field_is_refused_naming_it(case_file, tmp_path, field, value, names):
    record = json.loads(case_file.read_text())
    record[field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=names):
        load_case(bad)
    assert replay.run_repro(bad, device=None, impl="ours") == 2
