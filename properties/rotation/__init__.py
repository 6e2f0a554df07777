"""Rotation: the properties a rotation implementation (--rope-impl) must pass, prefill sizes, aliasing, bad input and the regression corpus included."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["prefill_cases", "test_aliasing", "test_bad_inputs", "test_model_rotation", "test_prefill",
           "test_regressions", "test_rotation"]
