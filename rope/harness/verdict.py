"""A case's outcome in a slice's batched check (``rope.harness.<thing>.batch.check_batch``): passed,
failed, unsupported or raised, with what was compared and why; one shape for every checked thing, so
that one adapter per slice turns a batch's verdicts into a pytest outcome."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OUTCOMES", "Verdict"]

OUTCOMES = ("passed", "failed", "unsupported", "raised")


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
