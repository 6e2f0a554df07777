"""Case files (the envelope rope.harness.case_files, the rotation's kind rope.harness.rotation.case_file), the
mismatch report built around them (rope.harness.rotation.check) and their replay (rope.harness.rotation.replay,
``rope-harness repro``, ``pytest --rope-repro``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest
import torch
from hypothesis import given, reproduce_failure, settings

from rope.harness.rotation import case_file, check as rotation_check
from rope.harness.rotation.check import assert_matches_reference
import properties
from properties.mutants.broken_rotations import BROKEN_ROTATIONS, neox_for_gptj
from properties.strategies import RotationCase, build_rotation_inputs, rotation_cases
from rope.harness import case_files, repro  # noqa: F401  (repro: every kind of case file registered)
from rope.harness.cli import main as cli_main
from rope.devices import available_devices
from rope.native import rotate_native
from rope.spec import RopeSpec

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

ROOT = Path(__file__).resolve().parents[2]
GLM_41V = RopeSpec(head_size=128, rotary_dim=64, is_neox_style=False, sections=(8, 12, 12),
                   layout="chunked", base=10000.0, max_position=4096)
CASE = RotationCase(GLM_41V, 5, 3, 2, "float32", "uniform", True, 1)    # packed qkv: strided q/k
MUTANT = "properties.mutants.broken_rotations:neox_for_gptj"


@pytest.fixture
def case_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cases"
    monkeypatch.setenv(case_files.CASES_DIR_ENV, str(directory))
    return directory


def _fail(name="neox_for_gptj", fn=neox_for_gptj, case=CASE) -> str:
    with pytest.raises(AssertionError) as info:
        assert_matches_reference(name, fn, case, "cpu")
    return str(info.value)


def _written(case_dir) -> Path:
    files = sorted(case_dir.glob("*.json"))
    assert len(files) == 1, files
    return files[0]


# --------------------------------------------------------------------------- writing
def test_mismatch_writes_a_case_file_that_loads_back(case_dir):
    message = _fail()
    path = _written(case_dir)
    text = path.read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    loaded = case_file.load_case(path)
    record = loaded.record
    assert record["kind"] == "rotation" and [k for k in record if k != "kind"] == list(case_file.FIELDS)
    assert loaded.case == CASE
    assert (loaded.id, path.name) == (case_file.case_id(MUTANT, "cpu", CASE.to_dict()), f"{loaded.id}.json")
    assert (loaded.implementation, loaded.device, loaded.working_precision) == (MUTANT, "cpu", "activation")
    assert record["schema_version"] == case_file.SCHEMA_VERSION
    # Strides as the implementation saw them: rows of the packed [T, (3 + 2*2) * 128] tensor.
    assert record["strides"]["query"] == {"shape": [5, 384], "stride": [896, 1], "storage_offset": 0}
    assert record["strides"]["key"] == {"shape": [5, 256], "stride": [896, 1], "storage_offset": 384}
    result = record["result"]
    assert result["num_mismatched"] > 0 and result["num_elements"] == 5 * 5 * 128
    worst = result["worst"][0]
    assert worst["error"] > worst["bound"] and worst["ratio"] == worst["error"] / worst["bound"]
    assert {"freq", "member", "row"} <= set(worst) and worst["tensor"] in ("query", "key")
    assert loaded.diagnosis.label == "pairing_swapped"
    assert record["hypothesis"] is None              # not run under Hypothesis
    assert record["test"] == os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
    assert {"torch", "triton", "transformers", "hypothesis", "python"} <= set(record["versions"])
    assert datetime.fromisoformat(record["created"]).tzinfo is not None
    assert str(path.name) in message


def test_message_anatomy(case_dir):
    lines = _fail().splitlines()
    cid = _written(case_dir).stem
    assert lines[0] == f"neox_for_gptj ({MUTANT}) on cpu does not match the reference (case {cid})"
    assert lines[1].startswith("diagnosis: pairing_swapped: ")
    # Every line short (a long one wrapped, its continuation indented), the header and the case
    # file's two lines, which are copied as they are, excepted.
    assert all(len(line) <= case_files.LINE_WIDTH for line in lines[1:-2]), lines
    where = next(i for i, line in enumerate(lines) if line.startswith("  where: "))
    assert lines[where].startswith("  where: query: ") and all(line.startswith("    ") for line in lines[2:where])
    first_worst = next(i for i, line in enumerate(lines) if "[token" in line)
    assert first_worst > lines.index(next(line for line in lines if line.startswith("Mismatched elements")))
    assert lines[-2] == f"case file: {case_files.display_path(case_dir / f'{cid}.json')}"
    # The command as it must be typed: a replay never imports a module path stored in the file, so
    # an implementation named by import path is named again with --impl.
    assert lines[-1] == f"replay: rope-harness repro {case_files.display_path(case_dir / f'{cid}.json')} --impl {MUTANT}"
    assert case_files.replay_command("c.json", "native") == "rope-harness repro c.json"


def test_mismatch_report_steps(case_dir, monkeypatch):
    # assert_matches_reference's steps one by one: diagnose, write the case file, format.  The
    # formatter only formats: with case files turned off it still gives the same text, and no file.
    run = rotation_check.evaluate_case("neox_for_gptj", neox_for_gptj, CASE, "cpu")
    diagnosis = rotation_check.diagnose_mismatch(neox_for_gptj, CASE, run)
    assert diagnosis.label == "pairing_swapped"
    path, note = case_file.write_case_file(MUTANT, neox_for_gptj, CASE, "cpu", run, diagnosis, None)
    assert (note, path, run.case_file) == (None, _written(case_dir), str(path))
    path.unlink()
    monkeypatch.setenv(case_files.CASES_DIR_ENV, "off")
    message = rotation_check.mismatch_message("neox_for_gptj", MUTANT, CASE, "cpu", run.comparison, diagnosis,
                                          case_path=path)
    assert not case_dir.exists() or not list(case_dir.iterdir())
    monkeypatch.setenv(case_files.CASES_DIR_ENV, str(case_dir))
    assert _fail() == message                        # what the assertion says, word for word
    assert case_file.write_case_file(MUTANT, neox_for_gptj, CASE, "cpu", run, diagnosis, None)[0] == path
    monkeypatch.setenv(case_files.CASES_DIR_ENV, "off")
    assert case_file.write_case_file(MUTANT, neox_for_gptj, CASE, "cpu", run, diagnosis, None) == \
        (None, "not written (ROPE_CASES_DIR='off')")


def _raises(spec, positions, query, key, cache):
    raise RuntimeError("kernel exploded")


@pytest.mark.parametrize("fn, says", [
    (lambda spec, positions, query, key, cache: None, "the implementation returned a NoneType: it must return (query_out, key_out)"),
    (lambda spec, positions, query, key, cache: (query, key, None), "the implementation returned a 3-tuple: it must return"),
    (lambda spec, positions, query, key, cache: query, "the implementation returned a Tensor: it must return"),
    (_raises, "the implementation raised RuntimeError: kernel exploded (at "),
], ids=["none", "3-tuple", "tensor", "raises"])
def test_a_misbehaving_implementation_fails_with_a_case_file(case_dir, fn, says):
    # Contained: not a raw TypeError inside the harness, but a mismatch with its reason and a case file.
    message = _fail("misbehaving", fn)
    # Long lines are wrapped (rope.harness.case_files.wrap): the words are compared, not the breaks.
    words = " ".join(message.split())
    assert "misbehaving on cpu does not match the reference (case " in message and says in words, message
    assert "diagnosis: wrong_output" in message and _written(case_dir).is_file()


@pytest.mark.parametrize("fn", [lambda spec, positions, query, key, cache: None,
                                lambda spec, positions, query, key, cache: (query.double(), key),
                                lambda spec, positions, query, key, cache: (query[:, :64], key)],
                         ids=["none", "dtype", "shape"])
def test_a_zero_token_mismatch_is_diagnosed(case_dir, fn):
    # A property shrunk to 0 tokens: the diagnosis once failed with "cannot reshape tensor of 0 elements".
    empty = RotationCase(GLM_41V, 0, 3, 2, "float32", "uniform", False, 1)
    message = _fail("misbehaving", fn, case=empty)
    assert "diagnosis failed" not in message and "diagnosis: wrong_output" in message, message


def test_same_mismatch_same_file(case_dir):
    _fail()
    first = _written(case_dir)
    _fail()
    assert _written(case_dir) == first
    other = RotationCase(**{**CASE.__dict__, "seed": 2})
    ids = {case_file.case_id(MUTANT, "cpu", CASE.to_dict()), case_file.case_id(MUTANT, "cuda", CASE.to_dict()),
           case_file.case_id("native", "cpu", CASE.to_dict()), case_file.case_id(MUTANT, "cpu", other.to_dict())}
    assert len(ids) == 4
    reordered = dict(reversed(list(CASE.to_dict().items())))
    assert case_file.case_id(MUTANT, "cpu", reordered) == first.stem


def test_case_files_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(case_files.CASES_DIR_ENV, "off")
    message = _fail()
    assert "does not match the reference" in message and "case file: not written" in message
    assert "replay:" not in message and not list(tmp_path.rglob("*.json"))


def test_report_problems_never_mask_the_mismatch(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(case_files.CASES_DIR_ENV, str(blocker / "cases"))    # cannot be created
    message = _fail()
    assert "does not match the reference" in message and f"case file: not written to {blocker / 'cases'}" in message
    assert "diagnosis: pairing_swapped" in message

    def broken(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(rotation_check, "diagnose", broken)
    assert "diagnosis: unknown: diagnosis failed (RuntimeError: boom)" in _fail()
    monkeypatch.setattr(case_file, "case_record", broken)
    message = _fail()
    assert "does not match the reference" in message and "(mismatch report failed: RuntimeError: boom)" in message
    assert "Worst error/bound" in message


def test_write_is_atomic(tmp_path, monkeypatch):
    calls = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", fd)), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda src, dst: (calls.append(("replace", Path(src), Path(dst))),
                                                         real_replace(src, dst))[1])
    path = case_files.write_case({"id": "abc", "x": float("inf")}, tmp_path)
    assert path == tmp_path / "abc.json" and json.loads(path.read_text()) == {"id": "abc", "x": "inf"}
    replaces = [c for c in calls if c[0] == "replace"]
    assert len(replaces) == 1 and replaces[0][1].parent == tmp_path and replaces[0][2] == path
    assert calls.index(replaces[0]) > 0 and calls[0][0] == "fsync"        # data synced before the rename
    # A record that cannot be serialized leaves neither a file nor a temporary behind.
    with pytest.raises(TypeError):
        case_files.write_case({"id": "bad", "x": object()}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc.json"]


def test_concurrent_writers_never_expose_a_partial_file(tmp_path):
    records = [{"id": "same", "writer": w, "payload": "x" * 20000} for w in range(4)]
    case_files.write_case(records[0], tmp_path)
    stop, seen, errors = threading.Event(), set(), []

    def read():
        while not stop.is_set():
            try:
                seen.add(json.loads((tmp_path / "same.json").read_text())["writer"])
            except Exception as exc:                  # a torn or empty file
                errors.append(exc)

    def write(record):
        for _ in range(40):
            case_files.write_case(record, tmp_path)
    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(r,)) for r in records]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert not errors and seen and [p.name for p in tmp_path.iterdir()] == ["same.json"]


def test_implementation_path():
    assert case_file.implementation_path("native", rotate_native) == "native"
    assert case_file.implementation_path("rope.native:rotate_native", rotate_native) == "rope.native:rotate_native"
    assert case_file.implementation_path("broken", BROKEN_ROTATIONS["key_unrotated"]) == \
        "properties.mutants.broken_rotations:key_unrotated"
    local = lambda *a: None                            # noqa: E731  (not importable)
    assert case_file.implementation_path("mine", local) == "mine"


# --------------------------------------------------------------------------- Hypothesis
def test_hypothesis_writes_only_the_final_example_with_a_working_blob(case_dir):
    seen = []

    @settings(max_examples=100, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(case=rotation_cases(dtype="float32", kind="chunked3", is_neox_style=False, min_tokens=1))
    def neox_for_gptj_matches_reference(case):
        seen.append(case)
        assert_matches_reference("neox_for_gptj", neox_for_gptj, case, "cpu")

    with pytest.raises(AssertionError, match="does not match the reference"):
        neox_for_gptj_matches_reference()
    assert len(seen) > 2                             # found, shrunk, replayed: one file all the same
    loaded = case_file.load_case(_written(case_dir))
    assert loaded.case == seen[-1]
    blob = loaded.record["hypothesis"]["reproduce_blob"]
    assert blob and loaded.record["hypothesis"]["version"] in loaded.record["hypothesis"]["decorator"]
    seen.clear()
    with pytest.raises(AssertionError, match="does not match the reference"):
        reproduce_failure(loaded.record["hypothesis"]["version"], blob.encode())(neox_for_gptj_matches_reference)()
    assert seen == [loaded.case]


# --------------------------------------------------------------------------- loading
def _mutated(path: Path, change) -> Path:
    record = json.loads(path.read_text())
    change(record)
    out = path.parent.parent / "mutated.json"        # outside the case's directory
    out.write_text(json.dumps(record))
    return out


@pytest.fixture(scope="module")
def good_case(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("good") / "cases"
    mp = pytest.MonkeyPatch()
    mp.setenv(case_files.CASES_DIR_ENV, str(directory))
    try:
        _fail()
    finally:
        mp.undo()
    return _written(directory)


@pytest.mark.parametrize("field", case_file.FIELDS)
def test_load_names_a_missing_field(good_case, field):
    path = _mutated(good_case, lambda r: r.pop(field))
    with pytest.raises(ValueError, match=f"case file {path}: missing field '{field}'"):
        case_file.load_case(path)


@pytest.mark.parametrize("change, problem", [
    (lambda r: r.__setitem__("schema_version", 2), r"schema_version=2: newer than this rope-harness understands \(1\)"),
    (lambda r: r.__setitem__("schema_version", "1"), "schema_version='1': must be an int >= 1"),
    (lambda r: r["case"].pop("seed"), "missing field 'case.seed'"),
    (lambda r: r["diagnosis"].pop("label"), "missing field 'diagnosis.label'"),
    (lambda r: r["case"].__setitem__("dtype", "float8"), "case.dtype='float8': must be one of"),
    (lambda r: r["case"].__setitem__("seed", -1), r"case.seed=-1: must be an int in \[0, 2\*\*64 - 1\]"),
    (lambda r: r["case"].__setitem__("seed", 10 ** 4000), r"case.seed=10000000000000000000\.\.\.\(4001 chars\): must be"),
    (lambda r: r["case"].__setitem__("num_tokens", 200_000), r"case.num_tokens=200000: must be an int in \[0, 131072\]"),
    (lambda r: r["case"].__setitem__("num_q_heads", 5000), r"case.num_q_heads=5000: must be an int in \[1, 1024\]"),
    (lambda r: r["case"].__setitem__("num_kv_heads", -1), r"case.num_kv_heads=-1: must be an int in \[0, 1024\]"),
    (lambda r: r["case"].update(num_tokens=100_000, num_q_heads=1000), r"case: .* elements: must be at most 268435456"),
    (lambda r: r["case"].__setitem__("packed_qkv", 1), "case.packed_qkv=1: must be true or false"),
    (lambda r: r["case"].__setitem__("cache_dtype", "float64"), "case.cache_dtype='float64': must be null or one of"),
    (lambda r: r["case"].__setitem__("view", "diagonal"), "case.view='diagonal': must be one of"),
    (lambda r: r["case"].__setitem__("view", "packed-qkv"), "case.view='packed-qkv': must be one of"),
    (lambda r: r["case"].update(view="row-gaps", packed_qkv=True), "case.view='row-gaps': must be one of .* and "
                                                                   "'contiguous' with packed_qkv: true"),
    (lambda r: r["case"].__setitem__("generator", "mt19937"), "case.generator='mt19937': must be one of"),
    (lambda r: r["case"].__setitem__("extra", 1), r"case: unknown fields \['extra'\]"),
    (lambda r: r["spec"].__setitem__("sections", [8, 12, 11]), r"spec: sections=\(8, 12, 11\): must sum"),
    (lambda r: r.__setitem__("device", "tpu"), "device='tpu': must be one of"),
    (lambda r: r.__setitem__("working_precision", "fp8"), "working_precision='fp8': must be one of"),
    (lambda r: r.__setitem__("spec", None), "spec=null: must have a value"),
    (lambda r: r.__setitem__("case", []), "case: must be a JSON object"),
])
def test_load_names_a_bad_value(good_case, change, problem):
    path = _mutated(good_case, change)
    with pytest.raises(ValueError, match=re.escape(f"case file {path}: ") + problem):
        case_file.load_case(path)


def test_a_case_with_a_table_of_its_own_dtype_round_trips(case_dir):
    # An fp32 table beside bf16 q and k: the case file keeps the table's dtype, the replay
    # regenerates the same bits, and a file without the field (written before it) means the
    # activation dtype.
    case = RotationCase(RopeSpec(64, 64, False, max_position=1 << 18), 3, 2, 1, "bfloat16", "last_row", False, 5,
                        cache_dtype="float32")
    with pytest.raises(AssertionError):
        assert_matches_reference(MUTANT, neox_for_gptj, case, "cpu")
    loaded = case_file.load_case(_written(case_dir))
    assert loaded.case == case and loaded.record["case"]["cache_dtype"] == "float32"
    assert build_rotation_inputs(loaded.case).cache.dtype == torch.float32
    old = json.loads(_written(case_dir).read_text())
    old["case"].pop("cache_dtype")
    path = case_dir / "old.json"
    path.write_text(json.dumps(old))
    assert case_file.load_case(path).case.cache_dtype is None


def test_load_rejects_corrupt_files(good_case, tmp_path):
    truncated = tmp_path / "truncated.json"
    truncated.write_text(good_case.read_text()[:200])
    with pytest.raises(ValueError, match=f"case file {truncated}: not valid JSON .* corrupt or truncated"):
        case_file.load_case(truncated)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(ValueError, match=f"case file {listed}: must hold a JSON object"):
        case_file.load_case(listed)
    with pytest.raises(ValueError, match="cannot read it"):
        case_file.load_case(tmp_path / "absent.json")


def test_load_names_the_file_for_an_unconvertible_number(good_case, tmp_path):
    huge = tmp_path / "huge-seed.json"
    huge.write_text(re.sub(r'"seed": \d+', '"seed": 1' + "0" * 5000, good_case.read_text()))
    with pytest.raises(ValueError, match=f"case file {huge}: not readable as JSON .*digits"):
        case_file.load_case(huge)


def test_loaded_hypothesis_and_test_may_be_null(good_case):
    path = _mutated(good_case, lambda r: r.update(hypothesis=None, test=None))
    assert case_file.load_case(path).case == CASE


# --------------------------------------------------------------------------- replay
def test_cli_repro_exits_1_while_mismatching_and_0_once_fixed(good_case, case_dir, capsys):
    assert cli_main(["repro", str(good_case), "--impl", MUTANT]) == 1
    out = capsys.readouterr().out
    assert f"{MUTANT} on cpu still does not match the reference (case {good_case.stem})" in out
    assert "diagnosis: pairing_swapped" in out and "error/bound" in out and "warning" not in out
    assert cli_main(["repro", str(good_case), "--impl", "native"]) == 0
    assert "native on cpu matches the reference: fixed" in capsys.readouterr().out
    assert not case_dir.exists()                       # a replay writes no case file


def test_cli_repro_bad_input_exits_2(good_case, tmp_path, capsys):
    assert cli_main(["repro", str(tmp_path / "absent.json")]) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert cli_main(["repro", str(good_case), "--impl", "no_such_impl"]) == 2
    assert "impl='no_such_impl'" in capsys.readouterr().err
    unknown = _mutated(good_case, lambda r: r.__setitem__("implementation", "gone"))
    assert cli_main(["repro", str(unknown)]) == 2
    assert "implementation='gone' is not a registered name" in capsys.readouterr().err
    missing = next((d for d in ("cuda", "xpu") if d not in available_devices()), None)
    if missing:
        assert cli_main(["repro", str(good_case), "--impl", MUTANT, "--device", missing]) == 2
        assert f"device={missing!r}: not available here" in capsys.readouterr().err


def test_cli_repro_exits_2_when_inputs_do_not_regenerate(good_case, capsys):
    # A replay of other bits proves nothing: not "fixed", not "mismatch", but cannot be replayed.
    path = _mutated(good_case, lambda r: r["case"].__setitem__("seed", 12345))
    assert cli_main(["repro", str(path), "--impl", "native"]) == 2
    err = capsys.readouterr().err
    assert "regenerated inputs differ from the recorded ones (positions, query, key" in err and "fixed" not in err


def test_case_file_never_imports_the_module_it_names(good_case, tmp_path, monkeypatch, capsys):
    # A case file is data: the module path it stores is shown with the option to run it, not imported.
    marker = tmp_path / "imported"
    (tmp_path / "planted_impl.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef fn(*a): return a[2], a[3]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for stored in ("planted_impl:fn", "os:system", "this:s"):
        path = _mutated(good_case, lambda r: r.__setitem__("implementation", stored))
        assert cli_main(["repro", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"implementation={stored!r} is not a registered name" in err and f"--impl {stored}" in err
    assert not marker.exists(), "replaying a case file imported the module it names"
    assert "planted_impl" not in sys.modules


def test_cli_repro_exits_2_when_the_implementation_crashes(good_case, tmp_path, monkeypatch, capsys):
    (tmp_path / "crashing_impl.py").write_text("def fn(*args):\n    raise RuntimeError('kernel exploded')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli_main(["repro", str(good_case), "--impl", "crashing_impl:fn"]) == 2
    assert "crashing_impl:fn on cpu crashed on case" in capsys.readouterr().err


def test_nonfinite_round_trips_and_old_files_without_it_load(good_case, tmp_path):
    # A case with planted NaN/inf regenerates them; a file written before the field existed loads
    # with nonfinite=False and keeps its id.
    case = RotationCase(**{**CASE.__dict__, "nonfinite": True})
    planted = build_rotation_inputs(case)
    plain = build_rotation_inputs(CASE)
    assert not torch.isfinite(planted.query).all() and torch.isfinite(plain.query).all()
    finite = torch.isfinite(planted.query)
    assert torch.equal(planted.query[finite], plain.query[finite])     # only the planted elements differ
    assert case_file.case_id(MUTANT, "cpu", CASE.to_dict()) != case_file.case_id(MUTANT, "cpu", case.to_dict())
    record = json.loads(good_case.read_text())
    del record["case"]["nonfinite"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(record))
    loaded = case_file.load_case(old)
    assert loaded.case.nonfinite is False and loaded.id == case_file.case_id(MUTANT, "cpu", loaded.case.to_dict())
    record["case"]["nonfinite"] = "yes"
    old.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"case.nonfinite='yes': must be true or false"):
        case_file.load_case(old)


def test_view_round_trips_replays_and_old_files_without_it_load(good_case, case_dir, tmp_path, capsys):
    # A case on a strided view records it and replays on the same layout; a file written before the
    # field existed loads as the contiguous case and keeps its id.
    from properties.mutants.broken_rotations import heads_at_contiguous_stride
    case = RotationCase(**{**CASE.__dict__, "packed_qkv": False, "view": "heads-major"})
    _fail("heads_at_contiguous_stride", heads_at_contiguous_stride, case)
    path = _written(case_dir)
    record = json.loads(path.read_text())
    assert record["case"]["view"] == "heads-major" and record["diagnosis"]["label"] == "view_misread"
    assert record["strides"]["query"]["stride"] == [1, CASE.num_tokens]
    loaded = case_file.load_case(path)
    assert loaded.case == case and loaded.id == record["id"]
    assert cli_main(["repro", str(path), "--impl", MUTANT.replace("neox_for_gptj", "heads_at_contiguous_stride")]) == 1
    assert "diagnosis: view_misread" in capsys.readouterr().out
    assert cli_main(["repro", str(path), "--impl", "native"]) == 0
    assert "warning" not in capsys.readouterr().out            # regenerated on the recorded layout
    old = json.loads(good_case.read_text())
    del old["case"]["view"]
    old_path = tmp_path / "old-view.json"
    old_path.write_text(json.dumps(old))
    loaded = case_file.load_case(old_path)
    assert loaded.case.view == "contiguous" and loaded.id == old["id"] == case_file.case_id(
        MUTANT, "cpu", loaded.case.to_dict())
    with pytest.raises(ValueError, match=r"view='diagonal': must be one of \('contiguous', 'packed-qkv'"):
        RotationCase(**{**CASE.__dict__, "view": "diagonal"})


def test_counter_case_round_trips_replays_and_old_files_load_as_torch_cpu(good_case, case_dir, tmp_path, capsys):
    # A counter case (inputs made on the device from the seed) records its generator and replays the
    # same bits; a file written before the field existed is the torch-cpu case it was, with its id.
    case = RotationCase(**{**CASE.__dict__, "generator": "counter", "nonfinite": True})
    _fail(case=case)
    path = _written(case_dir)
    record = json.loads(path.read_text())
    assert record["case"]["generator"] == "counter"
    loaded = case_file.load_case(path)
    assert loaded.case == case and loaded.id == record["id"] != json.loads(good_case.read_text())["id"]
    assert cli_main(["repro", str(path), "--impl", MUTANT]) == 1
    assert "warning" not in capsys.readouterr().out            # the very bits regenerated (inputs_sha256)
    old = json.loads(good_case.read_text())
    assert "generator" not in old["case"] or old["case"]["generator"] == "torch-cpu"
    old["case"].pop("generator", None)
    old_path = tmp_path / "old-generator.json"
    old_path.write_text(json.dumps(old))
    loaded = case_file.load_case(old_path)
    assert loaded.case.generator == "torch-cpu" and loaded.id == old["id"]
    assert cli_main(["repro", str(old_path), "--impl", MUTANT]) == 1
    assert "warning" not in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"generator='philox': must be one of \('counter', 'torch-cpu'\)"):
        RotationCase(**{**CASE.__dict__, "generator": "philox"})


def test_cli_repro_exits_2_when_the_implementation_hangs(good_case, tmp_path, monkeypatch, capsys):
    (tmp_path / "hanging_impl.py").write_text("import time\ndef fn(*args):\n    time.sleep(600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ROPE_CALL_TIMEOUT", "0.5")
    monkeypatch.setenv(case_files.CASES_DIR_ENV, str(tmp_path / "cases"))
    assert cli_main(["repro", str(good_case), "--impl", "hanging_impl:fn"]) == 2
    assert "hanging_impl:fn on cpu did not return on case" in capsys.readouterr().err


def _pytest(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", *args],
                          cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600)


def test_pytest_rope_repro(good_case, tmp_path):
    env = {case_files.CASES_DIR_ENV: str(tmp_path / "replayed")}
    stored = _pytest("properties/rotation/test_replay.py", "--rope-repro", str(good_case), env=env)
    assert stored.returncode == 1 and "a replay never imports a module path stored in a case file" in stored.stdout
    failing = _pytest("properties/rotation/test_replay.py", "properties/rotation/test_regressions.py", "--rope-repro", str(good_case),
                      "--rope-impl", MUTANT, env=env)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "diagnosis: pairing_swapped" in failing.stdout and "deselected" in failing.stdout
    assert "1 failed" in failing.stdout
    fixed = _pytest("properties/rotation/test_replay.py", "--rope-repro", str(good_case.parent), "--rope-impl", "native", env=env)
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, fixed.stdout + fixed.stderr
    tampered = _mutated(good_case, lambda r: r["case"].__setitem__("seed", 12345))
    regenerated = _pytest("properties/rotation/test_replay.py", "--rope-repro", str(tampered), "--rope-impl", "native", env=env)
    assert regenerated.returncode == 1 and "regenerated inputs differ" in regenerated.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    usage = _pytest("properties/rotation/test_replay.py", "--rope-repro", str(bad), env=env)
    assert usage.returncode == 2 and f"case file {bad}: not valid JSON" in usage.stdout, usage.stdout + usage.stderr


def test_one_header_reader_for_every_kind_of_case_file(tmp_path):
    # The kind names the loader: a rotation file without one (as in the regression
    # corpus) is a rotation case; a position-id file is refused by the rotation loader
    # and the other way round, naming the field; an unknown kind or a newer schema is refused.
    corpus = sorted((Path(properties.__file__).parent / "regressions").glob("*.json"))
    assert corpus and "kind" not in json.loads(corpus[0].read_text())
    assert case_files.case_kind(corpus[0]) == "rotation"
    case_file.load_case(corpus[0])
    record = json.loads(corpus[0].read_text())
    for kind, message in (("position_ids", "kind='position_ids': must be 'rotation' here"),
                          ("scheduler", "kind='scheduler': must be one of")):
        (tmp_path / "k.json").write_text(json.dumps({**record, "kind": kind}))
        with pytest.raises(ValueError, match=re.escape(message)):
            case_file.load_case(tmp_path / "k.json")
    (tmp_path / "new.json").write_text(json.dumps({**record, "schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version=99: newer than this rope-harness understands"):
        case_files.read_header(tmp_path / "new.json")
    assert case_files.case_kind(tmp_path / "missing.json") is None


def test_a_replayed_call_that_hangs_or_crashes_cannot_be_replayed():
    # Every kind's replay turns a hang or a crash of the implementation into the ValueError that makes
    # `rope-harness repro` exit 2; an exception the kind reports itself is let through.
    from rope.harness.deadline import ImplementationHung

    def run(exc, own=()):
        with case_files.replayed_call("mine", "abc", own=own):
            raise exc

    with pytest.raises(ValueError, match=r"mine did not return on case abc within the call deadline"):
        run(ImplementationHung("late"))
    with pytest.raises(ValueError, match=r"mine failed on case abc \(ZeroDivisionError: boom\)"):
        run(ZeroDivisionError("boom"))
    with pytest.raises(KeyError):
        run(KeyError("own"), own=(KeyError,))
