"""The rotation's case inside guard regions, and under the interpreter's memory tracer (the primitives:
rope.harness.guards): the guarded inputs, the run, and the checks the suite's guarded properties and the
kernel mutants' searches end in.

The padding-lane bug (docs/spec.md §7.2; mutants ``cos_sin_unmasked*``): lane i >= rotary_dim/2 loads cos
at row element i and sin at element rotary_dim/2 + i.  The q/k loads and stores of those lanes
stay masked, so the values (NaN under guards) never reach the output: the reference comparison
and the NaN check are blind to it, on every device.  The tracer sees the *sin* reads: they run
past the row's end into the NaN padding, for every row (the guarded cache is row-strided), not
only the last.  It cannot see the *cos* reads, which land on the same row's valid sin half.  On
plain contiguous tensors the same sin reads land in the next cache row (valid memory) except at
the last cache row, where they leave the allocation (a wild read: reported and suppressed).  What
matters is the last cache *row* (positions == max_position - 1, any token), not the last token:
our cache is indexed by position.  compute-sanitizer on a GPU, likewise, flags only reads past an
allocation: it needs positions at the last cache row, a plain cache (a guard allocation would
keep the stray read inside it), and PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that the cache is its own
cudaMalloc rather than a slice of the caching allocator's segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rope.harness import causes
from rope.harness.case_files import wrap
from rope.harness.guards import (CACHE_ROWS_AFTER, FLOAT_FILL, GUARDED, PLAIN, Guarded, guard_tensor,
                                 trace_memory)
from rope.harness.rotation.bound import Comparison, compare_rotation
from rope.harness.rotation.cases import RotationCase, build_rotation_inputs
from rope.harness.rotation.check import (angle_source, call_rotation, compare_case, describe_case,
                                         reference_rotation, skip_if_known_defect)
from rope.harness.rotation.diagnosis import Diagnosis, diagnose
from rope.registry import working_precision


@dataclass
class GuardedRotationInputs:
    positions: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor | None
    cache: torch.Tensor
    guards: list[Guarded]


def guard_rotation_inputs(case: RotationCase, device: str = "cpu") -> GuardedRotationInputs:
    """The case's tensors (bit-identical to build_rotation_inputs) as views into guarded allocations.

    * cos_sin_cache: rows ``rotary_dim + max(8, rotary_dim/2)`` apart, NaN padding after every row,
      one NaN row before and two after the last valid row.
    * positions: ``[num_dims, T]`` rows ``T + 8`` apart (one guard row before and after) or ``[T]``
      with 8 guard elements either side; the sentinel is the number of cache rows.
    * query, key: rows ``width + head_size`` apart, one NaN row before and after; with packed qkv
      the whole ``[T, (Hq + 2 Hkv) * head_size]`` storage is one guarded allocation whose value slice
      is NaN guard too (a rotation has no business reading or writing it).
    """
    spec, hs = case.spec, case.spec.head_size
    x = build_rotation_inputs(case, "cpu")
    guards = []
    cache, g = guard_tensor("cos_sin_cache", x.cache, fill=FLOAT_FILL, writable=False, device=device,
                            row_pad=max(8, spec.rotary_dim // 2), rows_after=CACHE_ROWS_AFTER)
    guards.append(g)
    sentinel = x.cache.shape[0]
    if x.positions.dim() == 1:
        positions, g = guard_tensor("positions", x.positions, fill=sentinel, writable=False, device=device,
                                    lead=8, row_pad=8, rows_before=0, rows_after=0)
    else:
        positions, g = guard_tensor("positions", x.positions, fill=sentinel, writable=False, device=device)
    guards.append(g)
    q_width, k_width = case.num_q_heads * hs, case.num_kv_heads * hs
    if case.packed_qkv:
        invalid = ((q_width + k_width, q_width + 2 * k_width),) if k_width else ()
        storage, g = guard_tensor("qkv", x.storage, fill=FLOAT_FILL, writable=True, device=device,
                                  row_pad=hs, invalid_columns=invalid)
        guards.append(g)
        query = storage[:, :q_width]
        key = storage[:, q_width:q_width + k_width] if k_width else None
    else:
        query, g = guard_tensor("query", x.query, fill=FLOAT_FILL, writable=True, device=device, row_pad=hs)
        guards.append(g)
        key = None
        if x.key is not None:
            key, g = guard_tensor("key", x.key, fill=FLOAT_FILL, writable=True, device=device, row_pad=hs)
            guards.append(g)
    return GuardedRotationInputs(positions, query, key, cache, guards)


@dataclass
class GuardedRun:
    """``outputs, violations = run_guarded(...)`` unpacks; ``inputs`` are the guarded inputs, and
    ``traced`` says whether the tracer saw a launch (False on a GPU or for torch implementations)."""
    outputs: tuple
    violations: list[str]
    inputs: GuardedRotationInputs
    traced: bool

    def __iter__(self):
        return iter((self.outputs, self.violations))


def _nan_in_output(name: str, out: torch.Tensor | None, head_size: int) -> list[str]:
    if out is None or not out.dtype.is_floating_point:
        return []
    nan = torch.isnan(out.detach().cpu())
    count = int(nan.sum())
    if not count:
        return []
    token, col = nan.nonzero()[0].tolist()
    head, channel = divmod(col, head_size)
    return [f"{name}: NaN in output at {count} element(s), first at token {token}, head {head}, "
            f"channel {channel} (out-of-bounds read?)"]


def run_guarded(fn, case: RotationCase, device: str = "cpu") -> GuardedRun:
    """Run ``fn`` on the case inside guards (and the tracer, under the interpreter on the CPU);
    returns the outputs and every guard violation: NaN in the outputs, guards modified, and the
    traced out-of-bounds or wild accesses."""
    inputs = guard_rotation_inputs(case, device)
    with trace_memory(inputs.guards if device == "cpu" else ()) as tracer:
        q_out, k_out = call_rotation(fn, case.spec, inputs.positions, inputs.query, inputs.key, inputs.cache)
    violations = _nan_in_output("query", q_out, case.spec.head_size) + \
        _nan_in_output("key", k_out, case.spec.head_size)
    for g in inputs.guards:
        violations += g.modified()
    violations += tracer.messages()
    return GuardedRun((q_out, k_out), violations, inputs, tracer.active and tracer.launches > 0)


def compare_case_guarded(impl_name: str, fn, case: RotationCase, device: str = "cpu") -> Comparison:
    """Like rope.harness.rotation.check.compare_case, on guarded inputs: the reference comparison plus
    every guard violation as a problem."""
    return _compare_guarded(fn, case, device)[0]


def diagnose_guarded(fn, case: RotationCase, device: str = "cpu") -> Diagnosis:
    """rope.harness.rotation.diagnosis of ``fn`` on guarded inputs, guard violations included (NaN from a guard
    region, out-of-bounds reads and writes); "match" when it passes under guards."""
    result, run, ref_in = _compare_guarded(fn, case, device)
    q_out, k_out = run.outputs
    return diagnose(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache, q_out, k_out,
                    precision=working_precision(fn), comparison=result)


def _compare_guarded(fn, case: RotationCase, device: str):
    run = run_guarded(fn, case, device)
    ref_in = build_rotation_inputs(case, "cpu")
    # The reference reads only the rows the positions index: give it those (same values, and no
    # float64 copy of a 4 x 262144-row cache).
    cache = ref_in.cache[:int(ref_in.positions.max()) + 1] if case.num_tokens else ref_in.cache
    ref_q, ref_k = reference_rotation(fn, case.spec, ref_in.positions, ref_in.query, ref_in.key, cache)
    q_out, k_out = run.outputs
    result = compare_rotation(case.spec, ref_in.positions, ref_in.query, ref_in.key, cache,
                              q_out, k_out, ref_q, ref_k, working_precision(fn), device=run.inputs.query.device,
                              angles=angle_source(fn))
    result.problems += [f"guard violation: {v}" for v in run.violations]
    return result, run, ref_in


def assert_matches_reference_guarded(impl_name: str, fn, case: RotationCase, device: str = "cpu") -> Comparison:
    """Raise AssertionError when ``fn`` mismatches the reference on guarded inputs or violates a guard:
    the message and the failure's cause (rope.harness.causes) carry the diagnosis.  A run that avoids
    known defects skips a case the adapter declares it answers wrongly, as the unguarded check does."""
    skip_if_known_defect(impl_name, fn, case, device)
    result, run, ref_in = _compare_guarded(fn, case, device)
    if not result.ok:
        q_out, k_out = run.outputs
        try:
            diagnosis = diagnose(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache, q_out, k_out,
                                 precision=working_precision(fn), comparison=result)
        except Exception as exc:   # noqa: BLE001 - the mismatch is reported all the same
            diagnosis = Diagnosis("unknown", f"(diagnosis failed: {type(exc).__name__}: {exc})")
        _fail(f"{impl_name} on {device} fails under guards", case, result, diagnosis)
    return result


def _fail(header: str, case: RotationCase, result: Comparison, diagnosis: Diagnosis | None = None):
    """The AssertionError of a guarded or traced check: short lines, the diagnosis first, tagged
    with its cause for the run's grouping."""
    lines = [*(diagnosis.lines() if diagnosis else []), *result.message().splitlines(), *describe_case(case)]
    message = "\n".join([header, *(piece for line in lines for piece in wrap(line))])
    cause = diagnosis.label if diagnosis else None
    headline = diagnosis.sentence if diagnosis else None
    raise causes.tag(AssertionError(message), cause=cause, headline=headline, size=case.size, case=case.brief())


def assert_matches_reference_traced(impl_name: str, fn, case: RotationCase, device: str = "cpu") -> Comparison:
    """rope.harness.rotation.check.compare_case on plain (unguarded) inputs, inside the tracer: wild accesses
    past an argument's storage are reported (and suppressed, so a broken kernel stays harmless)."""
    with trace_memory() as tracer:
        result = compare_case(impl_name, fn, case, device)
    result.problems += [f"memory violation: {m}" for m in tracer.messages()]
    if not result.ok:
        _fail(f"{impl_name} on {device} does not match the reference (traced)", case, result)
    return result


def check_plain_and_guarded(name: str, fn, case: RotationCase) -> None:
    """The rotation property's check on plain inputs, inside the tracer (so a broken kernel stays
    memory-safe and wild accesses are reported), then the guard checker; both always run, and the
    AssertionError holds every failure, each marked with the detector that saw it (PLAIN, GUARDED)."""
    failures = []
    for tag, check in ((PLAIN, assert_matches_reference_traced), (GUARDED, assert_matches_reference_guarded)):
        try:
            check(name, fn, case, "cpu")
        except AssertionError as exc:
            failures.append(f"{tag} {exc}")
    if failures:
        raise AssertionError("\n\n".join(failures))
