"""What the project's own tests need besides the harness's plugin (rope.harness.plugin, which runs
them like the suite: pyproject's rope_harness_test_dirs): the default Hypothesis profile, and the
tests that run deliberately broken implementations kept out of the run report."""

from __future__ import annotations

from rope.harness.plugin import kept_out_of_the_report, load_default_profile

_self_tests_stay_out_of_the_report = kept_out_of_the_report(
    {"test_suite_can_fail.py", "test_case_files.py", "test_kernel_mutants.py"})


def pytest_configure(config):
    load_default_profile(config)
