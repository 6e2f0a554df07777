"""Table implementations against ``reference.cos_sin_table`` (docs/spec.md §1.2).

Every test takes ``table_impl_name`` and ``device``: the implementations named by
``--rope-table-impl`` (ours, transformers, or ``package.module:callable``), by default ours.  Each
table is ``fn(spec, max_position, dtype, device)``; a sample of its rows (the first, the last, powers
of two, drawn ones) is held to the float64 reference within the bound of rope.harness.table.bound.

1. ``test_catalogued_model_tables_match``: every catalogued model with a scaled table (rope/models.yaml)
   at its full length, and the known table bugs' triggers;
2. ``test_table_matches_reference``: per rope type, drawn specs at their admitted lengths (up to 2^20 rows),
   every dtype;
3. ``test_tables_checked_in_batches_match_reference``: several drawn tables built back to back and
   waited for once (the batched check, rope.harness.table.batch).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from properties.table.strategies import table_cases
from rope.harness.draws import skip_or_reject
from rope.harness.table.cases import TableCase
from rope.harness.table.batch import assert_batch_matches_reference
from rope.harness.table.check import assert_table_matches
from rope.implementation import Implementation
from rope.models import load_models
from rope.registry import get_table_implementation
from rope.spec import RopeSpec
from rope.spec_scaling import ROPE_TYPES


def _implementation(name: str, case: TableCase, device: str):
    fn = get_table_implementation(name)
    declared = Implementation.of(name, fn, "table").unsupported_reason
    why = declared(case.spec, case.dtype, device) if declared is not None else None
    if why is not None:
        skip_or_reject(f"unsupported: {name} does not build {case.brief()}: {why}")
    return fn


# Each catalogued scaled model at its full length, and the known table bugs' triggers.
KNOWN_TABLES = [pytest.param(TableCase(m.spec, m.spec.max_position, torch.float32), id=key)
                for key, m in sorted(load_models().items()) if m.spec.scaling is not None] + [
    # vllm#55910: NTK's cache built for the unscaled length while max_position_embeddings x s is admitted.
    pytest.param(TableCase(RopeSpec(128, 128, max_position=16384, scaling={"rope_type": "ntk", "factor": 4.0}),
                           16384, torch.float32), id="vllm-55910-ntk-admitted-length"),
    # YaRN's mscale pair unequal (a ratio inverted or squared shows) in bfloat16.
    pytest.param(TableCase(RopeSpec(64, 64, False, max_position=163840, scaling={
        "rope_type": "yarn", "factor": 40.0, "original_max_position": 4096, "mscale": 1.0, "mscale_all_dim": 0.707}),
        163840, torch.bfloat16), id="yarn-unequal-mscales-bf16"),
]


@pytest.mark.fixed_cases
@pytest.mark.known_bug
@pytest.mark.parametrize("case", KNOWN_TABLES)
def test_catalogued_model_tables_match(table_impl_name, device, case):
    fn = _implementation(table_impl_name, case, device)
    assert_table_matches(table_impl_name, fn, case, device)


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
@settings(deadline=None)
@given(data=st.data())
def test_table_matches_reference(table_impl_name, device, rope_type, data):
    case = data.draw(table_cases(rope_types=(rope_type,)), label="case")
    fn = _implementation(table_impl_name, case, device)
    assert_table_matches(table_impl_name, fn, case, device)


@settings(deadline=None)
@given(data=st.data())
def test_tables_checked_in_batches_match_reference(table_impl_name, device, data):
    # Tables of any rope types built one after the other with no wait: a build must not depend on
    # what the one before it left behind (a cached frequency vector, a reused buffer).
    cases = data.draw(st.lists(table_cases(), min_size=1, max_size=3), label="cases")
    for case in cases:
        _implementation(table_impl_name, case, device)
    assert_batch_matches_reference(table_impl_name, get_table_implementation(table_impl_name), cases, device)
