"""The runner's position step: the properties a position-step implementation (--rope-position-step-impl) must pass, step by step and across a scheduler's sequence of steps."""
