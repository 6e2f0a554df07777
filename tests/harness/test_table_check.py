"""The table's slice (rope.harness.table): the check passes the built-in and transformers' tables
of every rope type, and each diagnosis rule names a broken table it must name."""

from __future__ import annotations

import pytest
import torch

from rope.cache import attention_factor, inv_freq
from rope.harness import causes
from rope.harness.table.cases import TableCase
from rope.harness.table.check import assert_table_matches, check
from rope.registry import get_table_implementation
from rope.spec import RopeSpec

OURS = get_table_implementation("ours")
YARN = RopeSpec(64, 64, max_position=65536, scaling={"rope_type": "yarn", "factor": 16.0, "original_max_position": 4096})
LLAMA3 = RopeSpec(128, 128, max_position=32768, scaling={
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position": 8192})


def _built(spec, n, dtype, f, m):
    angles = torch.outer(torch.arange(n, dtype=torch.float32), f)
    return (torch.cat((angles.cos(), angles.sin()), dim=-1) * m).to(dtype)


def mscale_missing(spec, n, dtype, device):
    return _built(spec, n, dtype, inv_freq(spec), 1.0)


def mscale_twice(spec, n, dtype, device):
    return _built(spec, n, dtype, inv_freq(spec), attention_factor(spec) ** 2)


def bf16_frequencies(spec, n, dtype, device):
    return _built(spec, n, dtype, inv_freq(spec).to(torch.bfloat16).float(), attention_factor(spec))


def too_short(spec, n, dtype, device):
    return OURS(spec, max(n // 2, 1), dtype, device)


def rounded(spec, n, dtype, device):
    return OURS(spec, n, torch.bfloat16, device).to(dtype)


def sin_cos(spec, n, dtype, device):
    table = OURS(spec, n, dtype, device)
    return torch.cat(table.chunk(2, dim=-1)[::-1], dim=-1)


@pytest.mark.parametrize("name", ["ours", "transformers"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_good_tables_pass(name, dtype):
    if name == "transformers":
        pytest.importorskip("transformers")
    for spec in (YARN, LLAMA3, RopeSpec(64, 32, max_position=4096)):
        assert check(get_table_implementation(name), TableCase(spec, spec.max_position, dtype, 1)).ok


@pytest.mark.parametrize("fn, spec, label", [
    (mscale_missing, YARN, "mscale_missing"), (mscale_twice, YARN, "mscale_twice"),
    (bf16_frequencies, LLAMA3, "frequencies_wrong"), (too_short, LLAMA3, "table_too_short"),
    (rounded, LLAMA3, "rounded_to_activation_dtype"), (sin_cos, YARN, "layout_wrong")])
def test_each_rule_names_its_broken_table(fn, spec, label):
    with pytest.raises(AssertionError) as info:
        assert_table_matches(fn.__name__, fn, TableCase(spec, spec.max_position, torch.float32, 2))
    assert causes.failure_of(info.value)["cause"] == label, str(info.value)
    assert f"diagnosis: {label}" in str(info.value)


def test_frequencies_wrong_names_the_worst_frequency():
    def one_wrong(spec, n, dtype, device):
        f = inv_freq(spec).clone()
        f[5] *= 1.01
        return _built(spec, n, dtype, f, attention_factor(spec))
    result = check(one_wrong, TableCase(LLAMA3, 4096, torch.float32))
    assert result.mismatch.label == "frequencies_wrong" and result.mismatch.worst_column == 5
    assert "1 of 64 frequencies" in result.mismatch.sentence


def test_a_bad_case_names_the_field():
    with pytest.raises(ValueError, match="^max_position="):
        TableCase(YARN, 0)
    with pytest.raises(ValueError, match="^dtype="):
        TableCase(YARN, 4, torch.int32)
    case = TableCase(YARN, 300, torch.bfloat16, 9)
    assert TableCase.from_dict(case.to_dict()) == case and torch.equal(case.rows(), TableCase.from_dict(
        case.to_dict()).rows())


@pytest.mark.parametrize("scaling", [YARN.scaling, LLAMA3.scaling, {"rope_type": "dynamic", "factor": 2.0,
                                                                    "original_max_position": 1024}])
def test_rotation_cases_hand_on_the_scaled_table(scaling):
    """The rotation's shared table is the spec's own, scaling included (keyed on it), not the plain
    table of the same base, width and length."""
    from rope.cache import cos_sin_cache
    from rope.harness.rotation.cases import shared_table
    scaled, plain = RopeSpec(64, 64, max_position=4096, scaling=scaling), RopeSpec(64, 64, max_position=4096)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(shared_table(plain, dtype), cos_sin_cache(plain, dtype))
        assert torch.equal(shared_table(scaled, dtype), cos_sin_cache(scaled, dtype))
        assert not torch.equal(shared_table(scaled, dtype), shared_table(plain, dtype))


# --------------------------------------------------------------------------- the batched check
def test_batch_verdicts_agree_with_the_one_case_check(monkeypatch):
    from rope.harness import report
    from rope.harness.table.batch import check_batch
    monkeypatch.setenv(report.DISABLE_ENV, "1")
    cases = [TableCase(YARN, 65536, torch.float32, 3), TableCase(LLAMA3, 32768, torch.bfloat16, 4),
             TableCase(RopeSpec(64, 32, max_position=4096), 4096, torch.float16, 5)]
    for name, fn in (("ours", OURS), ("mscale_missing", mscale_missing), ("mscale_twice", mscale_twice),
                     ("bf16_frequencies", bf16_frequencies), ("too_short", too_short)):
        verdicts = check_batch(name, fn, cases, "cpu")
        assert [v.case for v in verdicts] == cases
        for verdict, case in zip(verdicts, cases):
            alone = check(fn, case, "cpu")
            assert verdict.passed == alone.ok, (name, case.brief(), verdict)
            assert verdict.worst_ratio == alone.worst_ratio or not alone.ok and not verdict.elements
        if name != "ours":
            assert not all(v.passed for v in verdicts), name
    assert check_batch("ours", OURS, [], "cpu") == []


def test_batch_raise_wrong_value_and_nondeterminism_are_each_their_own(monkeypatch):
    from rope.harness import report
    from rope.harness.table.batch import assert_batch_matches_reference, check_batch
    monkeypatch.setenv(report.DISABLE_ENV, "1")
    cases = [TableCase(YARN, 65536, torch.float32, 3), TableCase(LLAMA3, 32768, torch.float32, 4)]
    calls = []

    def second_raises(spec, n, dtype, device):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return OURS(spec, n, dtype, device)

    def second_wrong_dtype(spec, n, dtype, device):
        calls.append(1)
        return OURS(spec, n, torch.float16 if len(calls) == 2 else dtype, device)

    def wrong_after_another(spec, n, dtype, device):        # right alone, wrong as the second build
        calls.append(1)
        return OURS(spec, n, dtype, device) * (1.01 if len(calls) == 2 else 1.0)

    for fn, outcome, says in ((second_raises, "raised", "RuntimeError: out of memory"),
                              (second_wrong_dtype, "failed", "wrong return value: result: dtype must be"),
                              (wrong_after_another, "failed", "")):
        calls.clear()
        verdicts = check_batch(fn.__name__, fn, cases, "cpu")
        assert [v.outcome for v in verdicts] == ["passed", outcome] and says in verdicts[1].detail
    calls.clear()
    with pytest.raises(AssertionError) as info:
        calls.append(1)                         # the batch's first build is the wrong one; alone, it is right
        assert_batch_matches_reference("wrong_after_another", wrong_after_another, cases, "cpu")
    assert causes.failure_of(info.value)["cause"] == "nondeterministic"
