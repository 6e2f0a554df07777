"""The rotation's backward checked against the float64 reference VJP (reference/rotation_grad.py),
for the project's tests: the real models' specs as cases, and the check, a function of one
implementation and one case returning a verdict (no pytest in it), as the harness will run it.

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
  others a rotated gradient;
* with ``wrt_cache``, the gradient with respect to the cos/sin cache to
  :func:`reference.cos_sin_cache_grad` under :func:`cache_grad_bound`.

A missing gradient (None), an output without an autograd graph, or a gradient past its bound makes
the verdict fail; its message names which.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from hypothesis import example

import reference
from reference.rotation import pair_indices
from rope.harness.rotation.cases import RotationCase, build_rotation_inputs, inject_nonfinite
from rope.harness.rotation.bound import SUBNORMAL_SPACING, Comparison, compare_rotation, unit_roundoff, working_dtype
from rope.implementation import Implementation
from rope.models import load_models
from rope.spec import RopeSpec

__all__ = ["BackwardVerdict", "MODEL_SPECS", "assert_backward_matches_reference", "cache_grad_bound",
           "check_rotation_backward", "model_cases", "same_bits", "with_model_examples"]


def _model_specs() -> dict[str, RopeSpec]:
    """One spec per distinct rotation of rope/models.yaml, by the first model that has it: head size,
    rotary width, pairing, sections and layout (models that differ only in their base, which moves
    the table's values and no code path, share one), its table cut to 64 rows."""
    specs: dict[str, RopeSpec] = {}
    seen = set()
    for key, model in load_models().items():
        spec = dataclasses.replace(model.spec, max_position=64)
        shape = (spec.head_size, spec.rotary_dim, spec.is_neox_style, spec.sections, spec.layout, spec.freq_rows)
        if shape not in seen:
            seen.add(shape)
            specs[key] = spec
    return specs


MODEL_SPECS = _model_specs()


def with_model_examples(dtype: str, **fields):
    """Decorate a ``@given(case=...)`` test with an ``@example`` per model spec (:func:`model_cases`)."""
    def decorate(test):
        for case in reversed(model_cases(dtype, **fields)):
            test = example(case=case)(test)
        return test
    return decorate


def model_cases(dtype: str, keys=None, **fields) -> list[RotationCase]:
    """A small case per model spec (``keys``: those models only): 5 tokens of image-grid positions, 2
    query heads and 1 key head unless ``fields`` say otherwise."""
    chosen = MODEL_SPECS if keys is None else {key: MODEL_SPECS[key] for key in keys}
    base = dict(num_tokens=5, num_q_heads=2, num_kv_heads=1, dtype=dtype, positions_kind="grid", seed=0) | fields
    return [RotationCase(spec=spec, **base) for spec in chosen.values()]


@dataclass
class BackwardVerdict:
    """The forward's and the backward's comparisons with the reference, and what else went wrong."""
    forward: Comparison
    backward: Comparison
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.forward.ok and self.backward.ok

    def message(self, header: str = "") -> str:
        lines = [header] if header else []
        lines += self.problems
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
    problems, outputs, upstream = [], [], []
    for name, out, g in (("query", out_q, g_q), ("key", out_k, g_k)):
        if out is None or g is None:
            continue
        if not out.requires_grad:
            problems.append(f"{name}: the output has no autograd graph (the implementation is not differentiable)")
            continue
        outputs.append(out)
        upstream.append(g)
    wrt = leaves + ([cache] if wrt_cache else [])
    grads = list(torch.autograd.grad(outputs, wrt, upstream, allow_unused=True) if outputs else [None] * len(wrt))
    problems += [f"grad_{name}: the backward wrote the upstream gradient it was handed (autograd may hand one "
                 f"gradient tensor to several consumers: the others then get it rotated)"
                 for name, g, p in zip(("query", "key"), handed, pristine) if not same_bits(g, p)]
    ref_dq, ref_dk = reference.rotate_grad(spec, x.positions, x.cache, *(pristine + [None])[:2])
    dq, dk = grads[0], grads[1] if x.key is not None else None
    backward = compare_rotation(spec, x.positions, pristine[0], pristine[1] if x.key is not None else None, x.cache,
                                dq, dk, ref_dq, ref_dk, precision, device=placed)
    backward.problems = [f"gradient of {problem}" for problem in backward.problems]
    if wrt_cache:
        problems += _cache_problems(spec, x, pristine, grads[-1], precision)
    return BackwardVerdict(forward, backward, problems)


def assert_backward_matches_reference(impl_name: str, impl, case: RotationCase, device: str = "cpu", *,
                                      wrt_cache: bool = False) -> None:
    """The property: :func:`check_rotation_backward`'s verdict passes, else an AssertionError with its
    message (what failed first, the case after)."""
    __tracebackhide__ = True
    verdict = check_rotation_backward(impl_name, impl, case, device, wrt_cache=wrt_cache)
    if not verdict.ok:
        raise AssertionError(verdict.message(f"{impl_name} on {device}: the backward does not match the reference "
                                             f"VJP\n{case.brief()}, seed {case.seed}"))


def _cache_problems(spec: RopeSpec, x, pristine: list, got: torch.Tensor | None, precision: str) -> list[str]:
    if got is None:
        return ["gradient of cos_sin_cache: none reached the cache (the backward returned None)"]
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
    ratio = torch.where(bound > 0, error / bound, torch.where(error == 0, 0.0, float("inf")))
    row, col = divmod(int(ratio.argmax()), got.shape[1])
    return [f"gradient of cos_sin_cache: {int(past.sum())} of {past.numel()} elements past the bound; worst "
            f"[row {row}, column {col}]: got {float(got[row, col]):.9g}, expected {float(expected[row, col]):.9g}, "
            f"bound {float(bound[row, col]):.3g}"]


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
    near 0.  Where n u_w >= 1 there is no bound.  M and n come from the reference itself: the cache gradient of |q|, |k| and |g| (their
    b channels negated for the sine's magnitudes), and of all-ones tensors (the count)."""
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
