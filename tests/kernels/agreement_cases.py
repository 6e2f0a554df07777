"""The cases the Triton kernel must give the same bits on a GPU and under the interpreter
(tests/kernels/test_interpreter_agreement.py; a case module: its interpreter subprocess imports it too)."""

from __future__ import annotations

from properties.known_cases import KNOWN_BUG_CASES
from properties.strategies import RotationCase
from rope.spec import RopeSpec

EXTRA_CASES = {
    f"{dtype}-{layout}-{'neox' if neox else 'gptj'}": RotationCase(
        RopeSpec(96, 64, neox, (10, 11, 11), layout, 1e6, 8192), 33, 7, 3, dtype, "uniform", True, 100 + i)
    for i, (dtype, layout, neox) in enumerate(
        (d, lay, n) for d in ("float32", "float16", "bfloat16") for lay in ("chunked", "interleaved")
        for n in (True, False))
}
CASES = {**KNOWN_BUG_CASES, **EXTRA_CASES}
