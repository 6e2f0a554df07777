"""The rotation's check over a batch of cases, without pytest: one call of the implementation per
case, then one float64 reference and one bound over every case's elements together (a slice of
rows at a time), on the device the implementation ran on, and a verdict per case.

A batch shares one spec, one activation dtype and one table dtype (one cos/sin table); the cases may
differ in tokens, head counts, positions, packing, seeds and planted non-finite values.  Each head of
each token is a row of ``head_size`` elements whose reference reads only that token's positions and the
table, so the heads of every case are stacked as rows ``[sum T_i x H_i, head_size]`` (copied before the
first call), with each token's positions gathered for its heads, and the reference, cos/sin, the bound
and the error are computed for the stack, up to 2^23 elements at a time
(rope.harness.rotation.bound.element_errors, the same per-element bound as the one-case check).  The
inputs go to the device together (rope.harness.rotation.cases.build_rotation_inputs_many), and the
device is waited for once, after the last call, under one call deadline: an error it reports in that
wait cannot be told to one case and is every unsettled case's raise.  The reference is computed from the
pristine table, never from the copy the calls are lent: one copy for the batch (a clone per case would
hold them all at once), compared with the table once after the wait; a written copy fails every case,
and the one-case checks of the cases, in order, find the call that wrote.

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
from rope.harness.rotation.bound import (DEVICE_SLICE_ELEMENTS, Comparison, element_errors, element_ratios,
                                        own_angle_error)
from rope.harness.rotation.cases import DTYPES, RotationCase, build_rotation_inputs_many
from rope.harness.rotation.check import (RAISED, angle_source, assert_matches_reference, contained_rotation,
                                         reference_rotation)
from rope.harness.stop import skip_if_stopped
from rope.harness.verdict import OUTCOMES, Verdict, answered_two_ways, wait_for_calls
from rope.registry import unsupported_reason, working_precision

__all__ = ["CHECKED_TOGETHER", "OUTCOMES", "Verdict", "assert_batch_matches_reference", "check_batch"]


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


# The most cases checked together: their calls share one call deadline (rope.harness.deadline.
# call_timeout: 120 s, so at least 0.9 s a call), one device wait, and their inputs are alive together
# (at most about 2^17 elements of q and k a case: 64 MiB in float32 for 127).  A longer batch is
# checked this many at a time, each part a few milliseconds of fixed work.
CHECKED_TOGETHER = 127


def check_batch(impl_name: str, fn, cases, device: str) -> list[Verdict]:
    """A verdict per case, in order, the cases checked :data:`CHECKED_TOGETHER` at a time.  ValueError
    naming ``cases`` for a batch that does not share one spec, dtype and table dtype, or holds a
    strided view."""
    cases = list(cases)
    if not cases:
        return []
    _same(cases)
    first = cases[0]
    why = unsupported_reason(impl_name, fn, first.spec, DTYPES[first.dtype], device)
    if why is not None:
        return [Verdict(c, "unsupported", detail=why) for c in cases]
    return [v for start in range(0, len(cases), CHECKED_TOGETHER)
            for v in _check_together(fn, cases[start:start + CHECKED_TOGETHER], device)]


def _check_together(fn, cases: list[RotationCase], device: str) -> list[Verdict]:
    """:func:`check_batch` of at most CHECKED_TOGETHER cases the implementation supports: their inputs
    built together, their calls under one deadline, one wait, one comparison."""
    spec, verdicts = cases[0].spec, [None] * len(cases)
    outputs: list = [None] * len(cases)            # (q_out, k_out) of each call that returned two tensors
    with profiling.phase("inputs"):
        every_input = build_rotation_inputs_many(cases, device, one_table_copy=True)
        untouched = _rows_of(spec, every_input)    # before any call: an in-place call rotates its own
    table = every_input[0].pristine_cache        # the reference's: never the copy the calls were lent
    with deadline(call_timeout(), what="the batch's calls"):     # one for the calls, one for the wait after them
        for index, (case, inputs) in enumerate(zip(cases, every_input)):
            _call_one(fn, spec, index, case, inputs, device, verdicts, outputs)
    late = wait_for_calls(device, "the batch's calls")
    if late is not None:                   # reported by the device after the calls: no case can be told apart
        return [v if v is not None else Verdict(c, "raised", float("inf"), late) for c, v in zip(cases, verdicts)]
    written = _table_written(every_input)
    if written is not None:                # every later call read another table: none of them is settled
        return [v if v is not None else Verdict(c, "failed", float("inf"), written) for c, v in zip(cases, verdicts)]
    worst, mismatched = (t.tolist() for t in _compare(fn, spec, untouched, _rows_out(spec, every_input, outputs),
                                                      table, cases))
    for index, case in enumerate(cases):
        if verdicts[index] is not None:
            continue
        elements = case.num_tokens * (case.num_q_heads + case.num_kv_heads) * spec.head_size
        count, ratio = int(mismatched[index]), worst[index]
        verdicts[index] = (Verdict(case, "passed", ratio, elements=elements) if not count else
                           Verdict(case, "failed", ratio, f"{count} of {elements} elements past the bound, "
                                   f"worst error/bound {ratio:.3g}", elements))
    return verdicts


TABLE_WRITTEN = ("the cos/sin table lent to the batch's calls was written (it is read-only); the one-case check "
                 "of each call finds which")


def _call_one(fn, spec, index: int, case: RotationCase, inputs, device: str, verdicts, outputs) -> None:
    """Case ``index``'s call, not waited for: its verdict where the call already tells it (a raise, an
    output of the wrong kind), else its outputs for the batch's comparison."""
    skip_if_stopped()
    # No wait per call: one GPU shared by a campaign's many processes answers each wait late.
    query, key = inputs.query, inputs.key          # an in-place call's outputs are these: same shape and dtype
    inputs, q_out, k_out, failure, _ = contained_rotation(fn, case, device, inputs=inputs, sync=False,
                                                          own_deadline=False)
    if failure is not None:
        verdicts[index] = Verdict(case, "raised" if failure.startswith(RAISED) else "failed", float("inf"), failure)
        return
    problems = _output_problems("query", query, q_out) + _output_problems("key", key, k_out)
    if problems:
        verdicts[index] = Verdict(case, "failed", float("inf"), "; ".join(problems))
        return
    outputs[index] = (q_out, k_out)


# The batch's rows: each case's q heads, then its k heads, case after case.  Row t * H + h of a case's
# q (k) is its token t's head h, so its positions are token t's: the rows' positions are gathered from
# the cases' positions side by side [num_dims, sum T] by each row's token.  A case whose call settled
# its verdict (raised, returned the wrong kind) keeps its rows, filled with its inputs; its result is not read.
def _parts(x) -> list:
    """A case's tensors whose rows are compared: q, and k where the case has one."""
    return [x.query] if x.key is None else [x.query, x.key]


def _rows(tensors, head_size: int) -> torch.Tensor:
    """[T, H * head_size] tensors (row-strided views included) as one [sum T * H, head_size] tensor."""
    return torch.cat([t.reshape(-1, head_size) for t in tensors])


def _rows_of(spec, every_input) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions [num_dims, sum T], rows [R, head_size] of every q and k: copies made before the calls;
    each row's token among the sum T and its case index, [R] on the host)."""
    hs = spec.head_size
    tokens, heads, owners, firsts, first = [], [], [], [], 0
    for index, x in enumerate(every_input):
        for t in _parts(x):
            tokens.append(t.shape[0])
            heads.append(t.shape[1] // hs)
            owners.append(index)
            firsts.append(first)
        first += x.query.shape[0]
    rows = _rows([t for x in every_input for t in _parts(x)], hs)
    positions = torch.cat([x.positions.reshape(spec.num_dims, -1) for x in every_input], dim=1)
    # Row r of part p (r counted from the part's first row): token firsts[p] + r // heads[p].
    tokens, heads = torch.tensor(tokens), torch.tensor(heads)
    counts = tokens * heads
    part = torch.repeat_interleave(torch.arange(len(counts)), counts)
    starts = torch.cumsum(counts, 0) - counts
    row_token = torch.tensor(firsts)[part] + (torch.arange(int(counts.sum())) - starts[part]) // heads[part]
    return positions, rows, row_token, torch.tensor(owners)[part]


def _rows_out(spec, every_input, outputs) -> torch.Tensor:
    """The calls' outputs as rows in :func:`_rows_of`'s order (a settled case's: its inputs)."""
    return _rows([t.detach() for x, o in zip(every_input, outputs)
                  for t in (_parts(x) if o is None else [o[0]] if x.key is None else list(o))], spec.head_size)


def _table_written(every_input) -> str | None:
    """What the batch's calls did to the one copy of the table they were lent (read-only: the reference
    reads the pristine table, so a call that wrote the copy left every later call a table of its own)."""
    x = every_input[0]
    if x.cache is x.pristine_cache or torch.equal(x.cache, x.pristine_cache):
        return None
    return TABLE_WRITTEN


def _compare(fn, spec, untouched, got, table, cases):
    """Per case: the worst error/bound and the elements past the bound, over slices of the rows of at
    most DEVICE_SLICE_ELEMENTS elements each (a case's rows may fall in two slices: its worst is the
    larger, its count the sum), so a batch of any size holds one slice's float64 temporaries at a time."""
    positions, x, row_token, owner = untouched
    worst = torch.zeros(len(cases), dtype=torch.float64, device=x.device)
    mismatched = torch.zeros(len(cases), dtype=torch.float64, device=x.device)
    row_token, owner = row_token.to(x.device), owner.to(x.device)
    step = max(1, DEVICE_SLICE_ELEMENTS // spec.head_size)
    for first in range(0, x.shape[0], step):
        rows = slice(first, first + step)
        ratio, past = _compare_rows(fn, spec, positions[:, row_token[rows]], x[rows], got[rows], table)
        worst.scatter_reduce_(0, owner[rows], ratio, reduce="amax", include_self=True)
        mismatched.index_add_(0, owner[rows], past)
    return worst.cpu(), mismatched.cpu()


def _compare_rows(fn, spec, positions, x, got, table):
    """Per row of ``x`` [R, head_size] (positions [num_dims, R]): the worst error/bound and the
    elements past the bound."""
    got = got.to(torch.float64)
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
        return element_ratios(err, bound).amax(dim=1), (err > bound).sum(dim=1).to(torch.float64)


def assert_batch_matches_reference(impl_name: str, fn, cases, device: str) -> list[Verdict]:
    """:func:`check_batch` as a pytest outcome: every case passed (each counted in the run's
    report); an unsupported batch is skipped or rejected with its reason; the first case that did not
    pass goes to the one-case check, which fails with its diagnosis and case file.  Where that case
    alone matches, the implementation answered the same case two ways: an AssertionError says so."""
    verdicts = check_batch(impl_name, fn, cases, device)
    if verdicts and all(v.outcome == "unsupported" for v in verdicts):
        skip_or_reject(verdicts[0].detail)
    _record_passed(impl_name, [v for v in verdicts if v.passed], device)
    for verdict in verdicts:
        if verdict.outcome in ("failed", "raised"):
            assert_matches_reference(impl_name, fn, verdict.case, device)      # raises, reported in full
            if verdict.detail == TABLE_WRITTEN:    # the call that wrote may be a later one: each alone, in order
                for later in verdicts[verdicts.index(verdict) + 1:]:
                    assert_matches_reference(impl_name, fn, later.case, device)
            # The same cause as the modes property's same-inputs-twice check (properties/rotation/test_modes.py).
            raise answered_two_ways(impl_name, device, verdict, f"case {verdict.case.brief()}", verdict.case.size)
    return verdicts


def _record_passed(impl_name: str, passed: list[Verdict], device: str) -> None:
    """The passed cases' comparison records, in one append (a batch shares its test, spec and dtype)."""
    if not passed:
        return
    try:
        test, label = current_test(), device_label(device)
        records = []
        for verdict in passed:
            comparison = Comparison(verdict.case.spec, worst_ratio=verdict.worst_ratio, num_elements=verdict.elements)
            records.append(report.comparison_fields(test=test, impl=impl_name, device=label, dtype=verdict.case.dtype,
                                                    variant=verdict.case.spec.variant(), comparison=comparison,
                                                    tokens=verdict.case.num_tokens))
        report.record_many(records)
    except Exception:   # noqa: BLE001 - the report is best effort, the assertion is not
        pass
