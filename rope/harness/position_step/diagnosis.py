"""Where a position step departs from the reference, and the cause a failure is grouped under.

The step's positions are integers: the check is equality, and the diagnosis says which elements
differ (:func:`wrong_positions`: the count, the first (row, column) pairs with their values) and
names the cause (:func:`cause`): ``writes_outside`` for a write past the step or into a guard,
``wrong_positions`` for any other difference."""

from __future__ import annotations

import torch

from rope.harness import profiling

LABELS = ("wrong_positions", "writes_outside")


def wrong_positions(out: torch.Tensor, expected: torch.Tensor, *, shown: int = 5) -> str | None:
    """None when the step's positions ``out`` [num_dims, T] equal ``expected``, else what differs:
    the count, the first (row, column) pairs with their values, and the whole rows for a short step
    (a 16,384-token step would print 50,000 numbers)."""
    with profiling.phase("compare"):
        bad = (out != expected).nonzero().tolist()
    if not bad:
        return None
    first = bad[:shown]
    text = (f"{len(bad)} wrong positions, first (row, column) {first}: got {[int(out[r, c]) for r, c in first]}, "
            f"expected {[int(expected[r, c]) for r, c in first]}")
    if out.shape[-1] <= 64:
        text += f"; got {out.tolist()}, expected {expected.tolist()}"
    return text


def cause(problems: list[str]) -> str:
    """The label of a failed step's problems: ``writes_outside`` when one is a write past the step
    or a guard violation, else ``wrong_positions``."""
    outside = any(p.startswith(("wrote ", "guard violation")) for p in problems)
    return "writes_outside" if outside else "wrong_positions"
