"""The rotation's check over a batch of cases, without pytest: one call of the implementation per
case, then one float64 reference and one bound over every case's elements at once, on the device
the implementation ran on, and a verdict per case.

A batch shares one spec, one activation dtype and one table dtype (one cos/sin table); the cases may
differ in tokens, head counts, positions, packing, seeds and planted non-finite values.  Each head
of each token is a row of ``head_size`` elements whose reference reads only that token's positions
and the table, so the heads of every case are stacked as rows ``[sum T_i x H_i, head_size]``, with
each token's positions repeated for its heads, and the reference, cos/sin, the bound and the error
are computed once for the stack (rope.harness.rotation.bound.element_errors, the same per-element
bound as the one-case check).  The inputs go to the device together (rope.harness.rotation.cases.
build_rotation_inputs_many), and the device is waited for once, after the last call, under one call
deadline: an error it reports in that wait cannot be told to one case and is every unsettled case's
raise.  The reference is computed from the pristine table, never from the copy the calls are lent: one copy
for the batch (a clone per case would hold them all at once), compared with the table once after the wait;
a written copy fails every case, and the one-case checks of the cases, in order, find the call that wrote.

What the one-case check (rope.harness.rotation.check) adds and this does not: the read-only checks
of positions and table, the in-place contract, bytes outside a strided view, the diagnosis and the
case file.  :func:`assert_batch_matches_reference` hands a batch's first case that did not pass to
the one-case check, which reports it in full (and Hypothesis shrinks a batch to that one case).
"""

from __future__ import annotations

import torch

from rope.harness import profiling, report
from rope.harness.deadline import call_timeout, deadline
from rope.harness.draws import current_test, skip_or_reject
from rope.harness.placement import device_label
from rope.harness.rotation.bound import Comparison, element_errors, element_ratios, own_angle_error
from rope.harness.rotation.cases import DTYPES, RotationCase, build_rotation_inputs_many
from rope.harness.rotation.check import (RAISED, angle_source, assert_matches_reference, contained_rotation,
                                         reference_rotation)
from rope.harness.stop import skip_if_stopped
from rope.harness.verdict import OUTCOMES, Verdict, answered_two_ways, wait_for_calls
from rope.registry import unsupported_reason, working_precision

__all__ = ["OUTCOMES", "Verdict", "assert_batch_matches_reference", "check_batch"]


def _same(cases: list[RotationCase]) -> None:
    for name in ("spec", "dtype", "cache_dtype"):
        values = {getattr(c, name) for c in cases}
        if len(values) > 1:
            raise ValueError(f"cases: a batch shares one {name} (got {len(values)} different: {sorted(map(str, values))[:3]})")
    views = sorted({c.view for c in cases} - {"contiguous"})
    if views:
        raise ValueError(f"cases: view={views[0]!r}: a strided view is checked alone (its bytes outside the view "
                         f"are the one-case check's, rope.harness.rotation.check)")


def _output_problems(name: str, x: torch.Tensor | None, out) -> list[str]:
    if x is None:
        return [] if out is None else [f"{name}: the input key is None but the implementation returned a tensor"]
    if not isinstance(out, torch.Tensor):
        return [f"{name}: the implementation returned {type(out).__name__}, not a tensor"]
    problems = []
    if out.dtype != x.dtype:
        problems.append(f"{name}.dtype={out.dtype}: must equal the input dtype {x.dtype}")
    if tuple(out.shape) != tuple(x.shape):
        problems.append(f"{name}.shape={tuple(out.shape)}: must equal the input shape {tuple(x.shape)}")
    if out.device != x.device:
        problems.append(f"{name}.device={out.device}: must equal the input device {x.device}")
    return problems


def check_batch(impl_name: str, fn, cases, device: str) -> list[Verdict]:
    """A verdict per case, in order.  ValueError naming ``cases`` for a batch that does not share one
    spec, dtype and table dtype, or holds a strided view."""
    cases = list(cases)
    if not cases:
        return []
    _same(cases)
    first = cases[0]
    why = unsupported_reason(impl_name, fn, first.spec, DTYPES[first.dtype], device)
    if why is not None:
        return [Verdict(c, "unsupported", detail=why) for c in cases]
    spec, verdicts = first.spec, [None] * len(cases)
    rows, owners = [], []     # (positions [D, N], input [N, hs], output [N, hs]), case index
    with profiling.phase("inputs"):
        every_input = build_rotation_inputs_many(cases, device, one_table_copy=True)
    table = every_input[0].pristine_cache        # the reference's: never the copy the calls were lent
    with deadline(call_timeout(), what="the batch's calls"):     # one for the calls, one for the wait after them
        for index, (case, inputs) in enumerate(zip(cases, every_input)):
            _call_one(fn, spec, index, case, inputs, device, verdicts, rows, owners)
    late = wait_for_calls(device, "the batch's calls")
    if late is not None:                   # reported by the device after the calls: no case can be told apart
        return [v if v is not None else Verdict(c, "raised", float("inf"), late) for c, v in zip(cases, verdicts)]
    written = _table_written(every_input)
    if written is not None:                # every later call read another table: none of them is settled
        return [v if v is not None else Verdict(c, "failed", float("inf"), written) for c, v in zip(cases, verdicts)]
    worst, mismatched, elements = _compare(fn, spec, rows, owners, table, len(cases))
    for index, case in enumerate(cases):
        if verdicts[index] is not None:
            continue
        count, ratio = int(mismatched[index]), float(worst[index])
        verdicts[index] = (Verdict(case, "passed", ratio, elements=int(elements[index])) if not count else
                           Verdict(case, "failed", ratio, f"{count} of {int(elements[index])} elements past the bound, "
                                   f"worst error/bound {ratio:.3g}", int(elements[index])))
    return verdicts


TABLE_WRITTEN = ("the cos/sin table lent to the batch's calls was written (it is read-only); the one-case check "
                 "of each call finds which")


def _call_one(fn, spec, index: int, case: RotationCase, inputs, device: str, verdicts, rows, owners) -> None:
    """Case ``index``'s call, not waited for: its verdict where the call already tells it (a raise, an
    output of the wrong kind), else its rows for the batch's comparison."""
    skip_if_stopped()
    with profiling.phase("inputs"):
        query = inputs.query.clone()                       # the untouched inputs (an in-place call rotates its own)
        key = None if inputs.key is None else inputs.key.clone()
    # No wait per call: one GPU shared by a campaign's many processes answers each wait late.
    inputs, q_out, k_out, failure, _ = contained_rotation(fn, case, device, inputs=inputs, sync=False,
                                                          own_deadline=False)
    if failure is not None:
        verdicts[index] = Verdict(case, "raised" if failure.startswith(RAISED) else "failed", float("inf"), failure)
        return
    problems = _output_problems("query", query, q_out) + _output_problems("key", key, k_out)
    if problems:
        verdicts[index] = Verdict(case, "failed", float("inf"), "; ".join(problems))
        return
    positions = inputs.positions.reshape(spec.num_dims, -1)
    for x, out, heads in ((query, q_out, case.num_q_heads), (key, k_out, case.num_kv_heads)):
        if x is None or x.numel() == 0:
            continue
        # Row t * heads + h is token t's head h: its positions are token t's, repeated per head.
        rows.append((positions.repeat_interleave(heads, dim=1), x.reshape(-1, spec.head_size),
                     out.detach().reshape(-1, spec.head_size)))
        owners.append(torch.full((x.shape[0] * heads,), index, dtype=torch.long))


def _table_written(every_input) -> str | None:
    """What the batch's calls did to the one copy of the table they were lent (read-only: the reference
    reads the pristine table, so a call that wrote the copy left every later call a table of its own)."""
    x = every_input[0]
    if x.cache is x.pristine_cache or torch.equal(x.cache, x.pristine_cache):
        return None
    return TABLE_WRITTEN


def _compare(fn, spec, rows, owners, table, num_cases):
    """Per case: the worst error/bound, the elements past the bound and the elements compared."""
    zeros = torch.zeros(num_cases, dtype=torch.float64)
    if not rows:
        return zeros, zeros, zeros
    positions = torch.cat([r[0] for r in rows], dim=1)
    x = torch.cat([r[1] for r in rows])
    got = torch.cat([r[2] for r in rows]).to(torch.float64)
    owner = torch.cat(owners).to(x.device)
    pos = positions[0].contiguous() if spec.num_dims == 1 else positions
    with profiling.phase("reference"):
        exp = reference_rotation(fn, spec, pos, x, None, table)[0].to(torch.float64)
    with profiling.phase("compare"):
        angles = angle_source(fn)
        if angles == "cache":
            from reference.rotation import select_cos_sin
            cos, sin = select_cos_sin(spec, pos, table)
            angle_error, cache_dtype = None, table.dtype
        else:
            from reference.rotation import exact_cos_sin
            cos, sin = exact_cos_sin(spec, pos)
            angle_error, cache_dtype = own_angle_error(spec, pos), None
        err, bound = element_errors(spec, x, got, exp, cos.to(x.device), sin.to(x.device), working_precision(fn),
                                    None if angle_error is None else angle_error.to(x.device), cache_dtype)
        ratio = element_ratios(err, bound).amax(dim=1)
        past = (err > bound).sum(dim=1).to(torch.float64)
        worst = torch.zeros(num_cases, dtype=torch.float64, device=x.device).scatter_reduce(
            0, owner, ratio, reduce="amax", include_self=True)
        mismatched = torch.zeros(num_cases, dtype=torch.float64, device=x.device).index_add(0, owner, past)
        elements = torch.zeros(num_cases, dtype=torch.float64, device=x.device).index_add(
            0, owner, torch.full_like(past, spec.head_size))
    return worst.cpu(), mismatched.cpu(), elements.cpu()


def assert_batch_matches_reference(impl_name: str, fn, cases, device: str) -> list[Verdict]:
    """:func:`check_batch` as a pytest outcome: every case passed (each counted in the run's
    report); an unsupported batch is skipped or rejected with its reason; the first case that did not
    pass goes to the one-case check, which fails with its diagnosis and case file.  Where that case
    alone matches, the implementation answered the same case two ways: an AssertionError says so."""
    verdicts = check_batch(impl_name, fn, cases, device)
    if verdicts and all(v.outcome == "unsupported" for v in verdicts):
        skip_or_reject(verdicts[0].detail)
    for verdict in verdicts:
        if verdict.passed:
            _record(impl_name, verdict, device)
    for verdict in verdicts:
        if verdict.outcome in ("failed", "raised"):
            assert_matches_reference(impl_name, fn, verdict.case, device)      # raises, reported in full
            if verdict.detail == TABLE_WRITTEN:    # the call that wrote may be a later one: each alone, in order
                for later in verdicts[verdicts.index(verdict) + 1:]:
                    assert_matches_reference(impl_name, fn, later.case, device)
            # The same cause as the modes property's same-inputs-twice check (properties/rotation/test_modes.py).
            raise answered_two_ways(impl_name, device, verdict, f"case {verdict.case.brief()}", verdict.case.size)
    return verdicts


def _record(impl_name: str, verdict: Verdict, device: str) -> None:
    try:
        comparison = Comparison(verdict.case.spec, worst_ratio=verdict.worst_ratio, num_elements=verdict.elements)
        report.record_comparison(test=current_test(), impl=impl_name, device=device_label(device),
                                 dtype=verdict.case.dtype, variant=verdict.case.spec.variant(), comparison=comparison,
                                 tokens=verdict.case.num_tokens)
    except Exception:   # noqa: BLE001 - the report is best effort, the assertion is not
        pass
