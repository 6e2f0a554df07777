"""What the project's own tests need besides the harness's plugin (rope.harness.plugin, which runs
them like the suite: pyproject's rope_harness_test_dirs): the default Hypothesis profile, and the
run report kept to the suite.

The project's tests run deliberately broken stand-ins (mutants, hanging and lying implementations,
guessed bugs) through the harness's own checks: none of them is code under test, so no test of
this directory records into the run report, whatever it runs (a repository run's summary.md
counted their mismatches as the run's failures).  A test that checks the report itself sets up its
own run (its own directory, or a subprocess whose environment drops the switch)."""

from __future__ import annotations

from rope.harness.plugin import kept_out_of_the_report, load_default_profile

_self_tests_stay_out_of_the_report = kept_out_of_the_report(every_module=True)


def pytest_configure(config):
    load_default_profile(config)
