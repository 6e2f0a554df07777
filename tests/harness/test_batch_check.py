"""The rotation's batched check (rope.harness.rotation.batch): a verdict per case that agrees with
the one-case check (passed or not, and the same worst error/bound), whatever else is in the batch;
a raise, a wrong shape and an unsupported spec each a verdict of its own; a batch that mixes specs
refused naming ``cases``."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from properties.mutants import broken_rotations
from properties.strategies import batches_of, rotation_cases
from rope.harness.rotation.batch import assert_batch_matches_reference, check_batch
from rope.harness.rotation.check import evaluate_case
from rope.harness.rotation.cases import RotationCase
from rope.registry import get_implementation
from rope.spec import RopeSpec

NATIVE = get_implementation("native")
SPEC = RopeSpec(64, 48, False, (8, 8, 8))


def _batch(n: int, **fields) -> list[RotationCase]:
    return [RotationCase(SPEC, 3 + i, 2 + i % 3, i % 2, "float32", "uniform", i % 3 == 0, seed=i, **fields)
            for i in range(n)]


@pytest.mark.parametrize("name", ["native", "mutant"])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_verdicts_agree_with_the_one_case_check(name, data):
    fn = NATIVE if name == "native" else broken_rotations.neox_for_gptj
    shape = data.draw(rotation_cases(dtype=data.draw(st.sampled_from(["float32", "bfloat16"])), nonfinite=True))
    cases = data.draw(st.lists(batches_of(shape), min_size=1, max_size=5))
    for verdict, case in zip(check_batch(name, fn, cases, "cpu"), cases, strict=True):
        alone = evaluate_case(name, fn, case, "cpu").comparison
        assert verdict.case == case
        assert verdict.passed == alone.ok, (verdict, alone.message())
        if alone.num_elements:
            assert math.isclose(verdict.worst_ratio, alone.worst_ratio, rel_tol=1e-9, abs_tol=1e-12) or \
                verdict.worst_ratio == alone.worst_ratio, (verdict.worst_ratio, alone.worst_ratio)


def test_one_broken_case_fails_alone_in_its_batch():
    def wrong_on_third_seed(spec, positions, query, key, cache):
        q, k = NATIVE(spec, positions, query, key, cache)
        if q.shape[0] == 5:                       # the case with 5 tokens: one element off
            q = q.clone()
            q[0, 0] += 1.0
        return q, k
    verdicts = check_batch("wrong", wrong_on_third_seed, _batch(4), "cpu")
    assert [v.outcome for v in verdicts] == ["passed", "passed", "failed", "passed"]
    assert "1 of" in verdicts[2].detail and verdicts[2].worst_ratio > 1


@pytest.mark.parametrize("rows_per_slice", [1, 3, 7])
def test_a_batch_compared_in_slices_gives_the_same_verdicts(monkeypatch, rows_per_slice):
    # The batch's rows are compared a slice at a time (its float64 temporaries bounded whatever the
    # batch's size); a case whose rows fall in two or more slices keeps its worst ratio and its count.
    from rope.harness.rotation import batch
    def off_in_two_places(spec, positions, query, key, cache):
        q, k = NATIVE(spec, positions, query, key, cache)
        if q.shape[0] in (4, 6):                  # two cases: one element off in their first and last rows
            q = q.clone()
            q[0, 0] += 1.0
            q[-1, -1] -= 2.0
        return q, k
    whole = check_batch("off", off_in_two_places, _batch(5), "cpu")
    monkeypatch.setattr(batch, "DEVICE_SLICE_ELEMENTS", SPEC.head_size * rows_per_slice)
    sliced = check_batch("off", off_in_two_places, _batch(5), "cpu")
    assert [v.outcome for v in whole] == ["passed", "failed", "passed", "failed", "passed"]
    assert [(v.outcome, v.worst_ratio, v.detail) for v in sliced] == [(v.outcome, v.worst_ratio, v.detail)
                                                                         for v in whole]
    assert "2 of" in whole[1].detail


def test_a_raise_and_a_wrong_shape_are_verdicts_of_their_own():
    def misbehaves(spec, positions, query, key, cache):
        if query.shape[0] == 4:
            raise RuntimeError("boom")
        q, k = NATIVE(spec, positions, query, key, cache)
        return (q[:1], k) if query.shape[0] == 5 else (q, k)
    verdicts = check_batch("misbehaves", misbehaves, _batch(3), "cpu")
    assert [v.outcome for v in verdicts] == ["passed", "raised", "failed"]
    assert "RuntimeError: boom" in verdicts[1].detail and "query.shape=(1," in verdicts[2].detail


def test_an_unsupported_batch_is_unsupported_with_the_reason():
    def fp32_only(spec, positions, query, key, cache):
        return NATIVE(spec, positions, query, key, cache)
    fp32_only.unsupported_reason = lambda spec, dtype, device: "float32 only" if dtype != torch.float32 else None
    cases = [dataclasses.replace(c, dtype="bfloat16") for c in _batch(2)]
    verdicts = check_batch("fp32_only", fp32_only, cases, "cpu")
    assert [v.outcome for v in verdicts] == ["unsupported"] * 2
    assert all(v.detail.startswith("unsupported: fp32_only") and v.detail.endswith("float32 only") for v in verdicts)


def test_a_batch_shares_one_spec_dtype_and_table():
    mixed = _batch(2) + [dataclasses.replace(_batch(1)[0], dtype="bfloat16")]
    with pytest.raises(ValueError, match="cases: a batch shares one dtype"):
        check_batch("native", NATIVE, mixed, "cpu")
    with pytest.raises(ValueError, match="cases: view='row-gaps'"):
        check_batch("native", NATIVE, [RotationCase(SPEC, 3, 2, 1, "float32", view="row-gaps")], "cpu")
    assert check_batch("native", NATIVE, [], "cpu") == []


def test_the_pytest_adapter_reports_the_failing_case_in_full():
    with pytest.raises(AssertionError, match="does not match the reference"):
        assert_batch_matches_reference("neox_for_gptj", broken_rotations.neox_for_gptj, _batch(3), "cpu")
    assert all(v.passed for v in assert_batch_matches_reference("native", NATIVE, _batch(3), "cpu"))


def test_a_case_that_fails_in_its_batch_and_passes_alone_is_nondeterministic():
    from rope.harness import causes
    calls = []

    def wrong_the_first_time(spec, positions, query, key, cache):
        calls.append(1)
        q, k = NATIVE(spec, positions, query, key, cache)
        if len(calls) == 1:
            q = q.clone()
            q[0, 0] += 1.0
        return q, k
    with pytest.raises(AssertionError, match="answers the same inputs differently") as failure:
        assert_batch_matches_reference("flaky", wrong_the_first_time, _batch(2), "cpu")
    assert causes.failure_of(failure.value)["cause"] == "nondeterministic"


def test_more_batches_only_in_a_campaign_on_a_gpu():
    from rope.harness.campaign_settings import CAMPAIGN_BATCHES, CAMPAIGN_ENV, campaign_batches
    assert campaign_batches({}, "cuda:0") == (0, 0)                        # the suite's draws stay as they are
    assert campaign_batches({CAMPAIGN_ENV: "1"}, "cpu") == (0, 0)          # the interpreter: one program at a time
    assert campaign_batches({CAMPAIGN_ENV: "1"}, "cuda:1") == CAMPAIGN_BATCHES
    assert CAMPAIGN_BATCHES[0] >= 1


def test_a_campaigns_batches_can_be_set_for_one_campaign():
    from rope.harness.campaign_settings import BATCHES_ENV, CAMPAIGN_ENV, campaign_batches
    assert campaign_batches({CAMPAIGN_ENV: "1", BATCHES_ENV: "3,9"}, "cuda") == (3, 9)
    assert campaign_batches({BATCHES_ENV: "3,9"}, "cuda") == (0, 0)        # outside a campaign: none
    for bad in ("9,3", "x", "1,2,3", "-1,4"):
        with pytest.raises(ValueError, match=BATCHES_ENV):
            campaign_batches({CAMPAIGN_ENV: "1", BATCHES_ENV: bad}, "cuda")


def test_the_one_shape_property_lists_at_most_listed_most_batches():
    # Its batches are Hypothesis lists (five draws a batch): a campaign's larger counts are the
    # rotation property's seeded batches, never a list of hundreds of drawn batches.
    from properties.rotation.checks import LISTED_MOST, listed_batches
    from rope.harness.campaign_settings import BATCHES_ENV, CAMPAIGN_ENV
    assert listed_batches({}, "cpu") == listed_batches({CAMPAIGN_ENV: "1"}, "cpu") == 2
    assert listed_batches({}, "cuda:0") == 12
    assert listed_batches({CAMPAIGN_ENV: "1", BATCHES_ENV: "3,40"}, "cuda") == 40
    assert listed_batches({CAMPAIGN_ENV: "1", BATCHES_ENV: "127,511"}, "cuda") == LISTED_MOST == 127


def test_a_long_batch_is_checked_at_most_checked_together_at_a_time(monkeypatch):
    # One check's calls share one call deadline and its inputs are alive together: a campaign's count
    # (up to 511 further batches) does not shrink the time a call may take, nor grow what a check holds.
    from rope.harness.rotation import batch
    groups = []
    together = batch._check_together
    monkeypatch.setattr(batch, "_check_together",
                        lambda fn, cases, device: groups.append(len(cases)) or together(fn, cases, device))
    cases = [RotationCase(RopeSpec(16, 16, True), 1, 1, 1, "float32", seed=i) for i in range(300)]
    verdicts = batch.check_batch("native", NATIVE, cases, "cpu")
    assert batch.CHECKED_TOGETHER == 127 and groups == [127, 127, 46], groups
    assert [v.case for v in verdicts] == cases and all(v.passed for v in verdicts)


def test_a_campaigns_more_batches_catch_what_the_drawn_case_passed(monkeypatch):
    # The drawn case has no token (any rotation passes it); the further batches through its shape do,
    # and a wrong pairing in them fails the property with the one-case check's diagnosis.
    from properties.rotation import checks
    monkeypatch.setattr(checks, "campaign_batches", lambda env, device: (2, 4))
    empty = RotationCase(RopeSpec(64, 48, False, (8, 8, 8)), 0, 2, 1, "float32")

    @settings(max_examples=10, deadline=None, database=None)
    @given(data=st.data())
    def prop(data):
        fn = broken_rotations.neox_for_gptj
        assert evaluate_case("neox_for_gptj", fn, empty, "cpu").comparison.ok
        checks.more_batches_match_reference("neox_for_gptj", fn, empty, "cpu", data)

    with pytest.raises(AssertionError, match="pairing"):
        prop()
    monkeypatch.setattr(checks, "campaign_batches", lambda env, device: (0, 0))
    prop()                                                                  # nothing drawn, nothing failed


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_inputs_built_together_are_each_cases_own(device, data):
    # On a GPU the batch's inputs go to the device in one transfer per dtype (pinned), then a copy per
    # tensor: the same bits, shapes and strides as one case at a time, each tensor its own allocation.
    from rope.harness.rotation.cases import build_rotation_inputs, build_rotation_inputs_many
    shape = data.draw(rotation_cases(dtype=data.draw(st.sampled_from(["float32", "bfloat16"])), nonfinite=True))
    cases = data.draw(st.lists(batches_of(shape), min_size=1, max_size=5))
    together = build_rotation_inputs_many(cases, device)
    pointers = set()
    for case, got in zip(cases, together, strict=True):
        alone = build_rotation_inputs(case, device)
        for name in ("positions", "query", "key", "cache"):
            a, b = getattr(alone, name), getattr(got, name)
            if a is None:
                assert b is None, name
                continue
            assert (b.device, b.dtype, b.shape, b.stride()) == (a.device, a.dtype, a.shape, a.stride()), name
            assert torch.equal(a.cpu(), b.cpu()) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                                     and torch.equal(a.nan_to_num(), b.nan_to_num())), name
            if b.numel():
                pointers.add(b.untyped_storage().data_ptr())
        assert got.pristine_cache is not None and got.cache.data_ptr() != got.pristine_cache.data_ptr()
    expected = sum((c.num_tokens > 0) * (2 if c.num_kv_heads and not c.packed_qkv else 1) + 1 for c in cases)
    assert len(pointers) >= expected            # q/k (or the packed storage), positions and table: never shared


def test_a_batch_shares_one_table_copy_and_the_reference_reads_the_pristine_table(device):
    # One private copy of the table for the batch's calls (a clone per case held them all at once),
    # never the memoized table itself.
    from rope.harness.rotation.cases import build_rotation_inputs_many
    cases = _batch(4)
    made = build_rotation_inputs_many(cases, device, one_table_copy=True)
    assert len({x.cache.data_ptr() for x in made}) == 1
    assert made[0].cache.data_ptr() != made[0].pristine_cache.data_ptr()
    assert torch.equal(made[0].cache, made[0].pristine_cache)
    alone = build_rotation_inputs_many(cases, device)
    assert len({x.cache.data_ptr() for x in alone}) == len(cases)


@pytest.mark.parametrize("rows", ["read", "unread"])
def test_a_call_that_writes_the_lent_table_fails_the_batch_and_is_found_alone(rows):
    # The third case's call writes the table (a row the batch reads, or one no position reaches):
    # the copy differs from the table after the calls, so no case is settled, and the one-case
    # checks of the cases in order find the call that wrote, with its read-only diagnosis.
    def writes_at_five_tokens(spec, positions, query, key, cache):
        if query.shape[0] == 5:                   # the third case of _batch
            cache[0 if rows == "read" else -1].add_(1.0)
        return NATIVE(spec, positions, query, key, cache)
    cases = _batch(4)
    verdicts = check_batch("writer", writes_at_five_tokens, cases, "cpu")
    assert [v.outcome for v in verdicts] == ["failed"] * 4
    assert all("table lent to the batch's calls was written" in v.detail for v in verdicts)
    with pytest.raises(AssertionError, match="cos_sin_cache") as failure:
        assert_batch_matches_reference("writer", writes_at_five_tokens, cases, "cpu")
    assert "5 tokens" in str(failure.value) and "answers the same inputs differently" not in str(failure.value)


def test_an_error_the_device_reports_after_the_calls_is_every_cases_raise(monkeypatch):
    # The batch waits for the device once, after its last call: an error reported there (an illegal
    # address, a failed launch) cannot be told to one case, and no case passes; in every slice.
    from properties.position_step.known_steps import CHUNK_1, DECODE
    from rope.harness import verdict
    from rope.harness.position_step import batch as step_batch
    from rope.harness.table import batch as table_batch
    from rope.harness.table.cases import TableCase
    from rope.registry import get_positions_implementation, get_table_implementation

    def late(device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(verdict, "synchronize", late)
    verdicts = check_batch("native", NATIVE, _batch(3), "cpu")
    assert [v.outcome for v in verdicts] == ["raised"] * 3
    assert all("reported by the device after the batch's calls" in v.detail for v in verdicts)
    steps = step_batch.check_batch("native", get_positions_implementation("native"), [CHUNK_1, DECODE], "cpu")
    tables = table_batch.check_batch("ours", get_table_implementation("ours"), [TableCase(SPEC, 64)], "cpu")
    for v in steps + tables:
        assert v.outcome == "raised" and "illegal memory access" in v.detail and "reported by the device" in v.detail


def test_seeded_batches_cover_what_batches_of_draws():
    # A campaign's further batches come from one drawn seed (two draws a list): the same fields and
    # ranges as batches_of, every position pattern, packing and planted values met, the edge token
    # counts too, and the same list for the same seed.
    from properties.strategies import seeded_batch, seeded_batches_of
    shape = RotationCase(SPEC, 5, 3, 1, "bfloat16")
    made = [seeded_batch(shape, seed, i) for seed in range(40) for i in range(16)]
    assert {c.positions_kind for c in made} == {"uniform", "text", "grid", "last_row"}
    assert {c.packed_qkv for c in made} == {c.nonfinite for c in made} == {False, True}
    tokens = {c.num_tokens for c in made}
    assert {0, 1, 48} <= tokens and tokens <= set(range(49)) and len(tokens) > 40
    assert all((c.spec, c.num_q_heads, c.num_kv_heads, c.dtype, c.generator) ==
               (SPEC, 3, 1, "bfloat16", "counter") for c in made)
    assert len({c.seed for c in made}) == len(made)
    assert seeded_batch(shape, 7, 3) == seeded_batch(shape, 7, 3)
    big = RotationCase(RopeSpec(128, 128, True, None), 5, 128, 8, "bfloat16")    # 128 heads of 128: at most 4 tokens
    assert max(seeded_batch(big, seed, 0).num_tokens for seed in range(200)) == 4

    @settings(max_examples=30, deadline=None, database=None)
    @given(st.data())
    def sizes(data):
        batch = data.draw(seeded_batches_of(shape, 3, 9))
        assert 3 <= len(batch) <= 9
    sizes()


def test_a_call_that_hangs_in_a_batch_ends_it_at_the_deadline(monkeypatch):
    # The batch's calls share one call deadline (one per call would cost two signal handler swaps and the
    # watchdog's lock, a sixth of a small case's check): a hang in any of them still ends the batch.
    import time as clock
    from rope.harness.deadline import CALL_TIMEOUT_ENV, ImplementationHung
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "0.5")
    calls = []

    def hangs_on_its_third_call(spec, positions, query, key, cache):
        calls.append(1)
        if len(calls) == 3:
            clock.sleep(30)
        return NATIVE(spec, positions, query, key, cache)
    with pytest.raises(ImplementationHung, match="the batch's calls did not return within 0.5 s"):
        check_batch("hangs", hangs_on_its_third_call, _batch(4), "cpu")
    assert len(calls) == 3
