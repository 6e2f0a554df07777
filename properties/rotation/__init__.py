"""Rotation: the properties a rotation implementation (--rope-impl) must pass, prefill sizes, aliasing, bad
input and the regression corpus included; the replay of rotation case files (--rope-repro) and the
kernel mutants' dedicated searches (rope-harness mutants) run from here too."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["aliasing", "backward_cases", "bad_inputs", "checks", "prefill_cases", "scaled_cases", "test_aliasing",
           "test_backward", "test_bad_inputs", "test_model_rotation", "test_mutant_searches", "test_prefill",
           "test_regressions", "test_replay", "test_rotation", "test_scaled_tables", "test_views", "views"]
