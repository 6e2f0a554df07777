"""The runner's position step: the properties a position-step implementation (--rope-position-step-impl) must pass, step by step and across a scheduler's sequence of steps."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["test_runner_positions", "test_scheduler_positions"]
