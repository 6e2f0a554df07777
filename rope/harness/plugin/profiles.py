"""The Hypothesis profiles the harness registers (dev, ci, deep, explicit, campaign) and the one a
run loads by default; the fixture that keeps deliberately broken implementations out of the run
report."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from rope.harness.suite import DRAWN_SUFFIX


# filter_too_much: draws an implementation does not support are rejected (rope.harness.draws).
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          max_examples=20, suppress_health_check=_SLOW_OK)
settings.register_profile("deep", max_examples=2000, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK)
# The @example cases only, no search: fixed launches, e.g. for lab/bench/sanitize_kernels.py under memcheck.
settings.register_profile("explicit", phases=[Phase.explicit], deadline=None, database=None,
                          suppress_health_check=_SLOW_OK)
# The drawn cases alone: each profile without its @example cases (Hypothesis' explicit phase), for
# `rope-harness mutants`' drawn-only column, which also deselects the tests marked fixed_cases.
DRAWN_PHASES = (Phase.generate, Phase.target, Phase.shrink)
for _name in ("dev", "ci", "deep"):
    settings.register_profile(_name + DRAWN_SUFFIX, parent=settings.get_profile(_name), phases=DRAWN_PHASES)
if os.environ.get("ROPE_CAMPAIGN"):
    # A rope-harness campaign round: its examples per test and the example database every worker
    # and round shares (rope.harness.campaign), so a failure found anywhere is replayed everywhere.
    from rope.harness.campaign_settings import campaign_profile

    settings.register_profile("campaign", **campaign_profile(os.environ), suppress_health_check=_SLOW_OK)


def default_profile() -> str:
    """The profile the suite loads when ``--hypothesis-profile`` is not given."""
    return "ci" if os.environ.get("CI") else "dev"


def load_default_profile(config) -> None:
    """Load :func:`default_profile` unless the run names one: a test directory's conftest calls it
    from ``pytest_configure``, before the test modules are imported, so that their @settings inherit
    the profile's values."""
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(default_profile())


def kept_out_of_the_report(*, marker: str | None = None, every_module: bool = False):
    """An autouse, module-scoped fixture for a conftest: the tests of the modules carrying
    ``marker``, or of every module under the conftest, run deliberately broken implementations, so
    their mismatches stay out of the run report, which is about the code under test.  Module scope:
    before the modules' own module-scoped fixtures, which run broken code too."""
    @pytest.fixture(autouse=True, scope="module")
    def _kept_out_of_the_report(request):
        if not every_module and (marker is None or request.node.get_closest_marker(marker) is None):
            yield
            return
        from rope.harness import report
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(report.DISABLE_ENV, "1")
            yield
    return _kept_out_of_the_report
