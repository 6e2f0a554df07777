"""The position ids' check as a verdict per prompt, without pytest.

A position-id case is already a batch: a :class:`~rope.prompts.PromptBatch` of prompts, which an
implementation with a ``batch`` entry takes in one call (rope.harness.position_ids.check.run_batch).
The ids are integers computed on the host, so there is no device to wait for: :func:`check_batch`
runs the one check over the batch and says, per prompt, passed or failed (with the mismatch's
sentence), or raised where the call raised (a batched call that raises, or returns a malformed
value, is every prompt's).  The assertion, with the diagnosis and the case file of the first prompt
that differs, stays :func:`rope.harness.position_ids.check.assert_matches`.
"""

from __future__ import annotations

from typing import Callable

from rope.harness.position_ids.check import ImplementationFailed, check
from rope.harness.verdict import RAISED, Verdict
from rope.prompts import PromptBatch

__all__ = ["check_batch"]


def check_batch(impl_name: str, fn: Callable, family: str, batch: PromptBatch) -> list[Verdict]:
    """A verdict per prompt of ``batch``, in order (each verdict's ``case`` the prompt)."""
    prompts = list(batch.prompts)
    try:
        result = check(fn, family, batch)
    except ImplementationFailed as exc:
        return [Verdict(p, RAISED, float("inf"), f"{RAISED} {exc}") for p in prompts]
    except ValueError as exc:
        return [Verdict(p, "failed", float("inf"), f"wrong return value: {exc}") for p in prompts]
    wrong = {index: mismatch for index, mismatch, _ in result.mismatches}
    return [Verdict(p, "failed", float("inf"), wrong[i].sentence) if i in wrong else Verdict(p, "passed", 0.0, elements=1)
            for i, p in enumerate(prompts)]
