"""The cache of checked calls (rope/triton/checked.py): a signature is the metadata of every tensor
and the scalars; there is none where a value is read (rope.spec.checks_values: the CPU, or
ROPE_CHECK_VALUES=1, asked at every call), nor where an argument is not a tensor."""

from __future__ import annotations

import torch

from rope.triton.checked import CheckedCalls


def test_a_signature_is_the_metadata_and_the_scalars():
    a, b = torch.zeros(4, 8), torch.zeros(4, 8)
    first = CheckedCalls.signature((1,), (a, None))
    assert first == CheckedCalls.signature((1,), (a, None))
    assert first != CheckedCalls.signature((2,), (a, None))                 # a scalar
    assert first != CheckedCalls.signature((1,), (b, None))                 # another buffer
    assert first != CheckedCalls.signature((1,), (a.t(), None))             # other strides
    assert CheckedCalls.signature((1,), (a, "not a tensor")) is None


def test_where_values_are_read_there_is_no_signature(monkeypatch):
    positions, rows = torch.zeros(4, dtype=torch.long), torch.zeros(4, 8)
    monkeypatch.delenv("ROPE_CHECK_VALUES", raising=False)
    assert CheckedCalls.signature((), (positions, rows)) is not None
    assert CheckedCalls.signature((), (positions, rows), values_read_from=positions) is None       # the CPU
    meta = torch.zeros(4, dtype=torch.long, device="meta")
    assert CheckedCalls.signature((), (positions, rows), values_read_from=meta) is not None        # no values
    monkeypatch.setenv("ROPE_CHECK_VALUES", "0")
    assert CheckedCalls.signature((), (positions, rows), values_read_from=positions) is not None
    monkeypatch.setenv("ROPE_CHECK_VALUES", "1")
    assert CheckedCalls.signature((), (positions, rows), values_read_from=meta) is not None


def test_past_its_limit_it_forgets_everything_at_once():
    calls = CheckedCalls(limit=2)
    for i in range(2):
        calls.add(("call", i), i)
    assert calls.get(("call", 0)) == 0 and len(calls) == 2
    calls.add(("call", 2), 2)
    assert len(calls) == 1 and calls.get(("call", 0)) is None and calls.get(("call", 2)) == 2
    assert calls.get(None) is None
