"""How the harness runs a position step (rope/harness/rotation/check.py and the registry): outside
implementations are called positionally, the vLLM adapter is optional, and the checks appear in the
run report and the profile by phase."""

from __future__ import annotations

from rope.harness import profiling, report
from rope.registry import get_positions_implementation
from properties.position_step.known_steps import CHUNK_2, LONG_1D, LONG_3D
from rope.harness.position_step.check import assert_positions_match


def test_outside_implementations_are_called_positionally(monkeypatch):
    # docs/implementations.md: the step's arguments come positionally in the documented order, so an
    # implementation may name its parameters as it likes (or take them positional-only).
    seen = []

    def own_names(table, delta, mapping, starts, lens, computed, dims, dst, /):
        seen.append(dims)
        get_positions_implementation("native")(table, delta, mapping, starts, lens, computed, dims, dst)
    monkeypatch.setenv(report.DISABLE_ENV, "1")      # a stand-in of this test: not a finding of the run
    assert_positions_match("own-names", own_names, CHUNK_2, "cpu")
    assert seen == [3]


def test_vllm_positions_adapter_is_optional():
    # "vllm" (Model Runner V2's kernel, rope/backends/vllm/position_step.py) is resolvable by name, never
    # one of the built-ins that run by default; without vLLM the name is a ValueError with the install hint.
    from rope.registry import positions_implementations
    assert "vllm" not in positions_implementations()
    try:
        fn = get_positions_implementation("vllm")
    except ValueError as exc:
        assert "vllm" in str(exc) and "install it with" in str(exc), exc
    else:
        assert callable(fn) and callable(fn.supports)


def test_position_checks_are_in_the_run_report(monkeypatch, tmp_path):
    # A campaign counts the comparisons in the report: a position check that is not recorded
    # is a check the campaign never reports (a positions campaign counted 0 examples; another
    # counted the plain checks and not the guarded ones, half of its test time).
    from properties.mutants.broken_positions import BROKEN_POSITIONS
    monkeypatch.setenv(report.RUN_ENV, str(tmp_path))
    monkeypatch.delenv(report.DISABLE_ENV, raising=False)
    fn = get_positions_implementation("native")
    broken = next(iter(BROKEN_POSITIONS.values()))
    assert_positions_match("native", fn, LONG_3D, "cpu")
    from rope.harness.position_step.guards import assert_positions_match_guarded
    assert_positions_match_guarded("native-guarded", fn, LONG_1D, "cpu")
    failed = None
    for batch in (LONG_1D, LONG_3D):
        try:
            assert_positions_match("broken", broken, batch, "cpu")
        except AssertionError as exc:
            failed = exc
    assert failed is not None
    records = [r for r in report.load_records(tmp_path) if r["kind"] == "comparison"]
    assert records[0]["impl"] == "native" and records[0]["ok"] and records[0]["variant"] == "positions-3rows"
    assert records[0]["tokens"] == LONG_3D.num_tokens and records[0]["dtype"] == "int64"
    assert any(r["impl"] == "native-guarded" and r["ok"] and r["variant"] == "positions-1rows" for r in records)
    assert any(r["impl"] == "broken" and not r["ok"] and r["problems"] for r in records)
    assert report.summarize(records)["examples"] == len(records) >= 2


def test_position_checks_are_profiled_by_phase():
    # A positions campaign's profile had every second "outside the phases": the step's call, the
    # reference and the comparison are timed as a rotation check's are.
    before = profiling.snapshot()["counts"]
    assert_positions_match("native", get_positions_implementation("native"), LONG_3D, "cpu")
    after = profiling.snapshot()["counts"]
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in ("call", "jit", "reference", "compare", "record")}
    assert grew["call"] + grew["jit"] == 1 and grew["reference"] == 1 and grew["compare"] == 1, grew
    no_calls = profiling.combine([{"seconds": {"tests": 2.0, "session": 3.0, "record": 1.0},
                                   "counts": {"record": 3}, "compiles": 0, "tests": {}}])
    rows = profiling.markdown_rows(no_calls)
    assert "| record write | 1.0 | 50.0% | - |" in rows
    assert "| between tests (collection, fixtures, scheduling) | 1.0 | - | - |" in rows


# --------------------------------------------------------------------------- the batched check
def _batch_steps():
    from properties.position_step.known_steps import CHUNK_1, DECODE
    return [CHUNK_1, CHUNK_2, DECODE, LONG_1D, LONG_3D]


def test_batch_verdicts_agree_with_the_one_step_check():
    from properties.mutants.broken_positions import BROKEN_POSITIONS
    from rope.harness.position_step.batch import check_batch
    from rope.harness.position_step.check import run_positions, check_positions
    import pytest
    native, caught = get_positions_implementation("native"), 0
    for name, fn in [("native", native), *BROKEN_POSITIONS.items()]:
        steps = _batch_steps()
        verdicts = check_batch(name, fn, steps, "cpu")
        assert [v.case for v in verdicts] == steps
        for verdict, step in zip(verdicts, steps):
            out = run_positions(fn, step, "cpu")
            alone = check_positions(name, "cpu", step.tensors("cpu"), out[:, :step.num_tokens])
            assert verdict.passed == (not alone), (name, step.brief(), verdict)
            assert verdict.elements == step.num_dims * step.num_tokens
        caught = caught + 1 if not all(v.passed for v in verdicts) else caught
    assert caught >= len(BROKEN_POSITIONS) // 2               # the verdicts are not all "passed"
    with pytest.raises(ValueError, match="outcome="):
        type(verdicts[0])(steps[0], "maybe")


def test_batch_raise_write_past_and_nondeterminism_are_each_their_own(monkeypatch):
    import pytest
    from rope.harness import causes
    from rope.harness.position_step.batch import assert_batch_matches_reference, check_batch
    monkeypatch.setenv(report.DISABLE_ENV, "1")
    native = get_positions_implementation("native")
    steps = _batch_steps()

    def writes_past(*args):
        native(*args)
        args[-1][:, int(args[3][-1]):] = 0          # the columns past query_start_loc[-1]

    calls = []

    def wrong_in_a_batch(*args):      # right when called alone, wrong after another call
        native(*args)
        calls.append(1)
        if len(calls) == 2:
            args[-1].add_(1)

    verdicts = check_batch("writes-past", writes_past, steps, "cpu")
    assert [v.outcome for v in verdicts] == ["passed" if s.padding == 0 else "failed" for s in steps]
    assert all("past the step" in v.detail for v in verdicts if not v.passed)
    verdicts = check_batch("wrong-in-a-batch", wrong_in_a_batch, steps, "cpu")
    assert [v.outcome for v in verdicts] == ["passed", "failed", "passed", "passed", "passed"]
    calls.clear()
    with pytest.raises(AssertionError) as info:
        calls.append(1)                             # the batch's first call is the wrong one; alone, it is right
        assert_batch_matches_reference("wrong-in-a-batch", wrong_in_a_batch, steps, "cpu")
    assert causes.failure_of(info.value)["cause"] == "nondeterministic"

    def raises_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("launch failed")
        native(*args)
    calls.clear()
    verdicts = check_batch("raises", raises_second, steps, "cpu")
    assert [v.outcome for v in verdicts] == ["passed", "raised", "passed", "passed", "passed"]
    assert "RuntimeError: launch failed" in verdicts[1].detail
    assert check_batch("native", native, [], "cpu") == []
