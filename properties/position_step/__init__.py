"""The runner's position step: the properties a position-step implementation (--rope-position-step-impl) must
pass, step by step and across a scheduler's sequence of steps; the position kernel's mutants' dedicated
searches (rope-harness mutants) run from here too."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["known_steps", "scheduler", "step_sequences", "test_mutant_searches", "test_runner_positions",
           "test_scheduler_positions", "test_step_modes"]
