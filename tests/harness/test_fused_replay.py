"""The fused ops' case file and replay (rope.harness.fused.case_file / replay): a mismatch writes a case
file that loads back to the same case, every bad field is refused naming it, nothing stored in it is
imported, and the replay's exit statuses: 0 fixed, 1 still wrong (a broken implementation fails
again), 2 cannot replay; ``rope-harness repro FILE --fused-impl NAME`` names the implementation."""

from __future__ import annotations

import json

import pytest

from properties.fused.fused_cases import DEEPSEEK_V3, GLM41V, QWEN2, cache_case, mla_case, qk_norm_case
from rope.devices import triton_runs_on
from rope.harness.cli import main
from rope.harness.fused import replay
from rope.harness.fused.case_file import case_from_dict, load_case
from rope.harness.fused.check import assert_mla_rope_kv_cache

MUTANT = "properties.mutants.broken_fused:latent_k_pe_unrotated"
CASE = mla_case(DEEPSEEK_V3, num_tokens=5, num_heads=2, kv_lora_rank=16, cache="float8_e5m2", scale=2.5,
                q_layout="heads_major")

needs_triton_on_cpu = pytest.mark.skipif(not triton_runs_on("cpu"), reason="the fused kernels run on CPU tensors "
                                                                           "only under Triton's interpreter")


@pytest.fixture(scope="module")
def case_file(tmp_path_factory):
    """The case file the broken implementation's mismatch writes (once for the module: one launch)."""
    from properties.mutants.broken_fused import latent_k_pe_unrotated
    directory = tmp_path_factory.mktemp("cases")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("ROPE_CASES_DIR", str(directory))
        with pytest.raises(AssertionError, match=f"replay: rope-harness repro .* --fused-impl {MUTANT}"):
            assert_mla_rope_kv_cache(MUTANT, latent_k_pe_unrotated, CASE)
    (path,) = directory.glob("*.json")
    return path


@needs_triton_on_cpu
def test_the_case_file_loads_back_to_the_case(case_file):
    loaded = load_case(case_file)
    assert loaded.case == CASE and loaded.op == "mla_rope_kv_cache" and loaded.device == "cpu"
    assert loaded.implementation == MUTANT and loaded.record["diagnosis"]["label"] == "cache_k_pe_unrotated"


@needs_triton_on_cpu
def test_replay_exit_statuses(case_file, capsys):
    assert replay.run_repro(case_file, device=None, impl=None) == 2           # the stored path is not imported
    assert "never imports a module path" in capsys.readouterr().err
    assert main(["repro", str(case_file), "--fused-impl", MUTANT]) == 1     # the broken one fails again
    assert "diagnosis: cache_k_pe_unrotated" in capsys.readouterr().out
    assert main(["repro", str(case_file), "--fused-impl", "triton"]) == 0
    assert main(["repro", str(case_file), "--fused-impl", "unfused"]) == 2   # it has no MLA op
    assert "implements no mla_rope_kv_cache" in capsys.readouterr().err


def test_every_case_round_trips_through_its_record():
    for op, case in (("qk_norm_rope", qk_norm_case(GLM41V)), ("rope_kv_cache", cache_case(QWEN2)),
                     ("mla_rope_kv_cache", CASE)):
        assert case_from_dict(op, json.loads(json.dumps(case.to_dict()))) == case


@needs_triton_on_cpu
@pytest.mark.parametrize("field, value, names", [
    ("op", "rope", "op='rope'"),
    ("case", {**CASE.to_dict(), "nope": 1}, "case: must be an object with the fields"),
    ("case", {**CASE.to_dict(), "num_tokens": 0}, r"case\.num_tokens=0"),
    ("case", {**CASE.to_dict(), "num_heads": True}, r"case\.num_heads=True"),
    ("case", {**CASE.to_dict(), "seed": -1}, r"case\.seed=-1"),
    ("case", {**CASE.to_dict(), "scale": "nan"}, r"case\.scale='nan'"),
    ("case", {**CASE.to_dict(), "q_layout": "__import__('os')"}, r"case\.q_layout="),
    ("case", {**CASE.to_dict(), "spec": "deepseek"}, r"case\.spec=str"),
    ("case", {**CASE.to_dict(), "spec": {**CASE.spec.to_dict(), "head_size": -4}}, r"case\.spec: "),
    ("case", {**CASE.to_dict(), "num_blocks": 1 << 20, "block_size": 4096}, "elements of tensors"),
    ("case", {**CASE.to_dict(), "num_blocks": 1, "block_size": 2}, r"case\.num_blocks=1: 2 slots"),
    ("device", "tpu", "device="),
    ("problems", ["x" * 5000], "problems:"),
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
    assert replay.run_repro(bad, device=None, impl="triton") == 2
