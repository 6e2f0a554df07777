"""The runner's position step: the properties a position-preparation implementation (--rope-positions-impl) must pass, step by step and across a scheduler's sequence of steps."""
