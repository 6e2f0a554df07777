"""The backward property's fixed cases: one small case per distinct rotation of the catalogued
models (models.yaml), and the decorator that adds them to a ``@given(case=...)`` test as
``@example`` cases.  The project's tests of the backward check use the same cases."""

from __future__ import annotations

import dataclasses

from hypothesis import example

from rope.harness.rotation.cases import RotationCase
from rope.models import load_models
from rope.spec import RopeSpec

__all__ = ["MODEL_SPECS", "model_cases", "with_model_examples"]


def _model_specs() -> dict[str, RopeSpec]:
    """One spec per distinct rotation of models.yaml, by the first model that has it: head size,
    rotary width, pairing, sections and layout (models that differ only in their base, which moves
    the table's values and no code path, share one), its table cut to 64 rows."""
    specs: dict[str, RopeSpec] = {}
    seen = set()
    for key, model in load_models().items():
        spec = dataclasses.replace(model.spec, max_position=64)
        shape = (spec.head_size, spec.rotary_dim, spec.is_neox_style, spec.sections, spec.layout, spec.freq_rows)
        if shape not in seen:
            seen.add(shape)
            specs[key] = spec
    return specs


MODEL_SPECS = _model_specs()


def with_model_examples(dtype: str, **fields):
    """Decorate a ``@given(case=...)`` test with an ``@example`` per model spec (:func:`model_cases`)."""
    def decorate(test):
        for case in reversed(model_cases(dtype, **fields)):
            test = example(case=case)(test)
        return test
    return decorate


def model_cases(dtype: str, keys=None, **fields) -> list[RotationCase]:
    """A small case per model spec (``keys``: those models only): 5 tokens of image-grid positions, 2
    query heads and 1 key head unless ``fields`` say otherwise."""
    chosen = MODEL_SPECS if keys is None else {key: MODEL_SPECS[key] for key in keys}
    base = dict(num_tokens=5, num_q_heads=2, num_kv_heads=1, dtype=dtype, positions_kind="grid", seed=0) | fields
    return [RotationCase(spec=spec, **base) for spec in chosen.values()]
