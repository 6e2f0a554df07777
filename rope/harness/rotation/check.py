"""The one check every rotation property ends in: run an implementation on a case and hold it
to the float64 reference with the per-element bound (rope.harness.rotation.bound)."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

import reference
from rope.devices import synchronize
from rope.harness import case_files, causes, profiling, report
from rope.harness.deadline import ImplementationHung, call_timeout, deadline
from rope.harness.draws import current_test, hypothesis_example, skip_or_reject
from rope.harness.placement import device_label
from rope.harness.rotation.bound import Comparison, compare_rotation, passes_on_device
from rope.harness.rotation.case_file import case_id as rotation_case_id
from rope.harness.rotation.case_file import implementation_path, write_case_file
from rope.harness.rotation.cases import (DTYPES, RotationCase, RotationInputs, build_rotation_inputs,
                                         build_rotation_pair, return_lent_cache)
from rope.harness.rotation.diagnosis import Diagnosis, diagnose
from rope.harness.stop import skip_if_stopped
from rope.implementation import Implementation
from rope.registry import known_defect, unsupported_reason, working_precision


def skip_if_unsupported(impl_name: str, fn, spec, dtype: str, device: str) -> None:
    """Skip a combination the implementation does not support, with the reason.  Inside a
    Hypothesis test the draw is rejected instead, so the search goes on with the draws the
    implementation does support (a skip would end the whole test at the first unsupported draw:
    an implementation without partial rotary, say, would then hardly be tested at all)."""
    reason = unsupported_reason(impl_name, fn, spec, DTYPES[dtype], device)
    if reason:
        skip_or_reject(reason)


KNOWN_DEFECTS_ENV = "ROPE_KNOWN_DEFECTS"       # "avoid" (--rope-known-defects avoid) or "check", the default
KNOWN_DEFECT_CHOICES = ("check", "avoid")


def known_defects_mode() -> str:
    """What the run does with the adapters' declared defects (rope.registry.known_defect): ``check``
    them like every call (the default: an upstream fix shows), or ``avoid`` them (a long run that is
    to find what is not known yet: a test whose every search ends at a known defect checks nothing else)."""
    mode = os.environ.get(KNOWN_DEFECTS_ENV, "").strip() or "check"
    if mode not in KNOWN_DEFECT_CHOICES:
        raise ValueError(f"{KNOWN_DEFECTS_ENV}={mode!r}: must be one of {', '.join(KNOWN_DEFECT_CHOICES)}")
    return mode


def skip_if_known_defect(impl_name: str, fn, case: RotationCase, device: str) -> None:
    """In a run that avoids known defects, skip (or, inside Hypothesis, reject) a case the
    implementation's adapter declares it answers wrongly; the rejections are listed in the report."""
    if known_defects_mode() != "avoid":
        return
    reason = known_defect(impl_name, fn, case.spec, case.num_tokens, DTYPES[case.dtype], device,
                          num_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads)
    if reason:
        skip_or_reject(reason)


def call_rotation(fn, spec, positions, query, key, cos_sin_cache):
    """Call a rotation implementation the documented way, under the call deadline
    (rope.harness.deadline: a hang raises ImplementationHung), and wait for its device work."""
    with deadline(call_timeout(), what=f"the implementation {getattr(fn, '__name__', fn)!r}"):
        result = fn(spec, positions, query, key, cos_sin_cache)
        synchronize(query.device.type)
    return result


def run_rotation(fn, case: RotationCase, device: str):
    """Regenerate the case on ``device``, run ``fn``; returns (inputs, q_out, k_out).  What the
    implementation raises propagates (callers that contain it: :func:`contained_rotation`)."""
    inputs = build_rotation_inputs(case, device)
    q_out, k_out = call_rotation(fn, case.spec, inputs.positions, inputs.query, inputs.key, inputs.cache)
    return inputs, q_out, k_out


RAISED = "the implementation raised"


def contained_rotation(fn, case: RotationCase, device: str, *, on_hang=None, inputs: RotationInputs | None = None,
                       sync: bool = True, own_deadline: bool = True):
    """:func:`run_rotation` for an implementation that is not trusted to behave: returns (inputs,
    q_out, k_out, failure, raised_cause), where ``failure`` says what it raised, or what it returned
    instead of ``(query_out, key_out)``, and the outputs are then None; ``raised_cause``: for a raise,
    its type and the line that raised it (rope.harness.causes.crash_cause), else None.  The call runs under the call
    deadline (rope.harness.deadline): past it ``on_hang()`` runs and ImplementationHung is raised.
    ``inputs``: the case's tensors on ``device`` when the caller built them already.  ``sync=False``:
    the device is not waited for (a caller that makes many calls waits once, after the last: an error
    the device reports late is then that wait's).  ``own_deadline=False``: the caller holds one deadline
    over its many calls (arming one per call costs two signal handler swaps and the watchdog's lock)."""
    if inputs is None:
        with profiling.phase("inputs"):
            inputs = build_rotation_inputs(case, device)
    try:
        with deadline(call_timeout() if own_deadline else None, on_hang), profiling.call_phase():
            result = fn(case.spec, inputs.positions, inputs.query, inputs.key, inputs.cache)
            if sync:
                synchronize(device)
    except Exception as exc:     # noqa: BLE001 - the implementation's failure is the finding
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        failure = f"{RAISED} {type(exc).__name__}: {exc} (at {frame.filename}:{frame.lineno})"
        return inputs, None, None, failure, causes.crash_cause(exc)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        shape = f"a {len(result)}-{type(result).__name__}" if isinstance(result, (tuple, list)) else \
            f"a {type(result).__name__}"
        return inputs, None, None, f"the implementation returned {shape}: it must return (query_out, key_out)", None
    return inputs, result[0], result[1], None, None


class _HangReport:
    """The case file of a call that did not return, written by the deadline's watchdog thread
    (so it exists even when the call never comes back and the per-test timeout ends the worker)."""

    def __init__(self, impl_name: str, fn, case: RotationCase, device: str):
        self.impl_name, self.fn, self.case, self.device = impl_name, fn, case, device
        seconds = call_timeout()
        self.problem = (f"the implementation did not return within {seconds:g} s "
                        f"(the call deadline: --rope-call-timeout / $ROPE_CALL_TIMEOUT)")
        self.diagnosis = Diagnosis("wrong_output", "no output: the call did not return (a hang, or far too slow)")
        self.comparison = Comparison(case.spec, problems=[self.problem])
        self.path, self.note, self.implementation = None, None, impl_name

    def write(self) -> None:
        import sys
        try:
            self.implementation = implementation_path(self.impl_name, self.fn)
            ref_in = build_rotation_inputs(self.case, "cpu")
            run = CaseRun(ref_in, ref_in, None, None, None, None, self.comparison, failure=self.problem)
            self.path, self.note = write_case_file(self.implementation, self.fn, self.case, self.device, run,
                                                   self.diagnosis, None)
        except Exception as exc:      # noqa: BLE001 - the hang is reported all the same
            self.note = f"not written ({type(exc).__name__}: {exc})"
        _record(self.impl_name, self.case, self.device,
                CaseRun(None, None, None, None, None, None, self.comparison,
                        case_file=str(self.path) if self.path else None))
        print(f"\nrope-harness: {self.impl_name} on {self.device}: {self.problem}; case file: "
              f"{self.path or self.note}", file=sys.stderr, flush=True)

    def message(self) -> str:
        return mismatch_message(self.impl_name, self.implementation, self.case, self.device, self.comparison,
                                self.diagnosis, case_path=self.path, note=self.note)


@dataclass
class CaseRun:
    """One run of an implementation on a case: what it received and returned, the reference
    and the comparison (everything the diagnosis and the case file need)."""
    inputs: RotationInputs          # on the device, as the implementation received them
    ref_in: RotationInputs          # a fresh, untouched CPU copy (same strides)
    q_out: torch.Tensor
    k_out: torch.Tensor | None
    ref_q: torch.Tensor
    ref_k: torch.Tensor | None
    comparison: Comparison
    case_file: str | None = None    # set when a mismatch was written to reports/cases
    failure: str | None = None      # what it raised or returned instead of (query_out, key_out)
    raised_cause: str | None = None  # for a raise: its type and the line that raised it (rope.harness.causes)

    @property
    def raised(self) -> bool:
        return self.failure is not None and self.failure.startswith(RAISED)


def compare_case(impl_name: str, fn, case: RotationCase, device: str) -> Comparison:
    """Run ``fn`` on the case and compare with the reference computed from a fresh CPU copy."""
    return evaluate_case(impl_name, fn, case, device).comparison


def angle_source(fn) -> str:
    """Where ``fn`` gets its angles (its ``angles`` attribute): "cache" (the one it is handed) or
    "own-float32" (computed itself, ggml's recurrence; rope/harness/rotation/bound.py)."""
    return Implementation.of("", fn).angles


def exact_rotation(spec, positions, query, key):
    """The reference rotation at the exact float64 angles (no cache)."""
    from reference.rotation import exact_cos_sin, rotate_heads
    cos, sin = exact_cos_sin(spec, positions)
    return rotate_heads(spec, query, cos, sin), (rotate_heads(spec, key, cos, sin) if key is not None else None)


def reference_rotation(fn, spec, positions, query, key, cos_sin_cache):
    """The reference ``fn`` is held to: from the cache it was handed, or at the exact angles when
    it computes its own (:func:`angle_source`)."""
    if angle_source(fn) == "cache":
        return reference.rotate(spec, positions, query, key, cos_sin_cache)
    return exact_rotation(spec, positions, query, key)


def compares_on_device(device: torch.device) -> bool:
    """Whether a call's outputs on ``device`` are first compared there (bound.passes_on_device): on
    an accelerator, where the float64 reference and the bound of a large case cost milliseconds
    instead of the seconds one CPU thread of a suite worker takes; the CPU compares as it always has."""
    return device.type != "cpu"


def evaluate_case(impl_name: str, fn, case: RotationCase, device: str) -> CaseRun:
    """:func:`compare_case`, keeping the tensors.  A call that does not return within the call
    deadline raises ImplementationHung (after writing its case file): Hypothesis does not shrink
    through it, so the test fails on the first hang instead of waiting out one per shrink step."""
    skip_if_stopped()          # a fail-fast run ended by another worker's failure: no more examples
    causes.note_case(case.size, case.brief())
    hang = _HangReport(impl_name, fn, case, device)
    with profiling.phase("inputs"):
        # One generation: the device copy for the implementation, the CPU tensors it was copied
        # from (untouched, same strides) for the reference and the read-only checks.
        inputs, ref_in = build_rotation_pair(case, device)
    try:
        inputs, q_out, k_out, failure, raised_cause = contained_rotation(fn, case, device, on_hang=hang.write,
                                                                         inputs=inputs)
    except ImplementationHung:
        raise ImplementationHung(hang.message()) from None
    angles = angle_source(fn)
    passed = None
    if failure is None and angles == "cache" and compares_on_device(inputs.query.device):
        with profiling.phase("compare"):
            passed = passes_on_device(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache, q_out,
                                      k_out, working_precision(fn), reference.rotate)
    ref_q = ref_k = None
    if passed is not None:       # every element within its bound, seen on the outputs' device
        result = Comparison(case.spec, num_elements=passed[0], worst_ratio=passed[1])
    else:
        with profiling.phase("reference"):
            ref_q, ref_k = reference_rotation(fn, case.spec, ref_in.positions, ref_in.query, ref_in.key,
                                              ref_in.cache)
        if failure is not None:  # nothing to compare: the failure is the mismatch (and gets a case file)
            result = Comparison(case.spec, problems=[failure])
        else:
            with profiling.phase("compare"):
                result = compare_rotation(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache,
                                          q_out, k_out, ref_q, ref_k, working_precision(fn),
                                          device=inputs.query.device, angles=angles)
    with profiling.phase("checks"):
        result.problems += read_only_problems(case, inputs, ref_in)
        if failure is None:
            result.problems += in_place_problems(case, inputs, ref_in, q_out, k_out)
    return CaseRun(inputs, ref_in, q_out, k_out, ref_q, ref_k, result, failure=failure, raised_cause=raised_cause)


def read_only_problems(case: RotationCase, inputs: RotationInputs, ref_in: RotationInputs) -> list[str]:
    """What the implementation wrote that it may not: only q and k may be written (in place);
    positions, the cache and every element of q's and k's buffer outside their views (the value
    slice of a packed qkv tensor, the gaps of a strided layout: :func:`outside_view_problems`) are read-only.  The cache
    (up to 128 MiB) is compared on its own device with the table it was copied from."""
    problems = []
    if not torch.equal(inputs.positions.cpu(), ref_in.positions):
        problems.append("positions were modified by the implementation")
    if inputs.pristine_cache is not None:          # the table the cache was cloned from, on its device
        cache_kept = torch.equal(inputs.cache, inputs.pristine_cache)
    else:
        cache_kept = torch.equal(inputs.cache.cpu(), ref_in.cache)
    if not cache_kept:
        problems.append("cos_sin_cache was modified by the implementation")
    else:
        return_lent_cache(inputs)
    return problems + outside_view_problems(case, inputs, ref_in)


# The words every problem of a write outside q's and k's views carries (the diagnosis's
# wrote_outside_view rule looks for them).
OUTSIDE_VIEW = "write outside q/k"


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of the same width (NaN compares equal to the same NaN)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def outside_view_problems(case: RotationCase, inputs: RotationInputs, ref_in: RotationInputs) -> list[str]:
    """The elements of the buffer q and k live in that lie outside both views (V's heads, the gaps
    between rows: rope.harness.rotation.cases.VIEWS) and changed in the call, bit for bit."""
    if case.packed_qkv:
        width = (case.num_q_heads + case.num_kv_heads) * case.spec.head_size
        if not torch.equal(inputs.storage[:, width:].cpu(), ref_in.storage[:, width:]):
            return [f"value slice of the packed qkv tensor was modified ({OUTSIDE_VIEW})"]
        return []
    if case.view == "contiguous":
        return []
    before = ref_in.storage
    inside = torch.zeros(before.numel(), dtype=torch.bool)
    for view in (ref_in.query, ref_in.key):
        if view is not None:
            inside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
    changed = (_bits(inputs.storage.cpu()) != _bits(before)) & ~inside
    count = int(changed.sum())
    if not count:
        return []
    first = int(changed.nonzero()[0, 0])
    return [f"{count} element(s) of the buffer outside q's and k's {case.view} views were modified "
            f"({OUTSIDE_VIEW}: {_where_outside(case, ref_in, first)}, its element {first})"]


def _where_outside(case: RotationCase, x: RotationInputs, element: int) -> str:
    """Where buffer ``element`` (outside both views) lies: the gap after which row, or which V head."""
    if case.view == "heads-major":
        channel, token = divmod(element, case.num_tokens)
        channel -= (case.num_q_heads + case.num_kv_heads) * case.spec.head_size
        head, channel = divmod(channel, case.spec.head_size)
        return f"value head {head}, channel {channel}, token {token}"
    for name, view in (("query", x.query), ("key", x.key)):
        if view is None or not view.numel():
            continue
        row, column = divmod(element - view.storage_offset(), view.stride(0))
        if 0 <= row < view.shape[0] and column >= view.shape[1]:
            return f"the gap after {name} row {row}, element {column - view.shape[1]} of it"
        if row == -1 or (row == 0 and element < view.storage_offset()):
            return f"the gap before {name} row 0"
    return "the gap before the first row"


def in_place_problems(case: RotationCase, inputs: RotationInputs, ref_in: RotationInputs, q_out, k_out) -> list[str]:
    """A call on views of one strided buffer (the row-gaps, heads-major and same-buffer layouts of
    rope.harness.rotation.cases.VIEWS) is the in-place call of an engine, which reads the buffer
    afterwards, not the return value (llama.cpp#20274): each view must hold its input untouched (the
    call worked out of place) or exactly the output returned for it (it worked in place).  Anything
    else is a result written to the buffer other than the one returned, e.g. a contiguous copy-back
    into the strided view.  (Contiguous and packed-qkv cases are held to the returned outputs alone.)"""
    if case.view == "contiguous":
        return []
    problems = []
    for name, view, before, out in (("query", inputs.query, ref_in.query, q_out), ("key", inputs.key, ref_in.key, k_out)):
        if view is None or not isinstance(out, torch.Tensor) or out.shape != view.shape or out.dtype != view.dtype:
            continue         # a missing or malformed output is the comparison's to report
        now = _bits(view.cpu())
        if not (torch.equal(now, _bits(before)) or torch.equal(now, _bits(out.detach().cpu()))):
            wrong = int(((now != _bits(before)) & (now != _bits(out.detach().cpu()))).sum())
            problems.append(f"{name}'s {case.view} view holds neither its input nor the output returned "
                            f"for it after the call ({wrong} element(s) modified otherwise: an in-place result "
                            f"written elsewhere than returned)")
    return problems


def assert_matches_reference(impl_name: str, fn, case: RotationCase, device: str) -> Comparison:
    """Hold ``fn`` to the reference on ``case``.  On a mismatch the AssertionError opens with the
    implementation, device and case id, then the diagnosis, the worst elements and the command
    replaying the case file written to reports/cases (rope.harness.case_files; ROPE_CASES_DIR=off skips it).
    While Hypothesis is still searching or shrinking, only the plain report is built.  Nothing that
    goes wrong while reporting may hide the mismatch: failures become a line of the message."""
    return checked_run(impl_name, fn, case, device).comparison


def checked_run(impl_name: str, fn, case: RotationCase, device: str, *, mode: str = "eager") -> CaseRun:
    """:func:`assert_matches_reference`, returning the run (its outputs) when it passes: for a
    property that checks more of the same call than the reference does.  ``mode``: how ``fn`` calls
    the implementation (``"compile"``: under torch.compile), recorded in the case file so that its
    replay calls it the same way."""
    skip_if_known_defect(impl_name, fn, case, device)
    run = evaluate_case(impl_name, fn, case, device)                    # run and compare
    if run.comparison.ok:
        _record(impl_name, case, device, run)
        return run
    final, hypothesis = hypothesis_example()
    if not final:                 # Hypothesis still searching or shrinking: many failures, none reported
        raise AssertionError(plain_message(impl_name, case, device, run.comparison))
    failure = {"cause": run.raised_cause, "size": case.size, "case": case.brief()}
    try:
        diagnosis = diagnose_mismatch(fn, case, run)                    # failures: an 'unknown' diagnosis
        implementation = implementation_path(impl_name, fn)
        case_path, note = write_case_file(implementation, fn, case, device, run, diagnosis, hypothesis, mode=mode)
        message = mismatch_message(impl_name, implementation, case, device, run.comparison, diagnosis,
                                   case_path=case_path, note=note)
        failure.update(headline=run.failure if run.raised else diagnosis.sentence)
        failure["cause"] = failure["cause"] or diagnosis.label
        if case_path is not None:
            shown = case_files.display_path(case_path)
            failure.update(case_file=shown, replay=case_files.replay_command(shown, implementation))
    except Exception as exc:      # noqa: BLE001 - the mismatch is reported all the same
        message = (plain_message(impl_name, case, device, run.comparison)
                   + f"\n(mismatch report failed: {type(exc).__name__}: {exc})")
    _record(impl_name, case, device, run)
    raise causes.tag(AssertionError(message), **failure)


def write_mode_case_file(impl_name: str, fn, case: RotationCase, device: str, comparison: Comparison,
                         diagnosis: Diagnosis, *, mode: str, replay_tokens=()) -> list[str]:
    """For a failure seen only in ``mode`` (a graph replay, where no eager run has the outputs): the
    case file recording the case and how it was called, written in Hypothesis' final example (or
    outside Hypothesis); returns the lines to add to the failure's message (none while searching)."""
    final, hypothesis = hypothesis_example()
    if not final:
        return []
    try:
        run = CaseRun(build_rotation_inputs(case, device), build_rotation_inputs(case, "cpu"), None, None, None, None,
                      comparison)
        implementation = implementation_path(impl_name, fn)
        path, note = write_case_file(implementation, fn, case, device, run, diagnosis, hypothesis, mode=mode,
                                     replay_tokens=replay_tokens)
    except Exception as exc:      # noqa: BLE001 - the failure is reported all the same
        return [f"case file: not written ({type(exc).__name__}: {exc})"]
    if path is None:
        return [f"case file: {note}"]
    shown = case_files.display_path(path)
    return [f"case file: {shown}", f"replay: {case_files.replay_command(shown, implementation)}"]


def _record(impl_name: str, case: RotationCase, device: str, run: CaseRun) -> None:
    """One line of the run report (rope.harness.report): never lets reporting break a check."""
    try:
        with profiling.phase("record"):
            report.record_comparison(test=current_test(),
                                     impl=impl_name, device=device_label(device), dtype=case.dtype,
                                     variant=case.spec.variant(), comparison=run.comparison,
                                     case_file=run.case_file, tokens=case.num_tokens)
    except Exception:   # noqa: BLE001 - the report is best effort, the assertion is not
        pass


def diagnose_run(fn, case: RotationCase, run: CaseRun) -> Diagnosis:
    """The diagnosis of a run (rope.harness.rotation.diagnosis), from the untouched CPU inputs and the outputs."""
    x = run.ref_in
    return diagnose(case.spec, x.positions, x.query, x.key, x.cache, run.q_out, run.k_out,
                    precision=working_precision(fn), ref=(run.ref_q, run.ref_k), comparison=run.comparison,
                    angles=angle_source(fn))


def diagnose_mismatch(fn, case: RotationCase, run: CaseRun) -> Diagnosis:
    """:func:`diagnose_run`, never raising: a failure becomes an ``unknown`` diagnosis that says so."""
    try:
        return diagnose_run(fn, case, run)
    except Exception as exc:      # noqa: BLE001 - a broken diagnosis must not hide the mismatch
        return Diagnosis("unknown", f"diagnosis failed ({type(exc).__name__}: {exc})")


def plain_message(impl_name: str, case: RotationCase, device: str, comparison: Comparison) -> str:
    """The mismatch report without diagnosis or case file (while Hypothesis searches or shrinks)."""
    lines = [*comparison.message().splitlines(), *describe_case(case)]
    return "\n".join([f"{impl_name} on {device} does not match the reference",
                      *(piece for line in lines for piece in case_files.wrap(line))])


def mismatch_message(impl_name: str, implementation: str, case: RotationCase, device: str, comparison: Comparison,
                     diagnosis: Diagnosis, *, case_path: Path | None = None, note: str | None = None) -> str:
    """The AssertionError message of a final mismatch (formatting only): the implementation
    (``implementation``: its replayable path), device and case id, the diagnosis, the worst
    elements, the case, and the case file with its replay command (or ``note``: why there is none)."""
    name = impl_name if implementation == impl_name else f"{impl_name} ({implementation})"
    case_id = rotation_case_id(implementation, device, case.to_dict())
    return format_mismatch(
        header=f"{name} on {device} does not match the reference (case {case_id})",
        diagnosis=diagnosis, comparison=comparison, case=case, case_path=case_path, note=note,
        implementation=implementation)


def format_mismatch(*, header: str, diagnosis: Diagnosis, comparison, case, case_path=None,
                    note: str | None = None, implementation: str | None = None) -> str:
    """The mismatch report: header (implementation, device, case id), diagnosis, counts and
    worst elements, the case, then the case file and the command that replays it."""
    # A problem the diagnosis already states (what the implementation raised) is said once.
    said = diagnosis.sentence.split("; ")
    shown_problems = [p for p in comparison.problems if p not in said]
    lines = [header] + [piece for line in [*diagnosis.lines(), *comparison.message(problems=shown_problems).splitlines(),
                                           *describe_case(case)] for piece in case_files.wrap(line)]
    if case_path is not None:          # never wrapped: copied as they are
        shown = case_files.display_path(case_path)
        lines += [f"case file: {shown}", f"replay: {case_files.replay_command(shown, implementation)}"]
    elif note:
        lines.append(f"case file: {note}")
    return "\n".join(lines)


def describe_case(case) -> list[str]:
    """A rotation case in two short lines (the case file holds it whole)."""
    spec = case.spec
    fields = [f"head_size={spec.head_size}", f"rotary_dim={spec.rotary_dim}",
              f"is_neox_style={spec.is_neox_style}", f"sections={spec.sections}", f"layout={spec.layout}",
              f"base={spec.base:g}", f"max_position={spec.max_position}"]
    if spec.ntk_alpha is not None:
        fields.append(f"ntk_alpha={spec.ntk_alpha:g}")
    if spec.freq_rows is not None:
        fields.append(f"freq_rows={''.join(map(str, spec.freq_rows))}")
    extra = [f"positions {case.positions_kind}", f"seed {case.seed}"] + (["NaN/inf planted"] if case.nonfinite else [])
    return [f"case: {case.brief()}; {', '.join(extra)}", f"spec: {', '.join(fields)}"]
