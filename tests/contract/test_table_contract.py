"""The table's contract (docs/spec.md §1.2): the registry's table implementations by name, their
validation of a call, and the built-in one equal to rope.cache's table bit for bit."""

from __future__ import annotations

import pytest
import torch

from rope.cache import cos_sin_cache
from rope.registry import get_table_implementation, table_implementations
from rope.spec import RopeSpec

YARN = RopeSpec(64, 64, max_position=8192, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position": 2048})


def test_builtin_table_is_rope_cache_bit_for_bit():
    fn = table_implementations()["ours"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert torch.equal(fn(YARN, YARN.max_position, dtype, "cpu"), cos_sin_cache(YARN, dtype))
    assert torch.equal(fn(YARN, 10, torch.float32, "cpu"), cos_sin_cache(YARN)[:10])


def test_table_names_and_paths_resolve():
    assert get_table_implementation("rope.table:cos_sin_table_ours") is get_table_implementation("ours")
    with pytest.raises(ValueError, match="table_impl='nope'"):
        get_table_implementation("nope")


@pytest.mark.parametrize("args, field", [(("spec", 4, torch.float32), "spec"), ((YARN, 0, torch.float32), "max_position"),
                                         ((YARN, 4, torch.int32), "dtype"), ((YARN, True, torch.float32), "max_position")])
def test_bad_calls_name_the_field(args, field):
    with pytest.raises(ValueError, match=f"^{field}="):
        get_table_implementation("ours")(*args, "cpu")
