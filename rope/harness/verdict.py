"""A case's outcome in a slice's batched check (``rope.harness.<thing>.batch.check_batch``): passed,
failed, unsupported or raised, with what was compared and why; one shape for every checked thing, so
that one adapter per slice turns a batch's verdicts into a pytest outcome.  Beside it what every
batched check does alike: the one wait for a batch's calls, and the failure of a case that fails in
a batch but passes alone."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rope.devices import synchronize
from rope.harness import causes, profiling
from rope.harness.deadline import call_timeout, deadline

__all__ = ["OUTCOMES", "RAISED", "Verdict", "answered_two_ways", "wait_for_calls"]

OUTCOMES = ("passed", "failed", "unsupported", "raised")
RAISED = "raised"


@dataclass(frozen=True)
class Verdict:
    """One case's outcome in a batch: ``worst_ratio`` its largest error/bound (0 or inf where the
    check is exact; inf where it has no comparable output), ``detail`` the reason (unsupported, as
    the registry says it), what was raised, or what failed; ``elements`` the elements compared."""
    case: object
    outcome: str
    worst_ratio: float = 0.0
    detail: str = ""
    elements: int = 0

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome={self.outcome!r}: must be one of {OUTCOMES}")

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


def wait_for_calls(device: str, what: str) -> str | None:
    """Wait for a batch's calls on ``device`` under one call deadline (rope.harness.deadline), the wait
    timed as call time; what the device raised, if it did (an error it reports in this one wait cannot
    be told to one case: it is every unsettled case's raise)."""
    start = time.perf_counter()
    try:
        with deadline(call_timeout(), what=what):
            synchronize(device)
    except Exception as exc:     # noqa: BLE001 - the implementation's failure is the finding
        return f"{RAISED} {type(exc).__name__}: {exc} (reported by the device after {what})"
    finally:
        profiling.add("call", time.perf_counter() - start)
    return None


def answered_two_ways(impl_name: str, device: str, verdict: Verdict, brief: str, size: int) -> AssertionError:
    """The failure of a case that did not pass in a batch but matches the reference alone (the one-case
    check passed it): the implementation answers the same inputs two ways, grouped as nondeterministic."""
    return causes.tag(AssertionError(
        f"{impl_name} on {device}: the batched check found {brief} {verdict.outcome} ({verdict.detail[:300]}), but "
        f"alone it matches the reference: the implementation answers the same inputs differently from call to call"),
        cause="nondeterministic", headline="the same inputs answered differently in a batch and alone", size=size,
        case=brief)
