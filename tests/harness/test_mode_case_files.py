"""A failure seen only in a mode (under torch.compile, in a CUDA-graph replay) writes a case file that
records the mode, and its replay calls the implementation the same way: a compile-only bug replays
as a failure, not as an eager pass."""

from __future__ import annotations

import json
import re

import pytest

from properties.mutants.broken_rotations import BROKEN_ROTATIONS
from rope.harness import case_files
from rope.harness.rotation import case_file
from rope.harness.rotation.check import checked_run, write_mode_case_file
from rope.harness.rotation.cases import RotationCase
from rope.harness.rotation.diagnosis import Diagnosis
from rope.harness.rotation.modes import compiled_implementation
from rope.harness.rotation.replay import EXIT_BAD_INPUT, EXIT_FIXED, EXIT_MISMATCH, replay, run_repro
from rope.native import rotate_native
from rope.registry import implementation_record
from rope.spec import RopeSpec

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

MUTANT = "properties.mutants.broken_rotations:skipped_under_compile"
ANY_MODE = "tests.harness.test_mode_case_files:native_in_any_mode"


def native_in_any_mode(spec, positions, query, key, cache):
    """The native rotation, declaring every mode (the default): a graph-mode replay of it is refused
    only for want of a GPU, on any machine."""
    return rotate_native(spec, positions, query, key, cache)


native_in_any_mode.working_precision = "activation"
CASE = RotationCase(RopeSpec(64, 32, True, max_position=64), 5, 2, 1, "float32", "uniform", False, 3)


@pytest.fixture
def case_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cases"
    monkeypatch.setenv(case_files.CASES_DIR_ENV, str(directory))
    return directory


def _compile_failure(case_dir):
    record = implementation_record(MUTANT, fn=BROKEN_ROTATIONS["skipped_under_compile"])
    with pytest.raises(AssertionError) as info:
        checked_run(MUTANT, compiled_implementation(record, "cpu"), CASE, "cpu", mode="compile")
    (path,) = sorted(case_dir.glob("*.json"))
    return path, str(info.value)


def test_a_compile_only_failure_replays_under_compile(case_dir, capsys):
    path, message = _compile_failure(case_dir)
    loaded = case_file.load_case(path)
    assert (loaded.mode, loaded.replay_tokens, loaded.case) == ("compile", [], CASE)
    assert f"rope-harness repro {case_files.display_path(path)}" in message
    # Under torch.compile again it still fails; eagerly it would pass (the mutant is right eagerly).
    assert run_repro(path, device=None, impl=MUTANT) == EXIT_MISMATCH
    assert "called under torch.compile" in capsys.readouterr().out
    assert replay(path, impl="native").ok
    record = json.loads(path.read_text())
    record["case"]["mode"] = "eager"
    eager = path.with_name("eager.json")
    eager.write_text(json.dumps(record))
    assert run_repro(eager, device=None, impl=MUTANT) == EXIT_FIXED


def test_pytest_rope_repro_replays_a_compile_only_failure_under_compile(case_dir, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    path, _ = _compile_failure(case_dir)
    root = Path(__file__).resolve().parents[2]

    def run(impl):      # as test_case_files.py's _pytest runs it
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                               "properties/rotation/test_replay.py", "--rope-repro", str(path), "--rope-impl", impl],
                              cwd=root, capture_output=True, text=True, timeout=600,
                              env={**os.environ, case_files.CASES_DIR_ENV: str(tmp_path / "replayed")})
    # Eagerly the mutant is right: only a replay under torch.compile fails it again.
    failing = run(MUTANT)
    assert failing.returncode == 1 and "1 failed" in failing.stdout, failing.stdout + failing.stderr


def test_a_graph_case_file_records_its_replays_and_needs_a_gpu(case_dir):
    from rope.harness.rotation.bound import Comparison
    comparison = Comparison(CASE.spec, problems=["stale"])
    lines = write_mode_case_file(MUTANT, BROKEN_ROTATIONS["skipped_under_compile"], CASE, "cpu", comparison,
                                 Diagnosis("graph_replay_stale", "graph replay 1 of 3"), mode="graph",
                                 replay_tokens=[5, 2, 4])
    (path,) = sorted(case_dir.glob("*.json"))
    assert lines[0].endswith(path.name) and lines[1].startswith("replay: rope-harness repro")
    loaded = case_file.load_case(path)
    assert (loaded.mode, loaded.replay_tokens) == ("graph", [5, 2, 4])
    with pytest.raises(ValueError, match="recorded in a CUDA graph, and a CUDA/HIP graph needs a GPU"):
        replay(path, impl=ANY_MODE, device="cpu")
    assert run_repro(path, device="cpu", impl=ANY_MODE) == EXIT_BAD_INPUT


@pytest.mark.parametrize("change, problem", [
    ({"mode": "jit"}, "case.mode='jit': must be one of ('eager', 'compile', 'graph')"),
    ({"mode": "graph", "replay_tokens": []}, "case.replay_tokens=[]: a graph-mode case lists its replays"),
    ({"mode": "eager", "replay_tokens": [1]}, "case.replay_tokens=[1]: a graph-mode case lists its replays"),
    ({"mode": "graph", "replay_tokens": [6]}, r"case.replay_tokens=[6]: must be a list of at most 16 ints"),
    ({"mode": "graph", "replay_tokens": "5"}, "case.replay_tokens='5': must be a list"),
    ({"mode": "graph", "replay_tokens": [1] * 17}, "case.replay_tokens=[1, 1, 1, 1, 1, 1, 1...(51 chars): must be"),
])
def test_load_names_a_bad_mode(case_dir, change, problem):
    path, _ = _compile_failure(case_dir)
    record = json.loads(path.read_text())
    record["case"].update(change)
    bad = path.with_name("bad.json")
    bad.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=re.escape(problem)):
        case_file.load_case(bad)


def test_a_file_without_a_mode_is_eager(case_dir):
    path, _ = _compile_failure(case_dir)
    record = json.loads(path.read_text())
    for field in ("mode", "replay_tokens"):
        record["case"].pop(field)
    old = path.with_name("old.json")
    old.write_text(json.dumps(record))
    assert case_file.load_case(old).mode == "eager"
