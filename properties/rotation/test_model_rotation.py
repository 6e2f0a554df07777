"""Every model in models.yaml, as it is served (whole model and a tensor-parallel shard),
against the reference.  Rows are named by their catalogue key."""

from __future__ import annotations

import dataclasses

import pytest

from rope.harness.rotation.check import assert_matches_reference, skip_if_unsupported
from properties.strategies import RotationCase
from rope.models import load_models
from rope.registry import get_implementation

MODELS = load_models()
# On the CPU every row takes 5 tokens instead of 11 (whole model) or 33 (a shard): the Triton
# interpreter runs one program per token and block of 4 heads, ~37 ms each (an 11-token row of a
# 48-head model is 132 programs, 5 s; 41 such rows were 140 s of CI's 2 cores).  5, 11 and 33 tokens
# all launch the decode-size tiles (below rope.triton.rotary.SMALL_BATCH_TOKENS); the layout, head
# counts and positions each row checks are the same, and 5 grid tokens still span more than one row
# of the image whenever its drawn width is under 5.  A shard's table is cut to CPU_SHARD_ROWS rows
# (positions at the last of them): a shard changes the heads per rank, not the table, and the model's
# whole table (up to 2^20 rows, 256 MiB in bf16, copied and compared after every call) is held by its
# tp1 row.
CPU_TOKENS = 5
CPU_SHARD_ROWS = 4096


def _valid_tps(model):
    for tp in (1, 2, 4, 8):
        try:
            yield tp, model.sharded(tp)
        except ValueError:   # e.g. 12 q heads at tp=8: not a configuration anyone serves
            continue


def _cases():
    for key, model in MODELS.items():
        for tp, (q, kv) in _valid_tps(model):
            # tp 1: 11 tokens of an image grid (rows differ); shards: 33 tokens in a packed qkv
            # tensor with positions at the last cache row.
            if tp == 1:
                case = RotationCase(model.spec, 11, q, kv, "bfloat16", "grid", False, 11)
            else:
                case = RotationCase(model.spec, 33, q, kv, "bfloat16", "last_row", True, 33 + tp)
            yield pytest.param(case, id=f"{key}-tp{tp}")


@pytest.mark.fixed_cases
@pytest.mark.sweep
@pytest.mark.parametrize("case", list(_cases()))
def test_model_rotation_matches_reference(impl_name, device, case):
    impl = get_implementation(impl_name)
    if device == "cpu":
        rows = case.spec.max_position
        if case.packed_qkv and not (case.spec.scaling is not None
                                    and case.spec.scaling.rope_type in ("dynamic", "longrope")):
            rows = min(rows, CPU_SHARD_ROWS)     # dynamic and LongRoPE tables depend on their length: kept whole
        case = dataclasses.replace(case, num_tokens=CPU_TOKENS,
                                   spec=dataclasses.replace(case.spec, max_position=rows))
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    assert_matches_reference(impl_name, impl, case, device)
