"""The rotation's backward, for an implementation that declares ``autograd``: a function of one
implementation and one case returning a verdict (no pytest in it), and the assertion the backward
property ends in.

:func:`check_rotation_backward` builds the case's inputs, hands the implementation copies of query
and key that require a gradient (not leaves: an implementation may rotate them in place), and
differentiates its outputs with ``torch.autograd.grad`` against upstream gradients drawn from the
case's seed.  It holds

* the forward to the reference (the same comparison as the rotation suite's);
* the gradients with respect to query and key to :func:`reference.rotate_grad`, element by element
  under the rotation's own bound (rope.harness.rotation.bound.rotation_bound with the upstream gradient in
  place of the input: the backward is the forward's arithmetic with the sine negated, the same
  products of the same magnitudes), pass-through channels bit for bit;
* the upstream gradients unwritten: autograd may hand one gradient tensor to several consumers
  (an addition's two operands get the same tensor), so a backward that rotates it in place hands the
  others a rotated gradient (an implementation that declares this as a measured upstream defect,
  ``backward_defect``, is not held to it in a run that avoids known defects: its gradients are);
* with ``wrt_cache`` (an implementation that declares ``cache_grad``), the gradient with respect to
  the cos/sin cache to :func:`reference.cos_sin_cache_grad` under :func:`cache_grad_bound`.

What failed is named by one of :data:`BACKWARD_LABELS` (:meth:`BackwardVerdict.diagnosis`, the
first that applies): the forward's own diagnosis when the forward is wrong (the eager properties
name it too), ``gradient_missing`` (a None gradient, an output without an autograd graph),
``upstream_gradient_written``, ``gradient_wrong`` (past the bound; the sentence says when the
gradient is the upstream one rotated by +θ, or passed through unrotated).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import reference
from reference.rotation import pair_indices
from rope.harness import causes, report
from rope.harness.draws import current_test
from rope.harness.placement import device_label
from rope.harness.rotation.bound import (SUBNORMAL_SPACING, Comparison, compare_rotation, element_ratios,
                                         unit_roundoff, working_dtype)
from rope.harness.rotation.cases import RotationCase, build_rotation_inputs, inject_nonfinite
from rope.harness.rotation.check import known_defects_mode
from rope.harness.rotation.diagnosis import Diagnosis, diagnose
from rope.implementation import Implementation
from rope.spec import RopeSpec

__all__ = ["BACKWARD_LABELS", "BackwardVerdict", "assert_backward_matches_reference", "backward_unchecked_reason",
           "cache_grad_bound", "check_rotation_backward", "same_bits"]

# What a failed backward is (the forward's own labels come first: rope.harness.rotation.diagnosis.LABELS).
BACKWARD_LABELS = {
    "gradient_missing": "no gradient reached query, key or the cache (None returned, or an output without an "
                        "autograd graph)",
    "upstream_gradient_written": "the backward wrote the upstream gradient it was handed",
    "gradient_wrong": "a gradient past its bound against the reference VJP",
}


def backward_unchecked_reason(impl: Implementation) -> str | None:
    """Why ``impl``'s backward is not checked (None: it is): it does not declare ``autograd``."""
    if not impl.autograd:
        return (f"{impl.name or 'the implementation'} declares autograd=False: no backward to check "
                f"(declare autograd=True for a training kernel)")
    return None


@dataclass
class BackwardVerdict:
    """The forward's and the backward's comparisons with the reference, and what else went wrong:
    ``found``, (label, line) pairs of :data:`BACKWARD_LABELS`; ``hint``: what the wrong gradient of
    query and key is instead, when that is recognised; ``forward_diagnosis``: the forward's, when it
    is wrong."""
    forward: Comparison
    backward: Comparison
    found: list[tuple[str, str]] = field(default_factory=list)
    hint: str | None = None
    forward_diagnosis: Diagnosis | None = None
    avoided: str | None = None          # a declared backward defect seen and, as the run asked, not held

    @property
    def problems(self) -> list[str]:
        return [line for _, line in self.found]

    @property
    def ok(self) -> bool:
        return not self.found and self.forward.ok and self.backward.ok

    def diagnosis(self) -> Diagnosis:
        """The label and sentence of what failed first (module docstring), ``match`` when nothing did."""
        if not self.forward.ok:
            return self.forward_diagnosis or Diagnosis("unknown", "the forward does not match the reference")
        labels = [label for label, _ in self.found]
        for label in ("gradient_missing", "upstream_gradient_written"):
            if label in labels:
                return Diagnosis(label, "; ".join(line for lbl, line in self.found if lbl == label))
        if not self.backward.ok or "gradient_wrong" in labels:
            wrong = (["query and key: " + (self.hint or f"{self.backward.num_mismatched} element(s) past the bound")]
                     if not self.backward.ok else [])
            return Diagnosis("gradient_wrong", "; ".join(wrong + [line for lbl, line in self.found
                                                                  if lbl == "gradient_wrong"]))
        return Diagnosis("match", "the forward and the gradients match the reference")

    def message(self, header: str = "") -> str:
        lines = [header] if header else []
        said = []
        if not self.ok:
            diagnosis = self.diagnosis()
            lines += diagnosis.lines()
            said = diagnosis.sentence.split("; ")
        lines += [problem for problem in self.problems if problem not in said]     # each said once
        if not self.forward.ok:
            lines.append(self.forward.message("forward:"))
        if not self.backward.ok:
            lines.append(self.backward.message("gradients with respect to query and key:"))
        return "\n".join(lines)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (NaN payloads and signed zeros included)."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def _upstream(t: torch.Tensor | None, gen: torch.Generator, nonfinite: bool) -> torch.Tensor | None:
    """An upstream gradient shaped like ``t`` (standard normal, in t's dtype; NaN and infinities
    planted where the case plants them in the inputs)."""
    if t is None:
        return None
    g = torch.randn(t.shape, generator=gen).to(t.dtype)
    if nonfinite:
        inject_nonfinite(g, gen)
    return g.to(t.device)


def _differentiate(outputs, wrt, upstream, found: list) -> list:
    """torch.autograd.grad of the outputs that have a graph; a None per input when none has one."""
    kept = []
    for name, out, g in zip(("query", "key"), outputs, upstream):
        if out is None or g is None:
            continue
        if not out.requires_grad:
            found.append(("gradient_missing", f"{name}: the output has no autograd graph (the implementation is not "
                                              f"differentiable)"))
            continue
        kept.append((out, g))
    if not kept:
        return [None] * len(wrt)
    return list(torch.autograd.grad([o for o, _ in kept], wrt, [g for _, g in kept], allow_unused=True))


def check_rotation_backward(impl_name: str, impl, case: RotationCase, device: str = "cpu", *,
                            wrt_cache: bool = False) -> BackwardVerdict:
    """Differentiate ``impl`` on ``case`` and hold it to the reference (module docstring)."""
    precision = Implementation.of(impl_name, impl).working_precision
    spec, x = case.spec, build_rotation_inputs(case, device)
    gen = torch.Generator().manual_seed(case.seed ^ 0x9E3779B9)
    g_q, g_k = _upstream(x.query, gen, case.nonfinite), _upstream(x.key, gen, case.nonfinite)
    handed = [g for g in (g_q, g_k) if g is not None]
    pristine = [g.clone() for g in handed]
    leaves = [t.detach().clone().requires_grad_() for t in (x.query, x.key) if t is not None]
    cache = x.cache.detach().clone().requires_grad_() if wrt_cache else x.cache
    args = [leaf.clone() for leaf in leaves] + [None] * (2 - len(leaves))
    out_q, out_k = impl(spec, x.positions, args[0], args[1], cache)
    ref_q, ref_k = reference.rotate(spec, x.positions, x.query, x.key, x.cache)
    # The outputs must stay on the inputs' device: the torch device the inputs were built on (cuda:0),
    # not the harness's name for its kind ("cuda"), as the rotation suite compares them.
    placed = x.query.device
    forward = compare_rotation(spec, x.positions, x.query, x.key, x.cache, out_q, out_k, ref_q, ref_k, precision,
                               device=placed)
    found: list[tuple[str, str]] = []
    wrt = leaves + ([cache] if wrt_cache else [])
    grads = _differentiate((out_q, out_k), wrt, (g_q, g_k), found)
    written = [f"grad_{name}" for name, g, p in zip(("query", "key"), handed, pristine) if not same_bits(g, p)]
    declared = Implementation.of(impl_name, impl).backward_defect
    avoided = None
    if written and declared and known_defects_mode() == "avoid":
        avoided = f"{', '.join(written)} written: {declared}"     # the gradients are held all the same
    elif written:
        found.append(("upstream_gradient_written",
                      f"{', '.join(written)}: the backward wrote the upstream gradient it was handed (autograd may "
                      f"hand one gradient tensor to several consumers: the others then get it rotated)"))
    g_key = pristine[1] if x.key is not None else None
    ref_dq, ref_dk = reference.rotate_grad(spec, x.positions, x.cache, pristine[0], g_key)
    dq, dk = grads[0], grads[1] if x.key is not None else None
    backward = compare_rotation(spec, x.positions, pristine[0], g_key, x.cache, dq, dk, ref_dq, ref_dk, precision,
                                device=placed)
    backward.problems = [f"gradient of {problem}" for problem in backward.problems]
    missing = [name for name, g, wanted in (("query", dq, True), ("key", dk, x.key is not None))
               if wanted and g is None]
    if missing and not any(label == "gradient_missing" for label, _ in found):
        found.append(("gradient_missing", f"gradient of {' and '.join(missing)}: the backward returned None"))
    if wrt_cache:
        found += _cache_problems(spec, x, pristine, grads[-1], precision)
    verdict = BackwardVerdict(forward, backward, found, avoided=avoided)
    if not forward.ok:
        verdict.forward_diagnosis = _forward_diagnosis(spec, x, out_q, out_k, (ref_q, ref_k), forward, precision)
    elif not backward.ok and dq is not None:
        verdict.hint = _wrong_gradient_hint(spec, x, pristine[0], g_key, dq, dk, precision)
    return verdict


def _forward_diagnosis(spec, x, out_q, out_k, ref, forward: Comparison, precision: str) -> Diagnosis:
    """The rotation's diagnosis of a wrong forward, never raising."""
    try:
        key = x.key.cpu() if x.key is not None else None
        return diagnose(spec, x.positions.cpu(), x.query.cpu(), key, x.cache.cpu(),
                        out_q.detach() if out_q is not None else None, out_k.detach() if out_k is not None else None,
                        precision=precision, ref=ref, comparison=forward)
    except Exception as exc:      # noqa: BLE001 - a broken diagnosis must not hide the mismatch
        return Diagnosis("unknown", f"diagnosis failed ({type(exc).__name__}: {exc})")


def _wrong_gradient_hint(spec, x, g_q, g_k, dq, dk, precision: str) -> str | None:
    """What a wrong gradient of query and key is instead: the upstream gradient rotated by +θ (the
    forward's rotation, the backward's sign of the sine not flipped), or the upstream gradient itself
    (passed through unrotated: autograd never saw an in-place forward).  On the CPU; never raising."""
    try:
        positions, cache = x.positions.cpu(), x.cache.cpu()
        g_q, g_k = g_q.cpu(), (g_k.cpu() if g_k is not None else None)
        dk = dk if g_k is not None else None
        fwd_q, fwd_k = reference.rotate(spec, positions, g_q, g_k, cache)
        if compare_rotation(spec, positions, g_q, g_k, cache, dq, dk, fwd_q, fwd_k, precision).ok:
            return "the upstream gradient rotated by +θ, as the forward rotates (the backward's sine not negated)"
        as_is = [None if g is None else g.to(torch.float64) for g in (g_q, g_k)]
        if compare_rotation(spec, positions, g_q, g_k, cache, dq, dk, *as_is, precision).ok:
            return "the upstream gradient passed through unrotated (autograd did not see the rotation)"
    except Exception:     # noqa: BLE001 - a hint that fails leaves the mismatch as it is
        pass
    return None


def assert_backward_matches_reference(impl_name: str, impl, case: RotationCase, device: str = "cpu", *,
                                      wrt_cache: bool = False) -> BackwardVerdict:
    """The property: :func:`check_rotation_backward`'s verdict passes, else an AssertionError with its
    message (the diagnosis first, what failed, the case after), tagged with the diagnosis' label
    (rope.harness.causes); the backward's comparison is recorded in the run report."""
    __tracebackhide__ = True
    causes.note_case(case.size, case.brief())
    verdict = check_rotation_backward(impl_name, impl, case, device, wrt_cache=wrt_cache)
    _record(impl_name, case, device, verdict)
    if not verdict.ok:
        diagnosis = verdict.diagnosis()
        raise causes.tag(AssertionError(verdict.message(
            f"{impl_name} on {device}: the backward does not match the reference VJP\n{case.brief()}, seed "
            f"{case.seed}{', the cache differentiated too' if wrt_cache else ''}")),
            cause=diagnosis.label, headline=diagnosis.sentence, size=case.size, case=case.brief())
    return verdict


def _record(impl_name: str, case: RotationCase, device: str, verdict: BackwardVerdict) -> None:
    """The gradients' comparison as one line of the run report: never lets reporting break a check."""
    try:
        comparison = verdict.backward
        if verdict.found:
            comparison = Comparison(case.spec, comparison.num_elements, comparison.num_mismatched,
                                    comparison.worst_ratio, comparison.worst, comparison.problems + verdict.problems)
        report.record_comparison(test=current_test(), impl=impl_name, device=device_label(device), dtype=case.dtype,
                                 variant=f"{case.spec.variant()}-backward", comparison=comparison,
                                 tokens=case.num_tokens)
    except Exception:   # noqa: BLE001 - the report is best effort, the assertion is not
        pass


def _cache_problems(spec: RopeSpec, x, pristine: list, got: torch.Tensor | None,
                    precision: str) -> list[tuple[str, str]]:
    if got is None:
        return [("gradient_missing", "gradient of cos_sin_cache: none reached the cache (the backward returned None)")]
    # The reference and its bound on the CPU, where the comparison is made (the inputs may be on a GPU).
    g_q, g_k = (t.cpu() if t is not None else None for t in (pristine + [None])[:2])
    positions, query, cache = x.positions.cpu(), x.query.cpu(), x.cache.cpu()
    key = x.key.cpu() if x.key is not None else None
    expected = reference.cos_sin_cache_grad(spec, positions, query, key, cache, g_q, g_k)
    bound = cache_grad_bound(spec, positions, query, key, cache, g_q, g_k, expected, precision)
    got = got.detach().cpu().to(torch.float64)
    error = torch.where(torch.isfinite(got) & torch.isfinite(expected), (got - expected).abs(),
                        torch.where(got.isnan() & expected.isnan() | (got == expected), 0.0, float("inf")))
    past = error > bound
    if not past.any():
        return []
    ratio = element_ratios(error, bound)
    row, col = divmod(int(ratio.argmax()), got.shape[1])
    return [("gradient_wrong",
             f"gradient of cos_sin_cache: {int(past.sum())} of {past.numel()} elements past the bound; worst "
             f"[row {row}, column {col}]: got {float(got[row, col]):.9g}, expected {float(expected[row, col]):.9g}, "
             f"bound {float(bound[row, col]):.3g}")]


def cache_grad_bound(spec: RopeSpec, positions, query, key, cos_sin_cache, grad_query, grad_key,
                     expected: torch.Tensor, precision: str) -> torch.Tensor:
    """float64, shaped like the cache: the largest legitimate |computed - exact| of each element of the
    cache's gradient.

    Element cache[p, i] (cos; sin alike) gets n products summed, two per head of every token that
    reads it (``g_a a + g_b b``; the sine's ``g_b a - g_a b``).  Computed in working precision u_w, in
    any order of summation (an index_add's atomics included), each product rounds once and the sum
    of n terms n - 1 times, so (Higham, Accuracy and Stability of Numerical Algorithms, §3.1 and §4.2)

        |computed - exact| <= gamma_n M,    gamma_n = n u_w / (1 - n u_w),

    with M the sum of the terms' magnitudes (``|g_a||a| + |g_b||b|``; the sine's
    ``|g_b||a| + |g_a||b|``); then the store into the cache's dtype rounds once more, u_o |exact|
    (only when it is narrower than u_w), and the subnormal spacing of that dtype bounds what is left
    near 0.  Where n u_w >= 1 there is no bound.  M and n come from the reference itself: the cache
    gradient of |q|, |k| and |g| (their b channels negated for the sine's magnitudes), and of all-ones
    tensors (the count)."""
    out_dtype = cos_sin_cache.dtype
    u_w = unit_roundoff(working_dtype(precision, out_dtype))
    u_o = unit_roundoff(out_dtype) if u_w < unit_roundoff(out_dtype) else 0.0

    def grad_of(q, k, gq, gk):
        return reference.cos_sin_cache_grad(spec, positions, q, k, cos_sin_cache, gq, gk)

    def flip_b(t):
        if t is None:
            return None
        heads = t.to(torch.float64).abs().reshape(t.shape[0], t.shape[1] // spec.head_size, spec.head_size).clone()
        heads[..., pair_indices(spec)[1]] *= -1
        return heads.reshape(t.shape)

    def mag(t):
        return None if t is None else t.to(torch.float64).abs()

    def ones(t):
        return None if t is None else torch.ones(t.shape, dtype=torch.float64, device=t.device)

    half = spec.num_freqs
    m_cos = grad_of(mag(query), mag(key), mag(grad_query), mag(grad_key))[:, :half]
    m_sin = grad_of(flip_b(query), flip_b(key), mag(grad_query), mag(grad_key))[:, half:]
    magnitude = torch.cat((m_cos, m_sin), dim=1)
    count = grad_of(ones(query), ones(key), ones(grad_query), ones(grad_key))[:, :half].repeat(1, 2)
    nu = count * u_w
    gamma = torch.where(nu < 1, nu / (1 - nu), float("inf"))
    bound = gamma * magnitude + u_o * expected.abs() + 2 * u_w * u_o * magnitude + SUBNORMAL_SPACING[out_dtype]
    # n u_w >= 1: no bound (infinite); made of non-finite inputs (NaN): 0, so no value passes by it.
    return torch.where(bound.isnan(), 0.0, bound)
