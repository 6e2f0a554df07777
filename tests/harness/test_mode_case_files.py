"""A failure seen only in a mode (under torch.compile, in a CUDA-graph replay) writes a case file that
records the mode, and its replay calls the implementation the same way: a compile-only bug replays
as a failure, not as an eager pass."""

from __future__ import annotations

import json
import re

import pytest
import torch

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


NONDETERMINISTIC = "properties.mutants.broken_rotations:wrong_in_half_of_large_calls"


@pytest.mark.parametrize("calls_before", [0, 1])
def test_a_bug_wrong_on_some_calls_only_fails_its_replay_too(case_dir, calls_before, capsys):
    # The mutant is wrong on every other call of 4 tokens or more: its case file replays in a fresh
    # count of calls, whichever call comes first.  The replay calls twice, as the properties do, so
    # the wrong call, or the two calls' different bits, is in it either way.
    from properties.mutants import broken_rotations
    fn = BROKEN_ROTATIONS["wrong_in_half_of_large_calls"]
    with pytest.raises(AssertionError):
        for _ in range(2):                         # one of two consecutive calls is the wrong one
            checked_run(NONDETERMINISTIC, fn, CASE, "cpu")
    (path,) = sorted(case_dir.glob("*.json"))
    broken_rotations._LARGE_CALLS[0] = calls_before          # a fresh process starts at 0
    assert run_repro(path, device=None, impl=NONDETERMINISTIC) == EXIT_MISMATCH
    out = capsys.readouterr().out
    if calls_before == 0:            # the first call is the right one: the second fails the replay
        assert "the second call of the same inputs did not" in out, out
    assert run_repro(path, device=None, impl="native") == EXIT_FIXED


_CALLS = [0]
WITH_NAN = RotationCase(RopeSpec(64, 32, True, max_position=64), 5, 2, 1, "float32", "uniform", seed=3, nonfinite=True)


def other_nan_on_every_other_call(spec, positions, query, key, cache):
    """The native rotation, its NaN outputs with another payload on every other call: each call
    matches the reference (a NaN where it has one), the bits differ from call to call."""
    q, k = rotate_native(spec, positions, query, key, cache)
    _CALLS[0] += 1
    if _CALLS[0] % 2 == 0:
        q = q.clone()
        bits = q.view(torch.int32)
        bits[torch.isnan(q)] ^= 1                  # 0x7fc00000 -> 0x7fc00001: still a quiet NaN
    return q, k


def test_other_bits_from_the_same_inputs_fail_the_replay_unless_declared(case_dir, capsys):
    name = "tests.harness.test_mode_case_files:other_nan_on_every_other_call"
    run = checked_run(name, native_in_any_mode, WITH_NAN, "cpu")
    assert run.comparison.ok and bool(torch.isnan(run.q_out).any())
    write_mode_case_file(name, native_in_any_mode, WITH_NAN, "cpu", run.comparison,
                         Diagnosis("nondeterministic", "staged"), mode="eager")
    (path,) = sorted(case_dir.glob("*.json"))
    _CALLS[0] = 0
    assert run_repro(path, device=None, impl=name) == EXIT_MISMATCH
    assert "nondeterministic" in capsys.readouterr().out
    other_nan_on_every_other_call.deterministic = False        # declared: each call held to the bound alone
    try:
        _CALLS[0] = 0
        assert run_repro(path, device=None, impl=name) == EXIT_FIXED
    finally:
        del other_nan_on_every_other_call.deterministic
