"""rope-harness's property suite: Hypothesis strategies, the property tests, the regression corpus
and the known-bug mutants.  Run it with ``pytest --pyargs properties`` (the harness's plugin does
the rest)."""

# Its modules and sub-packages, a sub-package per checked thing.
__all__ = ["baseline", "dispatch", "known_cases", "mutants", "position_ids", "position_step", "prompt_strategies",
           "rotation", "strategies"]

__rope_harness__ = True   # the harness checks this marker: another package named `properties` lacks it
