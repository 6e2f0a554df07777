"""The table's check: call a table implementation on a :class:`TableCase`, validate what it returned,
and hold a sample of its rows to the float64 reference (reference.cos_sin_table's rows at the
sampled positions) within the per-element bound of rope.harness.table.bound.

:func:`assert_table_matches` is what a property ends in: on a mismatch an AssertionError tagged with
its cause (rope.harness.causes) naming the case, the worst element and the diagnosis
(rope.harness.table.diagnosis).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

import reference
from rope.devices import torch_device
from rope.harness import case_files, causes
from rope.harness.draws import current_test, hypothesis_example
from rope.harness.table.case_file import case_record
from rope.harness.table.bound import element_bound
from rope.harness.table.cases import TableCase
from rope.harness.table.diagnosis import TableMismatch, diagnose

__all__ = ["ImplementationFailed", "TableCheck", "assert_table_matches", "call_table", "check", "compare_rows",
           "record_table_check", "reference_rows", "validated"]


class ImplementationFailed(Exception):
    """The implementation raised: the test fails with what it raised, as a mismatch would."""


def call_table(fn: Callable, case: TableCase, device: str):
    """``fn(spec, max_position, dtype, device)`` under the call deadline; ImplementationFailed if it raised."""
    from rope.harness.deadline import call_timeout, deadline
    with deadline(call_timeout(), what=f"the table implementation {getattr(fn, '__name__', fn)!r}"):
        try:
            return fn(case.spec, case.max_position, case.dtype, device)
        except Exception as exc:    # noqa: BLE001 - an implementation may raise anything
            raise ImplementationFailed(f"{type(exc).__name__}: {exc}") from exc


def reference_rows(spec, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(float64 [len(rows), R] rows of reference.cos_sin_table, the float64 frequencies, the factor)."""
    inv = reference.inv_freq(spec)
    m = reference.attention_factor(spec)
    angles = rows.to(torch.float64)[:, None] * inv[None, :]
    return torch.cat((angles.cos() * m, angles.sin() * m), dim=-1), inv, m


@dataclass
class TableCheck:
    """What :func:`check` found: the mismatch (None when every compared element is within its bound)."""
    mismatch: TableMismatch | None
    elements: int
    worst_ratio: float
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.mismatch is None


def validated(result, case: TableCase, device: str) -> torch.Tensor | TableMismatch:
    """The returned table, or the shape departure that is a diagnosis (too few rows); ValueError for
    anything else that is not a table of the contract."""
    if not isinstance(result, torch.Tensor):
        raise ValueError(f"result: must be a torch.Tensor (got {type(result).__name__})")
    want = (case.max_position, case.spec.rotary_dim)
    if result.dim() == 2 and result.shape[1] == want[1] and result.shape[0] < want[0]:
        return TableMismatch("table_too_short", f"{result.shape[0]} rows where positions up to {want[0] - 1} are "
                             f"admitted: a position past row {result.shape[0] - 1} reads outside the table")
    if tuple(result.shape) != want:
        raise ValueError(f"result: shape must be {want} (max_position, rotary_dim) (got {tuple(result.shape)})")
    if result.dtype != case.dtype:
        raise ValueError(f"result: dtype must be {case.dtype} (got {result.dtype})")
    if result.device.type != torch_device(device).type:
        raise ValueError(f"result: must be on {device} (got {result.device})")
    return result


def check(fn: Callable, case: TableCase, device: str = "cpu") -> TableCheck:
    """Call ``fn`` on the case and compare its sampled rows with the reference's."""
    table = validated(call_table(fn, case, device), case, device)
    if isinstance(table, TableMismatch):
        return TableCheck(table, 0, float("inf"), [table.sentence])
    rows = case.rows()
    return compare_rows(case, rows, table.index_select(0, rows.to(table.device)).to("cpu", torch.float64), table.dtype)


def compare_rows(case: TableCase, rows: torch.Tensor, got: torch.Tensor, returned_dtype: torch.dtype) -> TableCheck:
    """The returned table's ``rows`` (``got``: float64 on the CPU) against the reference's, within the bound."""
    ref, inv, m = reference_rows(case.spec, rows)
    bound = element_bound(case.spec, rows, inv, m, ref, case.dtype)
    ratio = ((got - ref).abs() / bound.clamp(min=1e-300))
    ratio = torch.where(torch.isfinite(got), ratio, torch.full_like(ratio, float("inf")))
    worst = float(ratio.max()) if ratio.numel() else 0.0
    if worst <= 1.0:
        return TableCheck(None, got.numel(), worst)
    mismatch = diagnose(rows, got, ref, bound, dtype=case.dtype, returned_dtype=returned_dtype, inv_freq=inv, factor=m)
    return TableCheck(mismatch, got.numel(), worst, [mismatch.sentence])


def assert_table_matches(name: str, fn: Callable, case: TableCase, device: str = "cpu") -> None:
    """Hold ``fn``'s table of the case to the reference; AssertionError tagged with its cause otherwise."""
    try:
        result = check(fn, case, device)
    except ImplementationFailed as exc:
        raise AssertionError(f"{name} on the table {case.brief()} raised {exc}\nspec: {case.spec!r}") from None
    except ValueError as exc:
        raise AssertionError(f"{name} on the table {case.brief()}: wrong return value: {exc}") from None
    record_table_check(name, case, device, result)
    if result.ok:
        return
    m = result.mismatch
    where = "" if m.worst_row is None else f"; worst at row {m.worst_row}, column {m.worst_column}"
    message = (f"{name} cos/sin table {case.brief()} does not match the reference (error/bound ratio "
               f"{result.worst_ratio:.3g}{where})\nspec: {case.spec!r}\n{m.describe()}")
    failure = {"cause": m.label, "headline": m.sentence, "size": case.size, "case": case.brief()}
    final, hypothesis = hypothesis_example()
    if final:
        message += _write_case(name, fn, case, device, result, hypothesis, failure)
    raise causes.tag(AssertionError(message), **failure)


def _write_case(name: str, fn: Callable, case: TableCase, device: str, result: TableCheck, hypothesis,
                failure: dict) -> str:
    """Write the case file (once Hypothesis has shrunk); the lines to add to the message."""
    from rope.registry import get_table_implementation
    try:
        implementation = case_files.implementation_path(name, fn, resolve=get_table_implementation)
        record = case_record(implementation=implementation, fn=fn, case=case, device=device, mismatch=result.mismatch,
                             worst_ratio=result.worst_ratio, hypothesis=hypothesis)
        directory = case_files.cases_dir()
        if directory is None:
            return f"\ncase file: not written ({case_files.CASES_DIR_ENV} is off)"
        shown = case_files.display_path(case_files.write_case(record, directory))
        impl = "" if implementation in ("ours", "transformers") else f" --impl {implementation}"
        failure.update(case_file=shown, replay=f"rope-harness repro {shown}{impl}")
        return f"\ncase file: {shown}\nreplay: rope-harness repro {shown}{impl}"
    except Exception as exc:     # noqa: BLE001 - the mismatch is reported all the same
        return f"\n(case file not written: {type(exc).__name__}: {exc})"


def record_table_check(name: str, case: TableCase, device: str, result: TableCheck) -> None:
    """The check in the run report as one comparison; never lets reporting break the check."""
    from types import SimpleNamespace

    from rope.harness import report
    try:
        comparison = SimpleNamespace(ok=result.ok, worst_ratio=result.worst_ratio, num_mismatched=None if result.ok
                                     else 1, num_elements=result.elements, problems=result.problems, bounds=None)
        report.record_comparison(test=current_test(), impl=name, device=device,
                                 dtype=str(case.dtype).replace("torch.", ""), variant=f"table-{case.brief()}",
                                 comparison=comparison, tokens=case.max_position)
    except Exception:   # noqa: BLE001 - the report is best effort, the check is not
        pass
