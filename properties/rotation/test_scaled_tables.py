"""The rotation from the tables engines build: every rope type's table (YaRN and its attention
factor, llama3, LongRoPE, proportional, M-RoPE with YaRN, ...) at the length the engine admits, in
its own dtype beside activations of another (an fp32 table with bf16 or fp16 q and k), with
positions to the table's last row (past 2^17 where the spec reaches it)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, example, given, settings

from properties.rotation.scaled_cases import LONG_ROWS, model_scaled_cases, scaled_rotation_cases
from properties.strategies import probe_specs
from rope.harness.draws import skip_if_none_supported
from rope.harness.rotation.check import assert_matches_reference, skip_if_unsupported
from rope.registry import get_implementation

MODEL_CASES = model_scaled_cases()


@pytest.fixture
def scaled_runner(impl_name, device):
    """The implementation under test, skipped with the reasons (before Hypothesis runs) when it runs
    none of the 1-D specs nor the models' specs: otherwise every draw is rejected, nothing compared,
    and the test would pass.  Nothing in it to reset between examples."""
    impl = get_implementation(impl_name)
    specs = probe_specs("1d", True) + probe_specs("1d", False) + [c.spec for c in MODEL_CASES.values()]
    for dtype in ("bfloat16", "float32"):
        skip_if_none_supported(impl_name, impl, specs, dtype, device)
    return impl


def _with_model_examples(test):
    for case in reversed(list(MODEL_CASES.values())):
        test = example(case=case)(test)
    return test


@given(case=scaled_rotation_cases())
@_with_model_examples
@settings(suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture])
def test_scaled_tables_match_reference(impl_name, device, scaled_runner, case):
    # Rejects: a kernel that rounds an fp32 table to the activation dtype while declaring float32
    # work; one that assumes |cos|, |sin| <= 1 (YaRN's attention factor scales them past 1); a row
    # index kept in 16 bits or an offset row x width in 32 bits past 2^17 rows; a cache that must
    # have the activations' dtype but is not refused (a ValueError naming cos_sin_cache).
    impl = scaled_runner
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    rope_type = case.spec.scaling.rope_type if case.spec.scaling else "default"
    event(f"{rope_type}: {case.table_dtype} table, {case.dtype} q and k")
    if case.spec.max_position > LONG_ROWS:
        event(f"a table of more than 2^17 rows ({case.positions_kind} positions)")
    assert_matches_reference(impl_name, impl, case, device)
