"""Rounds: copies of each Hypothesis test. A campaign and a fail-fast run give every Hypothesis test
a first pass of a few examples before any test's full search, so a bug in one variant is met when
the scheduler reaches that variant's first pass."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import settings


# ------------------------------------------------------------------ rounds: copies of each Hypothesis test
# A campaign (rope.harness.campaign) and a fail-fast run give every Hypothesis test one copy per
# round ([round0-...], [round1-...]), ordered by round, each copy with its round's examples and seed.
ROUND = "rope_round"


def without_round(nodeid: str) -> str:
    """A test id without its round: ``t[round2-native-cpu]`` -> ``t[native-cpu]``."""
    nodeid = re.sub(r"(?<=[\[-])round\d+(?:-|(?=\]))", "", nodeid)
    return nodeid.replace("[]", "").replace("-]", "]")


@pytest.fixture(autouse=True)
def rope_round(request):
    """The round of this copy of a Hypothesis test (None in a run without rounds)."""
    return getattr(request, "param", None)


# A run that stops at its first failure (-x, --maxfail: a kernel engineer's quick check, the mutation
# runner) first gives every Hypothesis test FIRST_PASS_EXAMPLES examples, then the profile's: a bug
# that shows in one variant is found when the scheduler reaches that variant's first pass, not after
# the full searches of every test before it; and Hypothesis shrinks for at most FAIL_FAST_SHRINK_S.
FIRST_PASS_EXAMPLES = 3


FAIL_FAST_SHRINK_S = 20


def fail_fast(config) -> bool:
    return bool(config.getoption("maxfail", 0))


def hypothesis_rounds(config) -> list[tuple[int | None, int | None]]:
    """(examples, seed) per copy of each Hypothesis test: a campaign's rounds, the fail-fast first
    pass and then the profile's own examples (None: the profile's examples, its own seed), or none."""
    from rope.harness.campaign_settings import campaign_rounds
    rounds = campaign_rounds(os.environ)
    if rounds:
        return rounds
    if fail_fast(config) and not config.getoption("--rope-repro"):
        return [(FIRST_PASS_EXAMPLES, None), (None, None)]
    return []


def parametrize_rounds(metafunc) -> None:
    """In a campaign session, every Hypothesis test once per round: the processes, their compiled
    kernels and memoized tables live through all rounds instead of starting again per round.  In
    a fail-fast run, a first pass of a few examples, then the search."""
    rounds = hypothesis_rounds(metafunc.config)
    if len(rounds) > 1 and getattr(metafunc.function, "is_hypothesis_test", False):
        metafunc.parametrize(ROUND, range(len(rounds)), ids=[f"round{i}" for i in range(len(rounds))],
                             indirect=True)


def _round_of(item) -> int:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(ROUND, 0) if callspec is not None else 0


def order_rounds(items) -> None:
    """Rounds in order: every test's round 0, then every test's round 1, ...  (a stable
    sort, after the suite's own ordering in properties/conftest.py: within a round it holds)."""
    if any(_round_of(item) for item in items):
        items.sort(key=_round_of)


def apply_round(item):
    """Set the round's examples and seed on this copy of a Hypothesis test, and the database key of
    the test without the round (a failure saved by one round is replayed first by the next);
    returns the function that puts the test's own settings and seed back."""
    examples, seed = hypothesis_rounds(item.config)[_round_of(item)]
    fn = getattr(item.obj, "__func__", item.obj)
    saved = (fn._hypothesis_internal_use_settings, fn._hypothesis_internal_use_seed)
    if examples is not None:
        fn._hypothesis_internal_use_settings = settings(parent=saved[0], max_examples=examples)
    if seed is not None:
        fn._hypothesis_internal_use_seed = seed
    item.obj.hypothesis.inner_test._hypothesis_internal_add_digest = without_round(item.nodeid).encode()

    def restore():
        fn._hypothesis_internal_use_settings, fn._hypothesis_internal_use_seed = saved
    return restore
