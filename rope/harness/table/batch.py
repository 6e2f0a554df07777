"""The table's check over a batch of cases, without pytest: every table built on the device one
after the other with no wait between them, the device waited for once, the sampled rows of every
table brought back in one copy, then each held to the float64 reference (a few dozen rows per case,
on the host) within its bound, and a verdict per case.

What the one-case check (rope.harness.table.check) adds and this does not: the diagnosis of a
failure and its case file.  :func:`assert_batch_matches_reference` hands a batch's first case that
did not pass to the one-case check, which reports it in full (and Hypothesis shrinks the batch to
that case).
"""

from __future__ import annotations

import torch

from rope.harness import profiling
from rope.harness.stop import skip_if_stopped
from rope.harness.table.cases import TableCase
from rope.harness.table.check import (ImplementationFailed, TableCheck, assert_table_matches, call_table,
                                      compare_rows, record_table_check, validated)
from rope.harness.table.diagnosis import TableMismatch
from rope.harness.verdict import RAISED, Verdict, answered_two_ways, wait_for_calls

__all__ = ["assert_batch_matches_reference", "check_batch"]

def check_batch(impl_name: str, fn, cases, device: str) -> list[Verdict]:
    """A verdict per case, in order: passed (every sampled element within its bound), failed (a
    wrong return value, too few rows, or elements past the bound) or raised."""
    cases: list[TableCase] = list(cases)
    verdicts: list[Verdict | None] = [None] * len(cases)
    picked: dict[int, tuple] = {}           # case index: (rows, the table's rows on the device, its dtype)
    for index, case in enumerate(cases):
        skip_if_stopped()
        try:
            with profiling.call_phase():
                table = validated(call_table(fn, case, device), case, device)
        except ImplementationFailed as exc:
            verdicts[index] = Verdict(case, RAISED, float("inf"), f"{RAISED} {exc}")
            continue
        except ValueError as exc:
            verdicts[index] = Verdict(case, "failed", float("inf"), f"wrong return value: {exc}")
            continue
        if isinstance(table, TableMismatch):
            verdicts[index] = Verdict(case, "failed", float("inf"), table.sentence)
            continue
        rows = case.rows()
        picked[index] = (rows, table.index_select(0, rows.to(table.device)), table.dtype)
    late = wait_for_calls(device, "the batch's table builds")
    if late is not None:
        return [v if v is not None else Verdict(c, RAISED, float("inf"), late) for c, v in zip(cases, verdicts)]
    if picked:
        order = sorted(picked)
        flat = torch.cat([picked[i][1].reshape(-1).to(torch.float64) for i in order]).cpu()
        for i, got in zip(order, flat.split([picked[i][1].numel() for i in order])):
            rows, on_device, dtype = picked[i]
            with profiling.phase("compare"):
                result = compare_rows(cases[i], rows, got.reshape(on_device.shape), dtype)
            verdicts[i] = (Verdict(cases[i], "passed", result.worst_ratio, elements=result.elements) if result.ok
                           else Verdict(cases[i], "failed", result.worst_ratio, result.mismatch.sentence,
                                        result.elements))
    return verdicts


def assert_batch_matches_reference(impl_name: str, fn, cases, device: str) -> list[Verdict]:
    """:func:`check_batch` as a pytest outcome: every case passed (each recorded in the run report as
    the one-case check records it); the first case that did not pass goes to the one-case check,
    which fails with its diagnosis and case file.  Where that case alone matches, the implementation
    built the same table two ways: an AssertionError says so."""
    verdicts = check_batch(impl_name, fn, cases, device)
    for v in verdicts:
        if v.passed:
            record_table_check(impl_name, v.case, device, TableCheck(None, v.elements, v.worst_ratio))
    for v in verdicts:
        if not v.passed:
            assert_table_matches(impl_name, fn, v.case, device)         # raises, reported in full
            raise answered_two_ways(impl_name, device, v, f"the table {v.case.brief()}", v.case.size)
    return verdicts
