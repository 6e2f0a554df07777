"""How a suite run's tests are spread over pytest-xdist's workers: its last minutes must not be one
worker's queue of long tests while the others wait idle.

* :func:`steal_work`: a plain ``-n N`` run uses xdist's ``worksteal`` scheduling (an idle worker takes
  the tail of a busy one's queue) instead of ``load`` (a queue, once sent, stays with its worker);
  a ``--dist`` the user gives is kept, and so is ``load`` in a campaign (its rounds run in order) and
  in a run that stops at its first failure (its first passes run in order).
* :func:`longest_first`: on a run that checks a GPU, the prefill sizes (marker ``prefill``: up to a
  minute each there, the suite's longest) are collected first, so they start first; the rest keeps
  its order.  Not in a fail-fast run or a campaign, which order their tests themselves.
* :func:`same_case_together`: a test's parametrizations that share one ``case`` (the model sweep: one
  model's row for every implementation) run one after another, so the worker that builds the case's
  cos/sin table (up to 2^21 rows, seconds to build on the CPU) still holds it for the next
  implementation.  In pytest's own order every model of one implementation comes first, and by the
  next implementation's turn a worker's table memo has let the table go.
"""

from __future__ import annotations

import os
import shlex

from rope.harness.plugin.rounds import fail_fast
from rope.harness.plugin.selection import GPU_KINDS, selected_devices

__all__ = ["longest_first", "same_case_together", "steal_work"]


def _dist_chosen(config) -> bool:
    """Whether the user chose xdist's scheduling (--dist / -d on the command line, in $PYTEST_ADDOPTS or addopts)."""
    args = list(config.invocation_params.args) + shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    try:
        args += list(config.getini("addopts") or [])
    except (ValueError, KeyError):
        pass
    return any(a in ("-d", "--dist", "--distload") or a.startswith("--dist=") for a in args)


def _ordered_elsewhere(config) -> bool:
    return bool(os.environ.get("ROPE_CAMPAIGN")) or fail_fast(config)


def steal_work(config) -> None:
    """``--dist load`` (xdist's default with -n) becomes ``worksteal`` where xdist has it, the user
    chose no scheduling and the run does not order its tests itself."""
    if getattr(config.option, "dist", None) != "load" or _dist_chosen(config) or _ordered_elsewhere(config):
        return
    try:
        from xdist.scheduler import WorkStealingScheduling  # noqa: F401 - xdist >= 3.2
    except ImportError:
        return
    config.option.dist = "worksteal"


def longest_first(config, items) -> None:
    """On a run that checks a GPU, the tests marked ``prefill`` first (a stable sort)."""
    if _ordered_elsewhere(config) or not any(kind in GPU_KINDS for kind in selected_devices(config)):
        return
    items.sort(key=lambda item: item.get_closest_marker("prefill") is None)


def same_case_together(items) -> None:
    """The parametrizations of one test function that share the same ``case`` parameter next to each
    other, in the order their cases first appear, in the places that test's items held; every other
    item keeps its place."""
    places: dict[tuple, list[int]] = {}
    for index, item in enumerate(items):
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "case" in callspec.params:
            places.setdefault((str(item.path), item.originalname), []).append(index)
    for indices in places.values():
        group = [items[i] for i in indices]
        first_seen: dict = {}
        for item in group:
            first_seen.setdefault(_case_key(item.callspec.params["case"]), len(first_seen))
        group.sort(key=lambda item: first_seen[_case_key(item.callspec.params["case"])])    # stable
        for i, item in zip(indices, group, strict=True):
            items[i] = item


def _case_key(case):
    try:
        hash(case)
    except TypeError:
        return repr(case)
    return case
