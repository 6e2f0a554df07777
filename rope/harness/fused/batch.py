"""A fused op's check over a batch of cases, without pytest: every case's call made on the device one
after the other with no wait between them, the device waited for once, then each case held to the
reference by the one-case check's comparison, and a verdict per case.

The one-case checks (rope.harness.fused.check) snapshot the inputs, compute the reference, call and
compare in one go.  Here each case's inputs are built twice (they regenerate bit for bit from the
seed): every case's first set is built before the first call (a copy to the device, the cos/sin
table's say, would wait for the calls queued before it), and the implementation is called on each
first set with no wait; after the one wait, the
comparison runs on the second set, whose call is a replay that copies what the first call left in
every input tensor and returns what it returned.  So the comparison sees exactly the call's effects,
and the device is waited for once per batch, not once per case.

What the one-case check adds and this does not: the diagnosis of a failure and its case file.
:func:`assert_batch_matches_reference` hands a batch's first case that did not pass to the
one-case check, which reports it in full (and Hypothesis shrinks the batch to that case).
"""

from __future__ import annotations

from typing import Callable

import torch

from rope.harness import profiling
from rope.harness.fused.cases import build_cache_case, build_mla_case, build_qk_norm_case
from rope.harness.fused.check import (FusedCheck, ImplementationFailed, assert_mla_rope_kv_cache, assert_qk_norm_rope,
                                      assert_rope_kv_cache, check_mla_rope_kv_cache, check_qk_norm_rope,
                                      check_rope_kv_cache, record_fused_check, run_mla_rope_kv_cache,
                                      run_qk_norm_rope, run_rope_kv_cache)
from rope.harness.stop import skip_if_stopped
from rope.harness.verdict import RAISED, Verdict, answered_two_ways, wait_for_calls
from rope.implementation import Implementation

__all__ = ["OPS", "assert_batch_matches_reference", "check_batch"]

# Per op: (build the inputs, the call, the comparison given the implementation's record, the one-case assertion).
OPS = {
    "qk_norm_rope": (build_qk_norm_case, run_qk_norm_rope,
                     lambda record: lambda case, inputs, run: check_qk_norm_rope(
                         case, inputs, run, rounded_norm=record.rounds_normalized),
                     assert_qk_norm_rope),
    "rope_kv_cache": (build_cache_case, run_rope_kv_cache,
                      lambda record: lambda case, inputs, run: check_rope_kv_cache(case, inputs, run, record),
                      assert_rope_kv_cache),
    "mla_rope_kv_cache": (build_mla_case, run_mla_rope_kv_cache,
                          lambda record: lambda case, inputs, run: check_mla_rope_kv_cache(case, inputs, run, record),
                          assert_mla_rope_kv_cache),
}


def _replay(called, returned) -> Callable:
    """A call on a second set of inputs that leaves in each of its tensors what the real call left in
    ``called``'s, and returns what the real call returned."""
    def run(inputs):
        for name, value in vars(inputs).items():
            if isinstance(value, torch.Tensor):
                value.copy_(getattr(called, name))
        return returned
    return run


def check_batch(op: str, impl_name: str, fn, cases, device: str) -> list[Verdict]:
    """A verdict per case of contract ``op``, in order: passed, failed (with the comparison's
    problems) or raised.  ValueError naming ``op`` for an unknown contract."""
    if op not in OPS:
        raise ValueError(f"op={op!r}: must be one of {tuple(OPS)}")
    build, call, comparison, _ = OPS[op]
    compare = comparison(Implementation.of(impl_name, fn, "fused"))
    cases = list(cases)
    verdicts: list[Verdict | None] = [None] * len(cases)
    called: dict[int, tuple] = {}
    with profiling.phase("inputs"):      # every case's inputs before the first call: a copy to the device waits
        built = [build(case, device) for case in cases]      # for the calls queued before it
    for index, (case, inputs) in enumerate(zip(cases, built)):
        skip_if_stopped()
        try:
            with profiling.call_phase():
                returned = call(fn, case)(inputs)
        except ImplementationFailed as exc:
            verdicts[index] = Verdict(case, RAISED, float("inf"), f"{RAISED} {exc}")
            continue
        called[index] = (inputs, returned)
    late = wait_for_calls(device, "the batch's fused calls")
    if late is not None:
        return [v if v is not None else Verdict(c, RAISED, float("inf"), late) for c, v in zip(cases, verdicts)]
    for index, (inputs, returned) in called.items():
        case = cases[index]
        with profiling.phase("compare"):
            result = compare(case, build(case, device), _replay(inputs, returned))
        verdicts[index] = (Verdict(case, "passed", 0.0, elements=case.size) if result.ok else
                           Verdict(case, "failed", float("inf"), "; ".join(result.problems), case.size))
    return verdicts


def assert_batch_matches_reference(op: str, impl_name: str, fn, cases, device: str) -> list[Verdict]:
    """:func:`check_batch` as a pytest outcome: every case passed (each recorded in the run report as
    the one-case check records it); the first case that did not pass goes to the one-case check,
    which fails with its diagnosis and case file.  Where that case alone matches, the implementation
    answered the same case two ways: an AssertionError says so."""
    verdicts = check_batch(op, impl_name, fn, cases, device)
    for v in verdicts:
        if v.passed:
            record_fused_check(impl_name, device, v.case, FusedCheck(op, v.case))
    for v in verdicts:
        if not v.passed:
            OPS[op][3](impl_name, fn, v.case, device)           # raises, reported in full
            raise answered_two_ways(impl_name, device, v, f"{op} on {v.case.brief()}", v.case.size)
    return verdicts
