"""The modes machinery (rope/harness/rotation/modes.py): bit-for-bit comparison of two calls, the mode
declarations and their skips, the compiled call."""

from __future__ import annotations

import pytest
import torch

from rope.harness.rotation.modes import bit_differences, compiled_implementation, mode_unsupported_reason
from rope.implementation import Implementation
from rope.native import rotate_native
from rope.spec import RopeSpec


def test_bit_differences_see_what_equality_does_not():
    a = torch.tensor([1.0, float("nan"), -0.0, 2.0])
    assert bit_differences(a, a.clone(), "query") == []                   # NaN equals its own bits
    b = a.clone()
    b[2] = 0.0                                                            # -0.0 and 0.0 compare equal
    [line] = bit_differences(a, b, "query")
    assert "1 of 4 elements differ" in line and "(2,)" in line
    assert bit_differences(None, None, "key") == []
    assert "returned None" in bit_differences(a, None, "key")[0]
    assert "shape/dtype" in bit_differences(a, a.half(), "key")[0]


def test_modes_are_declared_checked_and_skipped_with_their_reason():
    def fn(spec, positions, query, key, cache):
        return rotate_native(spec, positions, query, key, cache)
    fn.modes = ("eager",)
    record = Implementation.of("mine", fn)
    assert record.modes == ("eager",) and record.deterministic and not record.fullgraph
    assert "not called under torch.compile" in mode_unsupported_reason(record, "compile", "cpu")
    assert mode_unsupported_reason(record, "eager", "cpu") is None
    from rope.triton.rotary import rotate_triton
    assert "needs a GPU" in mode_unsupported_reason(Implementation.of("triton", rotate_triton), "graph", "cpu")
    assert "not called in a CUDA graph" in mode_unsupported_reason(Implementation.of("native", rotate_native), "graph", "cuda")
    fn.modes = ("eager", "jit")
    with pytest.raises(ValueError, match="mine.modes="):
        Implementation.of("mine", fn)
    fn.modes, fn.deterministic = ("eager",), "yes"
    with pytest.raises(ValueError, match="mine.deterministic='yes': must be True or False"):
        Implementation.of("mine", fn)


def test_the_compiled_call_is_traced_not_run_eagerly():
    # A rotation that skips itself under torch.compile is wrong through the compiled call and
    # right eagerly: the compiled call really is traced (no silent eager fallback).
    def skipped(spec, positions, query, key, cache):
        if torch.compiler.is_compiling():
            return query, key
        return rotate_native(spec, positions, query, key, cache)
    spec = RopeSpec(head_size=8, rotary_dim=8, is_neox_style=True, max_position=16)
    from rope.cache import cos_sin_cache
    cache = cos_sin_cache(spec, dtype=torch.float32, device="cpu")
    positions, query = torch.arange(1, 5), torch.randn(4, 8)
    eager, _ = skipped(spec, positions, query.clone(), None, cache)
    compiled, _ = compiled_implementation(Implementation.of("skipped", skipped), "cpu")(
        spec, positions, query.clone(), None, cache)
    assert not torch.equal(eager, query) and torch.equal(compiled, query)
