"""What every check knows of the example it runs: a draw it cannot run is rejected (a skip outside
Hypothesis) with the reason, a test none of whose shapes it runs skips up front, a test meant for the built-in implementations skips the others,
whether Hypothesis is in its final replay (the only example a mismatch report and a case file are
built for), and which test runs.  Shared by the checked things' slices (rope.harness.rotation,
rope.harness.position_step, rope.harness.position_ids); the plugin reads the rejections."""

from __future__ import annotations

import os

import pytest

import torch

from rope.registry import BUILTIN_POSITIONS, BUILTIN_ROTATIONS, unsupported_reason

__all__ = ["REJECTED_DRAWS", "current_test", "hypothesis_example", "skip_if_none_supported", "skip_or_reject",
           "skip_unless_builtin"]

# Reasons of the Hypothesis draws rejected in the test running now, with their counts: unsupported,
# a known fault, or a known defect the run avoids (the plugin turns an all-rejected test into a
# skip with these reasons, and records partial rejections in the report).
REJECTED_DRAWS: dict[str, int] = {}


def skip_or_reject(reason: str) -> None:
    """Skip the test with ``reason``; inside a Hypothesis test, reject the draw instead (counted in
    :data:`REJECTED_DRAWS`), so the search goes on with the draws the implementation runs."""
    try:
        from hypothesis.control import current_build_context
        current_build_context()
    except Exception:
        pytest.skip(reason)
    from hypothesis import reject
    REJECTED_DRAWS[reason] = REJECTED_DRAWS.get(reason, 0) + 1
    reject()


def skip_if_none_supported(impl_name: str, fn, specs, dtype: str, device: str) -> None:
    """Skip a test up front, with the reasons, when the implementation supports none of ``specs``
    (the shapes its draws come from; ``dtype`` a torch dtype's name): otherwise Hypothesis draws
    and rejects example after example until it gives up (for an engine's kernel that pairs
    NeoX-style only, say, most of a GPT-J test's time)."""
    reasons = [unsupported_reason(impl_name, fn, spec, getattr(torch, dtype), device) for spec in specs]
    if reasons and all(reasons):
        shown = sorted(set(reasons))
        pytest.skip("; ".join(shown[:3]) + (f" (and {len(shown) - 3} more shapes)" if len(shown) > 3 else ""))


def skip_unless_builtin(impl_name: str, *, kind: str = "rotation") -> None:
    """Skip a test that asserts the harness's own validation messages unless ``impl_name`` is a
    built-in implementation: an outside implementation is checked for what it computes, not for
    how it words its errors (or whether it validates at all)."""
    builtins = BUILTIN_ROTATIONS if kind == "rotation" else BUILTIN_POSITIONS
    if impl_name not in builtins:
        pytest.skip(f"asserts the harness's own validation messages: built-in {kind} implementations only "
                    f"({impl_name} is checked for what it computes)")


def current_test() -> str:
    """The pytest node id of the test running now ('' outside pytest)."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def hypothesis_example() -> tuple[bool, dict | None]:
    """(final, record) for the Hypothesis example running now.  ``final`` is False while
    Hypothesis searches or shrinks (many failing examples, none reported) and True in its final
    replay of the shrunk example, or outside Hypothesis.  ``record`` holds the version and the
    ``@reproduce_failure`` blob of the example (None outside Hypothesis); the blob is encoded
    from the example's choice sequence, which costs nothing (null if Hypothesis' internals moved)."""
    try:
        from hypothesis.control import current_build_context
        context = current_build_context()
    except Exception:
        return True, None
    import hypothesis
    record = {"version": hypothesis.__version__, "reproduce_blob": None, "decorator": None}
    try:
        from hypothesis.core import encode_failure
        choices = context.data.choices
        if choices:
            blob = encode_failure(choices)
            record["reproduce_blob"] = blob.decode("ascii")
            record["decorator"] = f"@reproduce_failure({hypothesis.__version__!r}, {blob!r})"
    except Exception:
        pass
    return bool(context.is_final), record
