"""rope-harness's property suite: Hypothesis strategies, the property tests, the regression corpus
and the known-bug mutants.  Run it with ``pytest --pyargs properties`` (the harness's plugin does
the rest)."""

__rope_harness__ = True   # the harness checks this marker: another package named `properties` lacks it
