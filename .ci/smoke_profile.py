"""A pytest plugin for the project's CI only (.ci/run loads it with -p): the Hypothesis profile
"stack-smoke", the harness's ci profile with 5 generated examples per property, for the bounded run
on the second stack (the newest stack runs the ci profile's 20)."""

from hypothesis import settings

import rope.harness.plugin  # noqa: F401 - registers the ci profile this one derives from

settings.register_profile("stack-smoke", parent=settings.get_profile("ci"), max_examples=5)
