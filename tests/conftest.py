"""What the project's own tests need besides the harness's plugin (rope.harness.plugin, which runs
them like the suite: pyproject's rope_harness_test_dirs): the default Hypothesis profile, and the
tests that run deliberately broken implementations kept out of the run report."""

from __future__ import annotations

import pytest
from hypothesis import settings

from rope.harness import report
from rope.harness.plugin import default_profile

# Their mismatches are the point, so they stay out of the run report, which is about the code under test.
SELF_TEST_MODULES = {"test_suite_can_fail.py", "test_case_files.py", "test_kernel_mutants.py"}


def pytest_configure(config):
    # Before the test modules are imported, so their @settings inherit the profile's values.
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(default_profile())


@pytest.fixture(autouse=True, scope="module")
def _self_tests_stay_out_of_the_report(request):
    # Module scope: before the modules' own module-scoped fixtures, which run broken code too.
    if request.node.path.name not in SELF_TEST_MODULES:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(report.DISABLE_ENV, "1")
        yield
