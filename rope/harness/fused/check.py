"""The fused ops' check: call a fused implementation on a case (under rope.harness.deadline's call
deadline), hold what it leaves to the float64 reference (reference.fused) within the bounds
(rope.harness.fused.bound), and fail with an AssertionError tagged with its cause
(rope.harness.fused.diagnosis) after recording the check in the run report.

Contract A, QK-norm + RoPE: ``fn(spec, positions, qkv, num_heads_q, num_heads_k, num_heads_v,
q_weight, k_weight, eps, cos_sin_cache)`` writes ``qkv`` in place (and returns it): q and k within
:func:`~rope.harness.fused.bound.qk_norm_bound`, v bit for bit as it was.

Contract B, RoPE + KV-cache write: ``fn(spec, positions, query, key, value, key_cache, value_cache,
slot_mapping, cos_sin_cache, *, kv_layout, k_scale, v_scale) -> (q, k)``: q and k (the live k, every
token's) within the rotation's bound; a cache of the activations' dtype holding the live k's and v's
very bits at each written row; an FP8 cache holding value / scale within
:func:`~rope.harness.fused.bound.fp8_bound`; every row no slot names keeping its bits; v untouched.

Contract C, MLA: ``fn(spec, positions, q_pe, k_pe, kv_c, kv_cache, slot_mapping, cos_sin_cache, *,
scale) -> (q_pe, k_pe)``: q_pe and k_pe within the rotation's bound; q's channels outside q_pe and
kv_c untouched; each written latent row ``[kv_c | the live k_pe]``, bit for bit or as FP8 codes
within :func:`~rope.harness.fused.bound.fp8_bound` (kv_c's channels with no value error); every
other row keeping its bits.

An implementation of B or C may declare (rope.implementation) ``fp8_query`` (q, or q_pe, returned as
codes of the cache's FP8 dtype, q / the key's scale, held to the FP8 store's bound),
``returns_live_key = False`` (the second result is None: only the cache is held),
``skips_padding_tokens`` (a token with no slot is skipped whole: its q and k are not held) and
``scales_by_reciprocal`` (FP8 codes of x times the scale's fp32 reciprocal: one rounding more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

import reference.fused as fused_reference
from rope.fused import is_fp8, scale_float
from rope.harness import case_files, causes
from rope.harness.draws import current_test, hypothesis_example
from rope.harness.fused.bound import fp8_bound, qk_norm_bound
from rope.harness.fused.case_file import case_record
from rope.harness.fused.compare import bad_elements, bits, changed_rows, kept_rows, mismatches, rows_mask
from rope.harness.fused.diagnosis import diagnose
from rope.harness.fused.cases import (CacheCase, CacheInputs, MLACase, MLAInputs, QKNormCase, QKNormInputs,
                                      build_cache_case, build_mla_case, build_qk_norm_case)
from reference.rotation import select_cos_sin
from rope.harness.rotation.bound import compare_rotation, rotation_bound
from rope.implementation import Implementation

__all__ = ["FusedCheck", "ImplementationFailed", "assert_mla_rope_kv_cache", "assert_qk_norm_rope", "assert_rope_kv_cache",
           "bad_elements", "bits", "cache_write_problems", "changed_rows", "check_case", "check_mla_rope_kv_cache",
           "check_qk_norm_rope", "check_rope_kv_cache", "kept_rows", "mismatches", "mla_cache_write_problems",
           "qk_norm_problems", "record_fused_check", "rows_mask", "run_mla_rope_kv_cache", "run_qk_norm_rope",
           "run_rope_kv_cache"]


class ImplementationFailed(Exception):
    """The implementation raised: the test fails with what it raised, as a mismatch would."""


def _call(fn: Callable, *args, **kwargs):
    """Call under the call deadline (a hang raises ImplementationHung); whatever the implementation
    raises becomes :class:`ImplementationFailed` naming it."""
    from rope.harness.deadline import call_timeout, deadline
    with deadline(call_timeout(), what=f"the fused implementation {getattr(fn, '__name__', fn)!r}"):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:    # noqa: BLE001 - an implementation may raise anything
            raise ImplementationFailed(f"{type(exc).__name__}: {exc}") from exc


@dataclass
class FusedCheck:
    """What a check found: the problems (empty: it passed), and what the diagnosis reads."""
    op: str
    case: object
    problems: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


# ------------------------------------------------------------------------------- A: QK-norm + RoPE
def check_qk_norm_rope(case: QKNormCase, inputs: QKNormInputs, run: Callable, *,
                       rounded_norm: bool = False) -> FusedCheck:
    """Run ``run(inputs)`` (writes inputs.qkv) and hold the result to the reference.  ``rounded_norm``:
    the implementation declares it rounds the normalized value to the activation dtype before the
    rotation (``rounds_normalized = True``: an unfused sequence), one rounding more in the bound."""
    spec, d = case.spec, case.spec.head_size
    before = inputs.qkv.clone()
    ref = fused_reference.qk_norm_rope(spec, inputs.positions, before, case.num_heads_q, case.num_heads_k,
                                       case.num_heads_v, inputs.q_weight, inputs.k_weight, case.eps,
                                       inputs.cos_sin_cache)
    run(inputs)
    out = inputs.qkv
    q_end, k_end = case.num_heads_q * d, (case.num_heads_q + case.num_heads_k) * d
    result = FusedCheck("qk_norm_rope", case)
    bounds, bad = {}, {}
    for name, lo, hi, weight in (("q", 0, q_end, inputs.q_weight), ("k", q_end, k_end, inputs.k_weight)):
        normed = fused_reference.rms_norm_heads(before[:, lo:hi], weight, case.eps, d)
        bounds[name] = qk_norm_bound(spec, inputs.positions, normed, ref[:, lo:hi], inputs.cos_sin_cache, before.dtype,
                                      rounded_norm=rounded_norm)
        bad[name] = bad_elements(out[:, lo:hi], ref[:, lo:hi], bounds[name])
        result.problems += mismatches(name, out[:, lo:hi], ref[:, lo:hi], bounds[name])
    value_touched = not torch.equal(bits(out[:, k_end:].cpu()), bits(before[:, k_end:].cpu()))
    if value_touched:
        result.problems.append("v: changed (it must be left as it is)")
    result.evidence = dict(inputs=inputs, before=before, out=out.detach().cpu().clone(), ref=ref, bounds=bounds,
                           bad=bad, value_touched=value_touched)
    return result


def qk_norm_problems(case: QKNormCase, inputs: QKNormInputs, run: Callable) -> list[str]:
    """Every way ``run``'s result departs from the reference (empty: it passed)."""
    return check_qk_norm_rope(case, inputs, run).problems


def run_qk_norm_rope(fn: Callable, case: QKNormCase) -> Callable:
    """``inputs -> qkv``: contract A's call of ``fn`` on a case's inputs, under the call deadline."""
    def run(inputs):
        return _call(fn, case.spec, inputs.positions, inputs.qkv, case.num_heads_q, case.num_heads_k,
                     case.num_heads_v, inputs.q_weight, inputs.k_weight, case.eps, inputs.cos_sin_cache)
    return run


# --------------------------------------------------------------- B and C: what an implementation declares
def _declares_other_results(record: Implementation | None) -> bool:
    """Whether ``record`` returns other than the contract's (q, k): an FP8 q, no live k, or padding
    tokens skipped whole."""
    return record is not None and (record.fp8_query or not record.returns_live_key or record.skips_padding_tokens)


def _held_tokens(record: Implementation, slot_mapping: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The tokens whose q and k are held to the reference: every one, or the slotted ones where the
    implementation skips padding tokens whole."""
    if record.skips_padding_tokens:
        return fused_reference.slot_rows(slot_mapping, num_tokens)[0]
    return torch.arange(num_tokens)


def _roundings(record: Implementation | None) -> int:
    return 2 if record is not None and record.scales_by_reciprocal else 1


def _declared_results(spec, positions, cos_sin_cache, pairs, tokens: torch.Tensor, record: Implementation,
                      cache_dtype: torch.dtype, q_scale) -> tuple[list[str], dict, dict]:
    """The results of an implementation declaring other results (:func:`_declares_other_results`)
    held to the reference on ``tokens`` (every token, or the slotted ones where it skips padding):
    ``pairs`` (name, input [T, W], returned, reference [T, W], returned at all) for q then k.  Returns
    (problems, {name: bool [T, W] past the bound}, {name: float64 [T, W] rotation bound}); an FP8 q
    is held to the FP8 store's bound of the reference's q / ``q_scale``."""
    cos, sin = select_cos_sin(spec, positions[..., tokens.to(positions.device)].cpu(), cos_sin_cache.cpu())
    problems, bad, bounds = [], {}, {}
    for name, x, got, exp, returned in pairs:
        x_cpu, exp_cpu = x.detach().cpu(), exp.detach().cpu().to(torch.float64)
        bound = torch.zeros(x.shape, dtype=torch.float64)
        bound[tokens] = rotation_bound(spec, x_cpu[tokens], exp_cpu[tokens], cos, sin, x.dtype, "float32",
                                       cache_dtype=cos_sin_cache.dtype)
        bounds[name] = bound
        bad[name] = torch.zeros(x.shape, dtype=torch.bool)
        if not returned:
            continue
        if not isinstance(got, torch.Tensor):
            problems.append(f"{name}: the implementation returned {type(got).__name__}, not a tensor")
            continue
        want = cache_dtype if name == "q" and record.fp8_query else x.dtype
        if got.dtype != want:
            problems.append(f"{name}.dtype={got.dtype}: must be {want}")
            continue
        got = _shaped(got, tuple(x.shape))
        if tuple(got.shape) != tuple(x.shape):
            problems.append(f"{name}.shape={tuple(got.shape)}: must hold {tuple(x.shape)}")
            continue
        value, expected, within = got.detach().cpu().to(torch.float64)[tokens], exp_cpu[tokens], bound[tokens]
        if name == "q" and record.fp8_query:
            scale = scale_float(q_scale)
            expected = fused_reference.quantized(expected, scale, cache_dtype)
            within = fp8_bound(expected, within / scale, cache_dtype, roundings=_roundings(record))
        bad[name][tokens] = bad_elements(value, expected, within)
        problems += mismatches(name, value, expected, within)
    return problems, bad, bounds


# ------------------------------------------------------------------------------- B: RoPE + KV cache
def _cache_rows(case: CacheCase, inputs: CacheInputs, before: dict, ref, k_out, bound_k, *,
                roundings: int = 1) -> tuple[list, dict]:
    """The caches' problems: rows kept, written rows' bits (activation cache) or codes (FP8).  With
    no live k (``k_out`` None: an implementation that returns none), the key cache's written rows
    are held to the reference's rotated k within ``bound_k``."""
    spec, problems, bad = case.spec, [], {}
    tokens, slots = fused_reference.slot_rows(inputs.slot_mapping, case.num_tokens)
    heads = (-1, case.num_kv_heads, spec.head_size)
    for name, rows, bound_rows, scale in (("key_cache", k_out, bound_k, inputs.k_scale),
                                          ("value_cache", before["value"], None, inputs.v_scale)):
        cache, old = getattr(inputs, name), before[name]
        problems += kept_rows(name, old, cache, ref.written, case.layout)
        written = rows_mask(ref.written.cpu(), old, case.layout)
        if not is_fp8(cache.dtype) and rows is None:
            bound = torch.zeros(old.shape, dtype=torch.float64)
            fused_reference.scatter_rows(bound, bound_rows.cpu()[tokens].reshape(heads), slots, case.block_size,
                                         case.layout)
            found = mismatches(name, cache.cpu().to(torch.float64)[written], ref.caches[name].cpu()[written],
                               bound[written])
            bad[name] = bool(found)
            problems += found
            continue
        if not is_fp8(cache.dtype):
            # The live k's (and v's) very bits at each written row.
            image = bits(old.cpu()).clone()
            fused_reference.scatter_rows(image, bits(rows.detach().cpu())[tokens].reshape(heads), slots,
                                         case.block_size, case.layout)
            bad[name] = bool((bits(cache.cpu())[written] != image[written]).any())
            if bad[name]:
                problems.append(f"{name}: written rows differ from the live {'k' if name == 'key_cache' else 'v'}")
            continue
        scale_value = scale_float(scale)
        error = torch.zeros(old.shape, dtype=torch.float64)
        if bound_rows is not None:
            fused_reference.scatter_rows(error, (bound_rows.cpu()[tokens] / scale_value).reshape(heads), slots,
                                         case.block_size, case.layout)
        expected = ref.caches[name].cpu()
        bound = fp8_bound(expected[written], error[written], cache.dtype, roundings=roundings)
        found = mismatches(name, cache.cpu().to(torch.float64)[written], expected[written], bound)
        bad[name] = bool(found)
        problems += found
    return problems, bad


def check_rope_kv_cache(case: CacheCase, inputs: CacheInputs, run: Callable,
                        record: Implementation | None = None) -> FusedCheck:
    """Run ``run(inputs)`` (writes the caches, returns (q, k)) and hold the result to the reference;
    ``record``: what the implementation declares about its results (module docstring)."""
    spec = case.spec
    before = {name: getattr(inputs, name).clone() for name in ("query", "key", "value", "key_cache", "value_cache")}
    ref = fused_reference.rope_kv_cache(spec, inputs.positions, inputs.query, inputs.key, inputs.value,
                                        inputs.key_cache, inputs.value_cache, inputs.slot_mapping,
                                        inputs.cos_sin_cache, kv_layout=case.layout, k_scale=inputs.k_scale,
                                        v_scale=inputs.v_scale)
    returned = run(inputs)
    result = FusedCheck("rope_kv_cache", case)
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        result.problems.append(f"result: must be the pair (q, k) (got {type(returned).__name__})")
        return result
    q_out, k_out = returned
    evidence = {}
    if _declares_other_results(record):
        tokens = _held_tokens(record, inputs.slot_mapping, case.num_tokens)
        pairs = (("q", before["query"], q_out, ref.query, True), ("k", before["key"], k_out, ref.key,
                                                                  record.returns_live_key))
        problems, bad, bounds = _declared_results(spec, inputs.positions, inputs.cos_sin_cache, pairs, tokens, record,
                                                  inputs.key_cache.dtype, inputs.k_scale)
        result.problems += problems
        bound_k, k_rows, rotation = bounds["k"], (k_out if record.returns_live_key else None), None
        evidence = dict(q_bad=bad["q"], k_bad=bad["k"])
    else:
        rotation = compare_rotation(spec, inputs.positions, before["query"], before["key"], inputs.cos_sin_cache,
                                    q_out, k_out, ref.query, ref.key, "float32")
        if not rotation.ok:
            result.problems.append(rotation.message("q/k (the live k included):"))
        bound_k, k_rows = rotation.bounds.get("key"), k_out
    value_touched = not torch.equal(bits(inputs.value.cpu()), bits(before["value"].cpu()))
    if value_touched:
        result.problems.append("value: changed (it must be read only)")
    cache_problems, cache_bad = _cache_rows(case, inputs, before, ref, k_rows, bound_k, roundings=_roundings(record))
    result.problems += cache_problems
    result.evidence = dict(inputs=inputs, before=before, ref=ref, q_out=q_out, k_out=k_out, rotation=rotation,
                           value_touched=value_touched, cache_bad=cache_bad, **evidence)
    return result


def cache_write_problems(case: CacheCase, inputs: CacheInputs, run: Callable) -> list[str]:
    """Every way ``run``'s result departs from the reference (empty: it passed)."""
    return check_rope_kv_cache(case, inputs, run).problems


def run_rope_kv_cache(fn: Callable, case: CacheCase) -> Callable:
    """``inputs -> (q, k)``: contract B's call of ``fn`` on a case's inputs, under the call deadline."""
    def run(inputs):
        return _call(fn, case.spec, inputs.positions, inputs.query, inputs.key, inputs.value, inputs.key_cache,
                     inputs.value_cache, inputs.slot_mapping, inputs.cos_sin_cache, kv_layout=case.layout,
                     k_scale=inputs.k_scale, v_scale=inputs.v_scale)
    return run


# ------------------------------------------------------------------------------- C: MLA
def _shaped(t, shape):
    """``t`` as ``shape`` where it holds that many elements (else as it is: the comparison says so)."""
    return t.reshape(shape) if isinstance(t, torch.Tensor) and t.numel() == math.prod(shape) else t


def _latent_rows(case: MLACase, inputs: MLAInputs, before: dict, ref, k_out, bound_k, *,
                 roundings: int = 1) -> tuple[list, bool]:
    """The latent cache's problems: rows kept; written rows the bits of ``[kv_c | live k_pe]`` (a
    cache of the activations' dtype) or their FP8 codes within the FP8 store's bound.  With no live
    k_pe (``k_out`` None), a cache of the activations' dtype holds kv_c's bits and the reference's
    k_pe within ``bound_k``."""
    cache, old, lora = inputs.kv_cache, before["kv_cache"], case.kv_lora_rank
    problems = kept_rows("kv_cache", old, cache, ref.written, "NHD")
    tokens, slots = fused_reference.slot_rows(inputs.slot_mapping, case.num_tokens)
    written = rows_mask(ref.written.cpu(), old, "NHD")
    if not is_fp8(cache.dtype) and k_out is None:
        bound = torch.zeros(old.shape, dtype=torch.float64)
        rows = torch.zeros(case.num_tokens, lora + case.spec.head_size, dtype=torch.float64)
        rows[:, lora:] = bound_k.cpu()
        fused_reference.scatter_rows(bound, rows[tokens], slots, case.block_size)
        found = mismatches("kv_cache", cache.cpu().to(torch.float64)[written], ref.caches["kv_cache"].cpu()[written],
                           bound[written])
        return problems + found, bool(found)
    if not is_fp8(cache.dtype):
        live = torch.cat((bits(before["kv_c"].cpu()), bits(k_out.detach().cpu())), dim=1)
        image = bits(old.cpu()).clone()
        fused_reference.scatter_rows(image, live[tokens], slots, case.block_size)
        bad = bool((bits(cache.cpu())[written] != image[written]).any())
        return problems + (["kv_cache: written rows differ from [kv_c | the live k_pe]"] if bad else []), bad
    scale = inputs.scale
    scale_value = scale_float(scale)
    error = torch.zeros(old.shape, dtype=torch.float64)
    if bound_k is not None:
        rows = torch.zeros(case.num_tokens, lora + case.spec.head_size, dtype=torch.float64)
        rows[:, lora:] = bound_k.cpu() / scale_value
        fused_reference.scatter_rows(error, rows[tokens], slots, case.block_size)
    expected = ref.caches["kv_cache"].cpu()
    found = mismatches("kv_cache", cache.cpu().to(torch.float64)[written], expected[written],
                       fp8_bound(expected[written], error[written], cache.dtype, roundings=roundings))
    return problems + found, bool(found)


def check_mla_rope_kv_cache(case: MLACase, inputs: MLAInputs, run: Callable,
                            record: Implementation | None = None) -> FusedCheck:
    """Run ``run(inputs)`` (rotates, writes the latent cache, returns (q_pe, k_pe)) and hold the
    result to the reference: q_pe and k_pe within the rotation's bound, q's other channels (q_nope)
    and kv_c bit for bit as they were, the latent cache as :func:`_latent_rows`; ``record`` as
    :func:`check_rope_kv_cache`."""
    spec, t, h, r = case.spec, case.num_tokens, case.num_heads, case.spec.head_size
    before = {"q": inputs.q.clone(), "q_pe": inputs.q_pe.clone(), "k_pe": inputs.k_pe.reshape(t, r).clone(),
              "kv_c": inputs.kv_c.clone(), "kv_cache": inputs.kv_cache.clone()}
    ref = fused_reference.mla_rope_kv_cache(spec, inputs.positions, inputs.q_pe, inputs.k_pe, inputs.kv_c,
                                            inputs.kv_cache, inputs.slot_mapping, inputs.cos_sin_cache,
                                            scale=inputs.scale)
    returned = run(inputs)
    result = FusedCheck("mla_rope_kv_cache", case)
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        result.problems.append(f"result: must be the pair (q_pe, k_pe) (got {type(returned).__name__})")
        return result
    q_out, k_out = _shaped(returned[0], (t, h * r)), _shaped(returned[1], (t, r))
    k_rows = k_out if isinstance(k_out, torch.Tensor) and k_out.shape == (t, r) else before["k_pe"]
    evidence = {}
    if _declares_other_results(record):
        tokens = _held_tokens(record, inputs.slot_mapping, t)
        pairs = (("q", before["q_pe"].reshape(t, h * r), q_out, ref.query.reshape(t, h * r), True),
                 ("k", before["k_pe"], k_out, ref.key, record.returns_live_key))
        problems, bad, bounds = _declared_results(spec, inputs.positions, inputs.cos_sin_cache, pairs, tokens, record,
                                                  inputs.kv_cache.dtype, inputs.scale)
        result.problems += problems
        bound_k, rotation = bounds["k"], None
        k_rows = k_rows if record.returns_live_key else None
        evidence = dict(q_bad=bad["q"], k_bad=bad["k"])
    else:
        rotation = compare_rotation(spec, inputs.positions, before["q_pe"].reshape(t, h * r), before["k_pe"],
                                    inputs.cos_sin_cache, q_out, k_out, ref.query.reshape(t, h * r), ref.key,
                                    "float32")
        if not rotation.ok:
            result.problems.append(rotation.message("q_pe/k_pe (every token's):"))
        bound_k = rotation.bounds.get("key")
    nope = case.nope_dim
    q_nope_touched = not torch.equal(bits(inputs.q[..., :nope].cpu()), bits(before["q"][..., :nope].cpu()))
    if q_nope_touched:
        result.problems.append("q_nope: q's channels before q_pe changed (only q_pe is rotated)")
    kv_c_touched = not torch.equal(bits(inputs.kv_c.cpu()), bits(before["kv_c"].cpu()))
    if kv_c_touched:
        result.problems.append("kv_c: changed (it must be read only)")
    cache_problems, cache_bad = _latent_rows(case, inputs, before, ref, k_rows, bound_k,
                                             roundings=_roundings(record))
    result.problems += cache_problems
    result.evidence = dict(inputs=inputs, before=before, ref=ref, q_out=q_out, k_out=k_out, rotation=rotation,
                           q_nope_touched=q_nope_touched, kv_c_touched=kv_c_touched, cache_bad=cache_bad, **evidence)
    return result


def mla_cache_write_problems(case: MLACase, inputs: MLAInputs, run: Callable) -> list[str]:
    """Every way ``run``'s result departs from the reference (empty: it passed)."""
    return check_mla_rope_kv_cache(case, inputs, run).problems


def run_mla_rope_kv_cache(fn: Callable, case: MLACase) -> Callable:
    """``inputs -> (q_pe, k_pe)``: contract C's call of ``fn`` on a case's inputs, under the call deadline."""
    def run(inputs):
        return _call(fn, case.spec, inputs.positions, inputs.q_pe, inputs.k_pe, inputs.kv_c, inputs.kv_cache,
                     inputs.slot_mapping, inputs.cos_sin_cache, scale=inputs.scale)
    return run


# ------------------------------------------------------------------------------------------ assert
def record_fused_check(name: str, device: str, case, result: FusedCheck) -> None:
    """The check in the run report: one comparison per call, in the activation dtype (its worst ratio 0
    within the bounds, inf past them: the problems name the worst element); never lets reporting
    break the check."""
    from rope.harness import report
    try:
        report.record(kind="comparison", test=current_test(), impl=name, device=str(device), dtype=case.dtype,
                      variant=f"fused-{result.op}", ok=result.ok, worst_ratio=0.0 if result.ok else "inf",
                      mismatched=0 if result.ok else None, elements=case.size, problems=result.problems[:1],
                      case_file=None, heat=None, tokens=case.num_tokens)
    except Exception:   # noqa: BLE001 - the report is best effort, the check is not
        pass


def _write_case(name: str, fn: Callable, case, device, result: FusedCheck, label: str, sentence: str,
                hypothesis, failure: dict) -> list[str]:
    """Write the case file (once Hypothesis has shrunk); the lines to add to the message."""
    from rope.registry import get_fused_implementation
    try:
        implementation = case_files.implementation_path(name, fn,
                                                        resolve=lambda n: get_fused_implementation(n, result.op))
        record = case_record(implementation=implementation, fn=fn, op=result.op, case=case, device=str(device),
                             problems=result.problems, label=label, sentence=sentence, hypothesis=hypothesis)
        directory = case_files.cases_dir()
        if directory is None:
            return [f"case file: not written ({case_files.CASES_DIR_ENV} is off)"]
        shown = case_files.display_path(case_files.write_case(record, directory))
        replay = f"rope-harness repro {shown}" + (f" --fused-impl {implementation}" if ":" in implementation else "")
        failure.update(case_file=shown, replay=replay)
        return [f"case file: {shown}", f"replay: {replay}"]
    except Exception as exc:     # noqa: BLE001 - the mismatch is reported all the same
        return [f"(case file not written: {type(exc).__name__}: {exc})"]


def _fail(name: str, fn: Callable, case, device, result: FusedCheck) -> None:
    label, sentence = diagnose(result)
    lines = [f"{name} {result.op} departs from the reference on {case.brief()}", repr(case), *result.problems,
             f"diagnosis: {label}: {sentence}"]
    failure = {"cause": label, "headline": sentence, "size": case.size, "case": case.brief()}
    final, hypothesis = hypothesis_example()
    if final:
        lines += _write_case(name, fn, case, device, result, label, sentence, hypothesis, failure)
    raise causes.tag(AssertionError("\n".join(lines)), **failure)


def _checked(name: str, fn: Callable, case, device, build: Callable, check: Callable, run: Callable) -> FusedCheck:
    inputs = build(case, device)
    try:
        result = check(case, inputs, run)
    except ImplementationFailed as exc:
        raise causes.tag(AssertionError(f"{name} raised {exc}\ncase: {case!r}"), cause="raised",
                         headline=str(exc), size=case.size, case=case.brief()) from None
    record_fused_check(name, device, case, result)
    if not result.ok:
        _fail(name, fn, case, device, result)
    return result


def assert_qk_norm_rope(name: str, fn: Callable, case: QKNormCase, device: str = "cpu") -> FusedCheck:
    """Hold ``fn`` (contract A) to the reference on ``case``: an AssertionError tagged with its cause
    on any departure, the check recorded in the run report."""
    rounded = Implementation.of(name, fn, "fused").rounds_normalized

    def check(case, inputs, run):
        return check_qk_norm_rope(case, inputs, run, rounded_norm=rounded)
    return _checked(name, fn, case, device, build_qk_norm_case, check, run_qk_norm_rope(fn, case))


def assert_rope_kv_cache(name: str, fn: Callable, case: CacheCase, device: str = "cpu") -> FusedCheck:
    """Hold ``fn`` (contract B) to the reference on ``case``, as :func:`assert_qk_norm_rope`."""
    record = Implementation.of(name, fn, "fused")

    def check(case, inputs, run):
        return check_rope_kv_cache(case, inputs, run, record)
    return _checked(name, fn, case, device, build_cache_case, check, run_rope_kv_cache(fn, case))


def assert_mla_rope_kv_cache(name: str, fn: Callable, case: MLACase, device: str = "cpu") -> FusedCheck:
    """Hold ``fn`` (contract C) to the reference on ``case``, as :func:`assert_qk_norm_rope`."""
    record = Implementation.of(name, fn, "fused")

    def check(case, inputs, run):
        return check_mla_rope_kv_cache(case, inputs, run, record)
    return _checked(name, fn, case, device, build_mla_case, check, run_mla_rope_kv_cache(fn, case))


def check_case(op: str, fn: Callable, case, device: str = "cpu") -> FusedCheck:
    """The verdict of ``fn`` (contract ``op``) on ``case`` without asserting (a replay's): its
    inputs built on ``device``, the check's FusedCheck; ImplementationFailed where it raised."""
    if op == "qk_norm_rope":
        rounded = Implementation.of("", fn, "fused").rounds_normalized
        return check_qk_norm_rope(case, build_qk_norm_case(case, device), run_qk_norm_rope(fn, case),
                                  rounded_norm=rounded)
    record = Implementation.of("", fn, "fused")
    if op == "rope_kv_cache":
        return check_rope_kv_cache(case, build_cache_case(case, device), run_rope_kv_cache(fn, case), record)
    if op == "mla_rope_kv_cache":
        return check_mla_rope_kv_cache(case, build_mla_case(case, device), run_mla_rope_kv_cache(fn, case), record)
    raise ValueError(f"op={op!r}: must be qk_norm_rope, rope_kv_cache or mla_rope_kv_cache")
