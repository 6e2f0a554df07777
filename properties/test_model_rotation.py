"""Every model in models.yaml, as it is served (whole model and a tensor-parallel shard),
against the reference.  Rows are named by their catalogue key."""

from __future__ import annotations

import pytest

from properties.checks import assert_matches_reference, skip_if_unsupported
from properties.strategies import RotationCase
from rope.models import load_models
from rope.registry import get_implementation

MODELS = load_models()


def _largest_tp(model) -> int:
    for tp in (8, 4, 2):
        try:
            model.sharded(tp)
            return tp
        except ValueError:
            continue
    return 1


def _cases():
    for key, model in MODELS.items():
        q, kv = model.sharded(1)
        # Whole model: 11 tokens of an image grid (rows differ), bf16, key present.
        yield pytest.param(RotationCase(model.spec, 11, q, kv, "bfloat16", "grid", False, 11), id=f"{key}-tp1")
        tp = _largest_tp(model)
        q, kv = model.sharded(tp)
        # A TP shard inside a packed qkv tensor, positions at the last cache row.
        yield pytest.param(RotationCase(model.spec, 33, q, kv, "bfloat16", "last_row", True, 33), id=f"{key}-tp{tp}")


@pytest.mark.parametrize("case", list(_cases()))
def test_model_rotation_matches_reference(impl_name, device, case):
    impl = get_implementation(impl_name)
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    assert_matches_reference(impl_name, impl, case, device)
