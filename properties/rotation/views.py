"""The views of properties/rotation/test_views.py (a case module: the project's tests draw them for
deliberately broken implementations too): the drawn cases on each view, and real models' shapes on
each view."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from properties.known_cases import GLM_41V, HUNYUAN_OCR, QWEN35, QWEN3_VL
from properties.strategies import RotationCase, rotation_cases
from rope.harness.rotation.cases import VIEWS

# The strided views first: Hypothesis draws the first alternative most (contiguous is every other
# property's layout) and shrinks towards it.
DRAWN_VIEWS = ("heads-major", "row-gaps", "same-buffer", "packed-qkv", "contiguous")
assert sorted(DRAWN_VIEWS) == sorted(VIEWS)

# Real models' shapes on each view (few tokens and heads: the interpreter runs a program at a time).
VIEW_CASES = {
    # aiter#3841: a non-contiguous q whose heads after the first a kernel read outside the view.
    "heads-major-qwen3vl": RotationCase(QWEN3_VL, 5, 4, 2, "bfloat16", "uniform", False, 31, view="heads-major"),
    # llama.cpp#20274: an in-place rope on a non-contiguous view of one buffer (the cache's rope shift).
    "same-buffer-glm41v": RotationCase(GLM_41V, 5, 4, 2, "bfloat16", "grid", False, 32, view="same-buffer"),
    # Partial rotary on a 256-wide head, rows with a gap of a head between them.
    "row-gaps-qwen35": RotationCase(QWEN35, 3, 2, 1, "bfloat16", "last_row", False, 33, view="row-gaps"),
    "heads-major-hunyuanocr": RotationCase(HUNYUAN_OCR, 4, 2, 2, "float16", "grid", False, 34, view="heads-major"),
    "row-gaps-no-key-glm41v": RotationCase(GLM_41V, 3, 3, 0, "float32", "uniform", False, 35, view="row-gaps"),
}


def view_cases(*, dtype: str, kind: str, is_neox_style: bool | None = None, **narrowed):
    """A rotation case of 2-12 tokens and heads of at most 64 channels (of ``narrowed``'s head sizes,
    the rotation_cases arguments an implementation runs) on a drawn view; shrinks towards a
    heads-major view.  Two tokens at least: one row of a view is a contiguous row (and a heads-major
    view of one token has unit column stride)."""
    small = tuple(h for h in narrowed.get("head_sizes", (16, 32, 64)) if h <= 64) or narrowed["head_sizes"][:1]
    shapes = rotation_cases(dtype=dtype, kind=kind, is_neox_style=is_neox_style, min_tokens=2, max_tokens=12,
                            nonfinite=True, **{**narrowed, "head_sizes": small})
    return st.tuples(shapes, st.sampled_from(DRAWN_VIEWS)).map(
        lambda pair: dataclasses.replace(pair[0], packed_qkv=False, view=pair[1]))
