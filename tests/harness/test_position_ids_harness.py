"""The position-id machinery (rope/harness/position_ids/): the registry and what it refuses, the
check of a return value, the diagnosis of each shipped bug, case files and their replay.

The mutants of properties/mutants/broken_position_ids.py are the bugs: each is caught by its
fixed prompt with its diagnosis label, and each is found by the drawn batches alone.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st

from properties.mutants import broken_position_ids as broken
from properties.prompt_strategies import batches
from properties.position_ids.known_prompts import KNOWN_BUG_PROMPTS
from properties.prompt_strategies import LONG_PROMPT
from reference.position_ids import prompt_positions
from rope.prompts import Audio, Image, Prompt, PromptBatch, Text, Video
from rope.harness.position_ids import case_file
from rope.harness.position_ids import check as position_ids_check
from rope.harness.position_ids import replay as position_ids_replay
from rope.harness.position_ids.check import check_result
from rope.harness.position_ids.diagnosis import LABELS, compare
from rope.harness.position_ids.implementations import get_position_ids_implementation, unsupported_reason
from rope.harness.suite import plugin_args, subprocess_env, suite_dir

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

MUTANTS = "properties.mutants.broken_position_ids"
PROMPTS = {name: (family, batch) for name, family, batch in KNOWN_BUG_PROMPTS}
# mutant -> (the fixed prompt that must catch it, the diagnosis it must get; None: a wrong shape)
CAUGHT_BY = {
    "temporal_scale_truncated": ("transformers#48669-fps4", "temporal_scale_truncated"),
    "merge_size_from_temporal_patch": ("vllm#37439-merge1", None),
    "frames_not_split": ("transformers#44474-qwen3-frames", "frames_not_split"),
    "video_as_text": ("vllm#33039-glm-video-as-text", "video_as_text"),
    "text_after_video_restart": ("transformers-5.3-text-after-long-video", "text_after_video_restart"),
    "delta_from_first_chunk": ("vllm#10403-delta-whole-prompt", "delta_wrong"),
    "negative_delta_clamped": ("LightLLM#1147-negative-delta", "negative_delta_clamped"),
    "positions_in_fp16": ("positions-past-2048", "text_wrong"),
    "zero_taken_as_missing": ("rtp-llm#1213-image-first", "zero_taken_as_missing"),
    "ordinal_across_batch": ("hunyuan-ordinal-per-prompt", "ordinal_across_batch"),
    "audio_bos_eos_counted_twice": ("vllm#16878-bos-eos-once", "audio_start_not_shared"),
    "image_end_shifted_with_audio_in_video": ("vllm#16878-image-beside-audio-in-video", "image_end_shifted"),
    "audio_advances_only_t": ("mstar#196-audio-rows", "audio_rows_held"),
    "second_per_grid_default": ("vllm#23056-spg-not-found", "temporal_scale_default"),
    "audio_in_video_flag_from_first_video": ("VeOmni#493-mixed-audio-videos", "audio_in_video_not_interleaved"),
}


def test_every_mutant_has_its_fixed_prompt():
    assert set(CAUGHT_BY) == set(broken.BROKEN_POSITION_IDS)
    assert all(key in PROMPTS for key, _ in CAUGHT_BY.values())
    assert all(label is None or label in LABELS for _, label in CAUGHT_BY.values())


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_fixed_prompt_catches_mutant_with_its_diagnosis(name):
    key, label = CAUGHT_BY[name]
    family, batch = PROMPTS[key]
    fn = broken.BROKEN_POSITION_IDS[name]
    if label is None:
        with pytest.raises(ValueError, match="positions: shape must be"):
            position_ids_check.check(fn, family, batch)
        return
    result = position_ids_check.check(fn, family, batch)
    assert not result.ok
    assert result.mismatches[0][1].label == label, result.mismatches[0][1].describe()
    assert position_ids_check.check(broken.reference_ids, family, batch).ok      # the unmutated parent passes


# The families where each mutant departs from the reference (elsewhere it returns the reference's ids).
DEPARTS_IN = {
    "temporal_scale_truncated": ("qwen2_5_vl",),
    "merge_size_from_temporal_patch": ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v"),
    "frames_not_split": ("qwen3_vl", "glm4v"),
    "video_as_text": ("glm4v",),
    "text_after_video_restart": ("qwen2_vl", "qwen2_5_vl"),
    "delta_from_first_chunk": ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "qwen2_5_omni", "qwen3_omni"),
    "negative_delta_clamped": ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "qwen2_5_omni", "qwen3_omni"),
    "positions_in_fp16": ("qwen2_vl", "qwen3_vl", "glm4v", "hunyuan_ocr"),
    # Qwen2.5-Omni: a video with audio opening the prompt has its audio start token at 0 too.
    "zero_taken_as_missing": ("hunyuan_ocr", "hunyuan_ocr_3d", "arc_hunyuan_video", "qwen2_5_omni"),
    "ordinal_across_batch": ("hunyuan_ocr", "hunyuan_ocr_3d", "arc_hunyuan_video"),
    "audio_bos_eos_counted_twice": ("qwen2_5_omni",),
    "image_end_shifted_with_audio_in_video": ("qwen2_5_omni",),
    "audio_advances_only_t": ("qwen2_5_omni", "qwen3_omni"),
    "second_per_grid_default": ("qwen2_5_omni", "qwen3_omni"),
    "audio_in_video_flag_from_first_video": ("qwen2_5_omni", "qwen3_omni"),
}


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_drawn_batches_alone_find_every_mutant(name):
    # The strategies reach every bug without the fixed prompts (one prompt per batch, but for the
    # bug only a batch shows).
    fn = broken.BROKEN_POSITION_IDS[name]
    max_batch = 3 if name == "ordinal_across_batch" else 1
    # As the suite draws them: a prompt may open with a long text run (positions past 2^15).
    long_text = LONG_PROMPT if name == "positions_in_fp16" else 0
    drawn = st.sampled_from(DEPARTS_IN[name]).flatmap(
        lambda f: st.tuples(st.just(f), batches(family=f, max_batch=max_batch, max_leading_text=long_text)))

    def caught(case) -> bool:
        family, batch = case
        try:
            return not position_ids_check.check(fn, family, batch).ok
        except ValueError:
            return True
    # Generation only: the first catch is enough (shrinking it cost a minute and proves nothing more).
    found = find(drawn, caught, settings=settings(max_examples=2000, database=None, deadline=None,
                                                   phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    assert caught(found)


def test_mutants_depart_only_where_declared():
    assert set(DEPARTS_IN) == set(broken.BROKEN_POSITION_IDS)
    for name, families in DEPARTS_IN.items():
        for family, batch in [PROMPTS[k] for k in PROMPTS]:
            if family not in families:
                assert position_ids_check.check(broken.BROKEN_POSITION_IDS[name], family, batch).ok, (name, family)


# ------------------------------------------------------------------------------------------ registry
@pytest.mark.parametrize("target, match", [
    ("nope", "not a registered name"),
    ("os:system", "is a builtin_function_or_method"),
    ("reference.position_ids:Prompt", "is a type"),
    ("no_such_module_xyz:fn", "cannot import module"),
    (f"{MUTANTS}:_ref", "public attribute names"),
])
def test_registry_refuses_what_is_no_implementation(target, match):
    with pytest.raises(ValueError, match=match):
        get_position_ids_implementation(target)


def test_unsupported_family_is_named():
    def qwen_only(family, prompt):
        return broken.reference_ids(family, prompt)
    qwen_only.families = ("qwen2_vl",)
    assert unsupported_reason("q", qwen_only, "qwen2_vl") is None
    assert "does not implement glm4v" in unsupported_reason("q", qwen_only, "glm4v")
    qwen_only.families = ("qwen9",)
    with pytest.raises(ValueError, match="unknown families"):
        unsupported_reason("q", qwen_only, "qwen2_vl")


PROMPT = Prompt((Text(1), Image((1, 2, 4))))


@pytest.mark.parametrize("result, match", [
    (None, "must be a pair"),
    ((1, 2, 3), "must be a pair"),
    (("positions", 0), "must be a torch.Tensor, numpy array or nested list"),
    (([[0]], 0), r"shape must be \(3, 5\)"),
    (([[0, 1], [2]], 0), "cannot be read as a tensor"),
    ((torch.zeros(3, 5), 0), "integer dtype"),
    ((torch.zeros(3, 4, dtype=torch.int64), 0), r"shape must be \(3, 5\)"),
    ((torch.zeros(3, 5, dtype=torch.int64), 0.5), "delta: must be an int"),
    ((torch.zeros(3, 5, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)), "delta: must be an int"),
])
def test_wrong_return_values_are_named(result, match):
    with pytest.raises(ValueError, match=match):
        check_result("qwen2_vl", PROMPT, result)


def test_return_value_is_normalised():
    ref = prompt_positions("qwen2_vl", PROMPT)
    pos, delta = check_result("qwen2_vl", PROMPT, (ref.positions.to(torch.int32), torch.tensor([ref.delta])))
    assert pos.dtype == torch.int64 and torch.equal(pos, ref.positions) and delta == ref.delta


def test_a_return_value_check_fails_the_property_with_the_reason():
    def returns_none(family, prompt):
        return None
    with pytest.raises(AssertionError, match="wrong return value: result: must be a pair"):
        position_ids_check.assert_matches("none", returns_none, "qwen2_vl", PromptBatch((PROMPT,)))


def test_numpy_results_are_accepted():
    import numpy as np
    ref = prompt_positions("qwen2_vl", PROMPT)
    pos, delta = check_result("qwen2_vl", PROMPT, (ref.positions.numpy(), np.int64(ref.delta)))
    assert torch.equal(pos, ref.positions) and delta == ref.delta


def test_a_raising_implementation_fails_the_property_with_what_it_raised():
    def raises(family, prompt):
        raise IndexError("list index out of range")
    with pytest.raises(AssertionError, match="raised IndexError: list index out of range"):
        position_ids_check.assert_matches("raises", raises, "qwen2_vl", PromptBatch((PROMPT,)))


def test_a_hanging_implementation_fails_at_the_call_deadline(monkeypatch):
    import time
    from rope.harness.deadline import ImplementationHung

    hang_s = 60

    def hangs(family, prompt):
        time.sleep(hang_s)
    monkeypatch.setenv("ROPE_CALL_TIMEOUT", "1")
    start = time.monotonic()
    with pytest.raises(ImplementationHung):
        position_ids_check.assert_matches("hangs", hangs, "qwen2_vl", PromptBatch((PROMPT,)))
    assert time.monotonic() - start < hang_s / 2, "ended by the deadline, long before the call would have returned"


def test_prompt_batch_validates_its_fields():
    with pytest.raises(ValueError, match="pads="):
        PromptBatch((PROMPT,), pads=(1, 2))
    with pytest.raises(ValueError, match="side="):
        PromptBatch((PROMPT,), side="middle")
    with pytest.raises(ValueError, match="spatial_merge_size"):
        PromptBatch((PROMPT, Prompt((Text(1),), spatial_merge_size=1)))


def test_delta_only_mismatch_is_located_nowhere():
    ref = prompt_positions("qwen2_vl", PROMPT)
    m = compare("qwen2_vl", PROMPT, ref.positions, ref.delta + 1, ref.positions, ref.delta)
    assert m.token is None and m.label == "delta_wrong"
    assert compare("qwen2_vl", PROMPT, ref.positions, ref.delta, ref.positions, ref.delta) is None


# ------------------------------------------------------------------------------------------ case files
def _write_case(tmp_path, monkeypatch, name="temporal_scale_truncated"):
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    key, _ = CAUGHT_BY[name]
    family, batch = PROMPTS[key]
    with pytest.raises(AssertionError) as info:
        position_ids_check.assert_matches(f"{MUTANTS}:{name}", broken.BROKEN_POSITION_IDS[name], family, batch)
    (path,) = tmp_path.glob("*.json")
    # The run groups it under its diagnosis, the replay as printed (rope.harness.causes).
    from rope.harness import causes
    failure = causes.failure_of(info.value)
    assert failure["cause"] == name and failure["replay"].endswith(f"{path.name} --impl {MUTANTS}:{name}"), failure
    assert failure["size"] > 0, failure
    return path, str(info.value)


def test_mismatch_writes_a_case_file_that_loads_and_replays(tmp_path, monkeypatch):
    path, message = _write_case(tmp_path, monkeypatch)
    assert "first at token" in message and "diagnosis: temporal_scale_truncated" in message
    # A mutant is named by import path, which a replay never imports: the command names it with --impl.
    replay_line = next(line for line in message.splitlines() if line.startswith("replay: rope-harness repro "))
    assert replay_line.endswith(f"{path.name} --impl {MUTANTS}:temporal_scale_truncated"), replay_line
    record = json.loads(path.read_text())
    assert record["kind"] == "position_ids" and record["family"] == "qwen2_5_vl"
    assert record["result"]["rows"] == [0] and record["diagnosis"]["label"] == "temporal_scale_truncated"
    case = case_file.load_case(path)
    assert case.batch == PROMPTS["transformers#48669-fps4"][1]
    # replayed against the mutant it still differs; against the reference it is fixed
    assert not position_ids_replay.replay(path, impl=f"{MUTANTS}:temporal_scale_truncated")[2].ok
    assert position_ids_replay.replay(path, impl=f"{MUTANTS}:reference_ids")[2].ok


def test_omni_case_file_round_trips(tmp_path, monkeypatch):
    # Audio clips and a video's audio track are written and read back: the replay is the same batch.
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    family, batch = PROMPTS["vllm#16878-image-beside-audio-in-video"]
    batch = PromptBatch(batch.prompts + (Prompt((Text(1), Audio(40))),), (0, 2), "right")
    fn = broken.BROKEN_POSITION_IDS["image_end_shifted_with_audio_in_video"]
    with pytest.raises(AssertionError, match="image_end_shifted"):
        position_ids_check.assert_matches(f"{MUTANTS}:image_end_shifted_with_audio_in_video", fn, family, batch)
    (path,) = tmp_path.glob("*.json")
    assert case_file.load_case(path).batch == batch
    assert not position_ids_replay.replay(path, impl=f"{MUTANTS}:image_end_shifted_with_audio_in_video")[2].ok


def test_replay_never_imports_a_recorded_module_path(tmp_path, monkeypatch):
    path, _ = _write_case(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="never imports a module path stored in a case file"):
        position_ids_replay.replay(path)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rope.harness.cli", *args], capture_output=True, text=True,
                          timeout=300, env=subprocess_env(), cwd=cwd)


def test_cli_repro_exit_codes(tmp_path, monkeypatch):
    path, _ = _write_case(tmp_path, monkeypatch)
    assert _cli("repro", str(path)).returncode == 2                         # module path: refused
    still = _cli("repro", str(path), "--impl", f"{MUTANTS}:temporal_scale_truncated")
    assert still.returncode == 1 and "temporal_scale_truncated" in still.stdout, still.stderr
    fixed = _cli("repro", str(path), "--impl", f"{MUTANTS}:reference_ids")
    assert fixed.returncode == 0 and "fixed" in fixed.stdout, fixed.stderr


def test_pytest_repro_replays_a_position_ids_case(tmp_path, monkeypatch):
    path, _ = _write_case(tmp_path, monkeypatch)
    # Run in the suite's root with the suite's replay module named, so the rootdir (and the plugin,
    # where it is not installed) come from there, not from the case file's directory.
    root = suite_dir().parent
    run = subprocess.run([sys.executable, "-m", "pytest", *plugin_args(), "-q", "-p", "no:cacheprovider",
                          str(suite_dir() / "position_ids" / "test_replay.py"), f"--rope-repro={path}",
                          "--rope-position-ids-impl", f"{MUTANTS}:temporal_scale_truncated",
                          "-k", "position_ids"], capture_output=True, text=True, timeout=300, cwd=root,
                         env={**subprocess_env(), "ROPE_CASES_DIR": "off", "ROPE_NO_REPORT": "1"})
    assert run.returncode == 1 and "1 failed" in run.stdout, run.stdout[-2000:]


@pytest.mark.parametrize("edit, match", [
    (lambda r: r.pop("family"), "missing field 'family'"),
    (lambda r: r.update(family="qwen9"), "family='qwen9'"),
    (lambda r: r.update(kind="rotation"), "kind='rotation'"),
    (lambda r: r["batch"]["prompts"][0]["segments"].append({"image": [1, 4096, 4]}), r"h and w in \[1, 1024\]"),
    (lambda r: r["batch"]["prompts"][0]["segments"].append({"text": 3, "image": [1, 2, 2]}), "exactly one of"),
    (lambda r: r["batch"]["prompts"][0]["segments"].append({"video": [2, 2, 2], "second_per_grid": "nan"}),
     "second_per_grid='nan'"),
    (lambda r: r["batch"]["prompts"][0]["segments"].append({"video": [2, 2, 2], "code": "os.system"}),
     r"unknown fields \['code'\]"),
    (lambda r: r["batch"]["prompts"][0]["segments"].append({"audio": 0}), r"audio=0: must be an int in \[1, "),
    (lambda r: r["batch"]["prompts"][0]["segments"].append({"audio": 40, "code": 1}), r"unknown fields \['code'\]"),
    (lambda r: r["batch"]["prompts"][0]["segments"].append({"video": [2, 2, 2], "audio_frames": 1 << 40}),
     r"audio_frames=1099511627776: must be an int in \[1, "),
    (lambda r: r["batch"].update(pads=[1, 2, 3]), "pads="),
    (lambda r: r.update(prompt_index=7), "prompt_index=7"),
    (lambda r: r["batch"]["prompts"][0].update(spatial_merge_size=3), "multiples of spatial_merge_size=3"),
])
def test_load_names_a_bad_field(tmp_path, monkeypatch, edit, match):
    path, _ = _write_case(tmp_path, monkeypatch)
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=match):
        case_file.load_case(path)


def test_cli_check_runs_the_position_id_suite_only_on_a_named_implementation(tmp_path):
    run = _cli("check", "--position-ids-impl", f"{MUTANTS}:negative_delta_clamped", "--workers", "0",
               "--", "-x", "-p", "no:randomly", cwd=tmp_path)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert "FAILED (pytest exit code 1)" in run.stdout


def test_video_segment_spans_follow_the_layout():
    from rope.harness.position_ids.diagnosis import segment_spans
    prompt = Prompt((Text(2), Video((2, 2, 2), timestamp_tokens=1), Text(0), Image((1, 2, 2))))
    spans = segment_spans("qwen3_vl", prompt)
    assert spans == [(0, 2), (2, 10), (10, 10), (10, 13)]
    assert spans[-1][1] == prompt_positions("qwen3_vl", prompt).length


# --------------------------------------------------------------------------- a verdict per prompt
def test_batch_verdicts_are_the_checks_prompt_by_prompt():
    from rope.harness.position_ids.batch import check_batch
    text = Prompt((Text(5),))
    video = Prompt((Text(2), Video((2, 4, 4), second_per_grid=0.5), Text(1)))
    batch = PromptBatch((text, video, text))
    assert [v.outcome for v in check_batch("reference", broken.reference_ids, "qwen2_5_vl", batch)] == ["passed"] * 3
    verdicts = check_batch("temporal_scale_truncated", broken.temporal_scale_truncated, "qwen2_5_vl", batch)
    assert [v.outcome for v in verdicts] == ["passed", "failed", "passed"]       # the video prompt only
    assert [v.case for v in verdicts] == [text, video, text] and verdicts[1].detail
    result = position_ids_check.check(broken.temporal_scale_truncated, "qwen2_5_vl", batch)
    assert [i for i, _, _ in result.mismatches] == [1]

    def raises(family, prompt):
        raise RuntimeError("no processor")

    def malformed(family, prompt):
        return "ids"
    assert [v.outcome for v in check_batch("raises", raises, "qwen2_5_vl", batch)] == ["raised"] * 3
    assert all("RuntimeError: no processor" in v.detail for v in check_batch("raises", raises, "qwen2_5_vl", batch))
    assert [v.outcome for v in check_batch("malformed", malformed, "qwen2_5_vl", batch)] == ["failed"] * 3
