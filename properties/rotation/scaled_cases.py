"""The rotation meeting the table: cases of properties/rotation/test_scaled_tables.py.  The spec
is one the table's properties draw (every rope type, sized as an engine sizes it: the positions it
admits, up to 2^20 rows; properties.table.strategies), the cache handed in is that spec's table in
its own dtype, and the activations' dtype is drawn apart from it: an fp32 table beside bf16 or
fp16 q and k (FlashInfer and SGLang take it so), or the table in the activations' dtype.  The
positions reach the table's last row.  A case module: the project's tests build the same cases.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from properties.table.strategies import table_cases
from rope.harness.rotation.cases import DTYPES, RotationCase
from rope.models import load_models
from rope.spec_scaling import ROPE_TYPES

__all__ = ["LONG_ROWS", "MODEL_TABLE_ELEMENTS", "model_scaled_cases", "scaled_rotation_cases"]

LONG_ROWS = 1 << 17          # positions past this are where float32 angles and 16-bit indices fail
# A catalogued model's table is held at full length up to this many elements (64 MiB in float32);
# a longer one is cut to 2^18 + 1 rows (past LONG_ROWS), or, where those rows are over four times
# as many elements (Gemma 4's 512-wide global table), to this many elements.
MODEL_TABLE_ELEMENTS = 1 << 24
# Half the draws take a rope type whose attention factor exceeds 1 (YaRN's, LongRoPE's): the
# table's entries then pass 1 in magnitude, which a kernel that saturates cos and sin, or stores the
# table in a unit-range format, gets wrong; drawn uniformly over the eleven types, 20 derandomized
# examples met too few of them.
_SCALED_TYPES = st.one_of(st.sampled_from(("yarn", "longrope")), st.sampled_from(ROPE_TYPES))
_ACTIVATIONS = {"float32": ("bfloat16", "float16", "float32"), "bfloat16": ("bfloat16",), "float16": ("float16",)}


@st.composite
def scaled_rotation_cases(draw) -> RotationCase:
    """A rotation case whose spec is a drawn table case's (any rope type, its admitted length) and
    whose cache keeps that table's dtype; q and k in bf16/fp16/fp32 beside an fp32 table, else in
    the table's dtype.  1-8 tokens of 1-4 query heads: the table, not the batch, is what is drawn."""
    rope_type = draw(_SCALED_TYPES, label="rope type")
    table = draw(table_cases(rope_types=(rope_type,)), label="table")
    cache_dtype = {v: k for k, v in DTYPES.items()}[table.dtype]
    dtype = draw(st.sampled_from(_ACTIVATIONS[cache_dtype]), label="activations")
    num_q_heads = draw(st.integers(1, 4))
    return RotationCase(spec=table.spec, num_tokens=draw(st.integers(1, 8)), num_q_heads=num_q_heads,
                        num_kv_heads=draw(st.integers(0, num_q_heads)), dtype=dtype,
                        positions_kind=draw(st.sampled_from(("last_row", "uniform", "text", "grid"))),
                        packed_qkv=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 32)),
                        cache_dtype=None if dtype == cache_dtype else cache_dtype)


def model_scaled_cases(dtype: str = "bfloat16", cache_dtype: str = "float32") -> dict[str, RotationCase]:
    """One case per catalogued model with a scaled table (rope/models.yaml), at its full length where
    the table holds at most MODEL_TABLE_ELEMENTS elements, else cut (see MODEL_TABLE_ELEMENTS; only
    types whose row p does not depend on the length: yarn, deepseek_yarn, llama3, linear, proportional):
    4 tokens of 2 query and 1 kv heads at the table's last rows and random ones."""
    cases = {}
    for key, model in load_models().items():
        spec = model.spec
        if spec.scaling is None:
            continue
        if spec.max_position * spec.rotary_dim > MODEL_TABLE_ELEMENTS:
            if spec.scaling.rope_type in ("dynamic", "longrope"):
                continue
            past = 2 * LONG_ROWS + 1
            rows = past if past * spec.rotary_dim <= 4 * MODEL_TABLE_ELEMENTS else MODEL_TABLE_ELEMENTS // spec.rotary_dim
            spec = dataclasses.replace(spec, max_position=rows)
        cases[key] = RotationCase(spec=spec, num_tokens=4, num_q_heads=2, num_kv_heads=1, dtype=dtype,
                                  positions_kind="last_row", seed=0,
                                  cache_dtype=None if cache_dtype == dtype else cache_dtype)
    return cases
