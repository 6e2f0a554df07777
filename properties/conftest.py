"""What is specific to this suite (the harness's plugin, rope.harness.plugin, does the rest):
the default Hypothesis profile, the order of the tests, and the self-tests kept out of the run
report (the plugin keeps the baseline, the replays and the mutants' searches out of a plain run)."""

from __future__ import annotations

from rope.harness.plugin import kept_out_of_the_report, load_default_profile

# Modules marked self_test run deliberately broken implementations (the suite checking itself):
# their mismatches are the point, so they stay out of the run report, which is about the code under test.
_self_tests_stay_out_of_the_report = kept_out_of_the_report(marker="self_test")


def pytest_configure(config):
    load_default_profile(config)


# Fixed cases run before the Hypothesis searches (a stable sort, the same in every xdist worker):
# the triggers of every known bug (marked known_bug) always; in a run that stops at its first failure
# (-x, --maxfail: rope-harness mutants, a kernel engineer's quick check) the prefill boundaries
# (marked boundary) next, where a path switched at a prefill-size token count fails in under a minute
# under the interpreter instead of after minutes of the rotation searches, and the sweeps (every
# catalogued model, marked sweep; the other prefill sizes) last, after the searches: one wrong kernel
# fails a search in seconds and a sweep of 118 fixed cases in half a minute.  The properties that
# call the implementation inside torch.compile (marked traced) go after even those: each drawn spec
# is a Dynamo trace, and an eager bug fails the eager properties at least as soon (a Triton kernel
# mutant under the interpreter spent 17 s there before the prefill batches caught it, 66.8 s in all).
# A full run keeps them in file order: started first, the long interpreter cases measured 55 s slower
# on 2 cores (xdist's load balancing).
def _fixed_rank(item, fail_fast: bool) -> int:
    if item.get_closest_marker("known_bug") is not None:
        return 0
    if not fail_fast:
        return 2
    if item.get_closest_marker("boundary") is not None:
        return 1
    if item.get_closest_marker("traced") is not None:
        return 4
    return 3 if item.get_closest_marker("sweep") or item.get_closest_marker("prefill") else 2


def pytest_collection_modifyitems(config, items):
    fail_fast = bool(config.getoption("maxfail", 0))
    items.sort(key=lambda item: _fixed_rank(item, fail_fast))
