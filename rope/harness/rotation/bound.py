"""Per-element error bounds for rotary outputs, and the comparison against the reference.

Derivation (docs/tolerance.md has the long form).  For one rotated pair (a, b) with
cos c and sin s, the exact results are

    r1 = a*c - b*s,    r2 = b*c + a*s.

The reference computes these in float64 from the *same* rounded inputs and cache the
implementation receives, so every product is exact and its only own error is one float64
rounding (2^-53 relative; negligible).  An implementation working in precision w
(unit roundoff u_w) and storing in the output dtype (unit roundoff u_o) commits, for r1:

    fl(a*c)          error <= u_w |a c|
    fl(b*s)          error <= u_w |b s|
    fl(p - q)        error <= u_w |r1| + O(u_w^2) (|a c| + |b s|)
    store (round)    error <= u_o |r1|        (only when w is wider than the output dtype)

so with M1 = |a||c| + |b||s| (M2 = |b||c| + |a||s| for r2):

    |computed - r1| <= u_w (M1 + |r1|) + u_o' |r1| + (3 u_w^2 + 2 u_w u_o') M1 + eta

where u_o' = u_o if the implementation computes wider than it stores (fp32 work, bf16/fp16
output) and 0 when the last arithmetic rounding *is* the store (activation precision), and
eta is the output dtype's subnormal spacing (absolute floor near zero).  A correct fp32
kernel writing bf16 is thus held to half an ulp of the exact result plus ~2^-24 relative:
round-to-nearest-even, nothing looser.  Pass-through channels (>= rotary_dim) get bound 0:
they must be bit-exact.  An FMA-contracted kernel (fma(a, c, -fl(b*s))) stays inside.

Fixed atol/rtol pairs are not used: they either hide systematic 1-ulp errors (truncating
stores) or fail correct kernels on cancellation.

An implementation that computes its own angles instead of reading the cache (llama.cpp's ggml:
``theta = p``, then ``theta *= theta_scale`` once per pair, ``theta_scale = powf(base, -2/d)``, all
float32, then ``cosf`` / ``sinf``) is compared with the exact float64 angles, and its bound gains
the error of its angles: pair i's angle carries i float32 products and i powers of a float32
``theta_scale`` (relative error <= 2 u_32 for ``powf``), so
``|theta_computed - theta| <= (3i + 2) u_32 |theta|`` (0 for a pair whose frequency is exactly 1:
its angle is the position, exact in float32), and ``cosf`` / ``sinf`` add at most 2 u_32.
A rotated output moves by at most ``(|a| + |b|)`` times the angle error (:func:`own_angle_error`).
The term grows with the position: at p = 4096 it allows ~2e-3 |x| at the worst pair, still far
below what a wrong row, pairing or map does (an O(1) angle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference.rotation import (exact_angles, exact_attention_factor, exact_cos_sin, exact_frequencies,
                                pair_indices, select_cos_sin)
from rope.spec import RopeSpec

UNIT_ROUNDOFF = {
    torch.float64: 2.0 ** -53,
    torch.float32: 2.0 ** -24,
    torch.float16: 2.0 ** -11,
    torch.bfloat16: 2.0 ** -8,
}
SUBNORMAL_SPACING = {
    torch.float64: 2.0 ** -1074,
    torch.float32: 2.0 ** -149,
    torch.float16: 2.0 ** -24,
    torch.bfloat16: 2.0 ** -133,
}


def unit_roundoff(dtype: torch.dtype) -> float:
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype={dtype}: no unit roundoff known (supported: {list(UNIT_ROUNDOFF)})")
    return UNIT_ROUNDOFF[dtype]


def working_dtype(precision: str, activation_dtype: torch.dtype) -> torch.dtype:
    if precision == "float32":
        return torch.float32
    if precision == "activation":
        return activation_dtype
    raise ValueError(f"working_precision={precision!r}: must be 'float32' or 'activation'")


# How an implementation gets its angles (its ``angles`` attribute): from the cache it is handed
# (every implementation but one), or computed itself in float32 by ggml's recurrence.
ANGLE_SOURCES = ("cache", "own-float32")


def own_angle_error(spec: RopeSpec, positions: torch.Tensor) -> torch.Tensor:
    """float64 [T, rotary_dim/2]: the bound on |computed - exact| of an angle (and of its cos and
    sin) for an implementation that computes its angles in float32 (module docstring).  A pair whose
    frequency is exactly 1 (pair 0 of a plain spec, of YaRN's and llama3's unscaled high
    frequencies) has an exact float32 angle, the position itself (below 2^24): its only error is
    cosf's and sinf's own, so a sin of an unreduced argument (fast-math ``__sinf``: 1e-2 off at
    131,071) fails there.  A scaled spec's attention factor m, applied in float32, adds u m."""
    u = UNIT_ROUNDOFF[torch.float32]
    i = torch.arange(spec.num_freqs, dtype=torch.float64)
    coefficient = torch.where(exact_frequencies(spec) == 1.0, 0.0, 3 * i + 2)
    m = exact_attention_factor(spec)
    return exact_angles(spec, positions).abs() * coefficient * u + (2 * u * m + (u * m if m != 1.0 else 0.0))


def _undetermined_sign(spec: RopeSpec, cos: torch.Tensor, sin: torch.Tensor, angle_error: torch.Tensor,
                       shape) -> torch.Tensor:
    """bool [T, H * head_size]: the rotated channels of a pair whose cos or sin is within the angle
    error of 0 (pass-through channels: False)."""
    near_zero = (cos.abs() <= angle_error) | (sin.abs() <= angle_error)          # [T, F]
    num_tokens = shape[0]
    out = torch.zeros(num_tokens, shape[1] // spec.head_size, spec.head_size, dtype=torch.bool)
    a_idx, b_idx = pair_indices(spec)
    out[..., a_idx] = near_zero[:, None, :]
    out[..., b_idx] = near_zero[:, None, :]
    return out.reshape(shape)


def pair_slices(spec: RopeSpec) -> tuple[slice, slice]:
    """reference.rotation.pair_indices as slices of the channel axis: NeoX's two halves, GPT-J's even
    and odd channels (the same channels; a slice is a view where an index tensor gathers a copy)."""
    half = spec.num_freqs
    if spec.is_neox_style:
        return slice(0, half), slice(half, 2 * half)
    return slice(0, 2 * half, 2), slice(1, 2 * half, 2)


def rotation_bound(spec: RopeSpec, x: torch.Tensor, ref_out: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, out_dtype: torch.dtype, precision: str,
                   angle_error: torch.Tensor | None = None, cache_dtype: torch.dtype | None = None) -> torch.Tensor:
    """float64 [T, H * head_size]: the largest legitimate |computed - ref_out| per element.
    ``angle_error`` [T, rotary_dim/2]: an implementation's own angle error (:func:`own_angle_error`).
    ``cache_dtype``: the dtype of the cache it was handed; where that is wider than the working
    dtype (an fp32 table beside bf16 activations, worked on in bf16), cos and sin are rounded to the
    working dtype before the products: each product gains one more rounding, ``u_w |a c|``."""
    work = working_dtype(precision, out_dtype)
    u_w = unit_roundoff(work)
    u_c = u_w if cache_dtype is not None and unit_roundoff(cache_dtype) < u_w else 0.0
    u_o = unit_roundoff(out_dtype) if u_w < unit_roundoff(out_dtype) else 0.0
    eta = SUBNORMAL_SPACING[out_dtype]

    num_tokens = x.shape[0]
    heads = x.to(torch.float64).reshape(num_tokens, x.shape[1] // spec.head_size, spec.head_size).abs()
    ref = ref_out.reshape(heads.shape).abs()
    a_idx, b_idx = pair_slices(spec)          # views: no gather of a, b and r, no scatter of the bound
    a, b = heads[..., a_idx], heads[..., b_idx]
    c, s = cos.abs()[:, None, :], sin.abs()[:, None, :]
    bound = torch.zeros_like(heads)   # pass-through channels: exact
    angle = 0.0 if angle_error is None else (a + b) * angle_error[:, None, :]
    for idx, mag in ((a_idx, a * c + b * s), (b_idx, b * c + a * s)):
        r = ref[..., idx]
        bound[..., idx] = (u_w * (mag + r) + u_o * r + (3 * u_w * u_w + 2 * u_w * u_o) * mag + eta + angle
                           + u_c * (1 + 2 * u_w + u_o) * mag)
    return bound.reshape(x.shape)


@dataclass
class Mismatch:
    """One element of a comparison, located in the head/channel grid."""
    tensor: str
    token: int
    head: int
    channel: int
    got: float
    expected: float
    error: float
    bound: float

    @property
    def ratio(self) -> float:
        return ratio_of(self.error, self.bound)

    def describe(self, spec: RopeSpec) -> str:
        if self.channel >= spec.rotary_dim:
            where = "pass-through"
        elif spec.is_neox_style:
            half = spec.num_freqs
            where = f"freq {self.channel % half} member {'a' if self.channel < half else 'b'}"
        else:
            where = f"freq {self.channel // 2} member {'ab'[self.channel % 2]}"
        return (f"{self.tensor}[token {self.token}, head {self.head}, channel {self.channel}] ({where}): "
                f"got {self.got:.9g}, expected {self.expected:.9g}, error {self.error:.3g}, "
                f"bound {self.bound:.3g}, error/bound {self.ratio:.3g}")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("tensor", "token", "head", "channel", "got", "expected", "error", "bound")}


def ratio_of(error: float, bound: float) -> float:
    if error != error:
        return float("inf")
    if bound > 0:
        return error / bound
    return 0.0 if error == 0 else float("inf")


@dataclass
class Comparison:
    """Outcome of comparing an implementation's outputs with the reference."""
    spec: RopeSpec
    num_elements: int = 0
    num_mismatched: int = 0
    worst_ratio: float = 0.0
    worst: list[Mismatch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # dtype/shape/None errors
    errors: dict = field(default_factory=dict)          # tensor name -> float64 error tensor
    bounds: dict = field(default_factory=dict)          # tensor name -> float64 bound tensor

    @property
    def ok(self) -> bool:
        return not self.problems and self.num_mismatched == 0

    def message(self, header: str = "", *, problems: list[str] | None = None) -> str:
        """The header, the problems (``problems``: the ones to show, default all), the counts and
        the worst elements."""
        lines = [header] if header else []
        lines += self.problems if problems is None else problems
        if self.num_mismatched:
            share = self.num_mismatched / max(1, self.num_elements)
            lines.append(f"Mismatched elements: {self.num_mismatched} / {self.num_elements} ({share:.1%})")
        lines.append(f"Worst error/bound: {self.worst_ratio:.3g}")
        lines += ["  " + m.describe(self.spec) for m in self.worst]
        return "\n".join(lines)


def element_ratios(err: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """error / bound per element: 0 where both are 0, infinite where the bound is 0 and the error is not
    (a pass-through channel changed, a non-finite value mismatched)."""
    return torch.where(bound > 0, err / bound, torch.where(err == 0, 0.0, float("inf")))


def element_errors(spec: RopeSpec, x: torch.Tensor, got: torch.Tensor, exp: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, precision: str, angle_error: torch.Tensor | None = None,
                   cache_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (|got - exp|, bound) per element of ``x`` [T, H * head_size] (any device): the error an
    implementation made and the most :func:`rotation_bound` allows it, non-finite values matched."""
    bound = rotation_bound(spec, x, exp, cos, sin, x.dtype, precision, angle_error, cache_dtype)
    if exp.device.type == "cpu" and bool(torch.isfinite(exp).all()) and bool(torch.isfinite(got).all()):
        # Every value finite (nearly every comparison): the error is |got - exp| and the bound is
        # finite where its inputs are (the same tensors as below, without its masks; on a GPU the
        # tests' reads would be host syncs, so there the masks run).
        return (got - exp).abs(), torch.where(torch.isfinite(bound), bound, torch.zeros_like(bound))
    # Non-finite values match exactly: NaN where the reference has NaN, the same infinity where it
    # has one, finite elsewhere; any other pairing is an infinite error.  The bound of such an
    # element (made of non-finite inputs) is 0, so a NaN bound can never pass a wrong value.
    finite = torch.isfinite(exp) & torch.isfinite(got)
    same_nonfinite = (torch.isnan(exp) & torch.isnan(got)) | (torch.isinf(exp) & (got == exp))
    if angle_error is not None:
        # Own angles: where a cos or sin is within the angle error of 0 its sign is not
        # determined, nor the sign of an infinity it multiplies (inf - inf may turn ±inf):
        # there any non-finite value answers a non-finite reference.
        undetermined = _undetermined_sign(spec, cos, sin, angle_error, x.shape)
        same_nonfinite |= ~torch.isfinite(exp) & ~torch.isfinite(got) & undetermined
    err = torch.where(finite, (got - exp).abs(),
                      torch.where(same_nonfinite, torch.zeros_like(exp), torch.full_like(exp, float("inf"))))
    return err, torch.where(torch.isfinite(bound), bound, torch.zeros_like(bound))


def compare_rotation(spec: RopeSpec, positions, query, key, cos_sin_cache, out_q, out_k, ref_q, ref_k,
                     precision: str = "float32", *, device=None, keep: int = 5, angles: str = "cache") -> Comparison:
    """Compare an implementation's (out_q, out_k) with the reference's (ref_q, ref_k).

    ``query``/``key`` are the unrotated inputs (any device; everything is compared on the CPU);
    ``device``, when given, is where the outputs must live (the device the implementation ran on).
    ``angles="own-float32"``: the implementation computes its own angles (the reference then used
    the exact ones, ``reference.rotation.exact_cos_sin``) and the bound carries their error.
    """
    if angles not in ANGLE_SOURCES:
        raise ValueError(f"angles={angles!r}: must be one of {ANGLE_SOURCES}")
    result = Comparison(spec)
    cpu = torch.device("cpu")
    angle_error = None
    if angles == "cache":
        cos, sin = select_cos_sin(spec, positions.to(cpu), cos_sin_cache.to(cpu))
    else:
        cos, sin = exact_cos_sin(spec, positions.to(cpu))
        angle_error = own_angle_error(spec, positions.to(cpu))
    pairs = [("query", query, out_q, ref_q)]
    if key is not None or out_k is not None:
        pairs.append(("key", key, out_k, ref_k))
    compared = []              # (name, x, got, exp) of each tensor whose shape allows a comparison
    for name, x, out, ref in pairs:
        if x is None:
            result.problems.append(f"{name}: the input key is None but the implementation returned a tensor")
            continue
        if out is None:
            result.problems.append(f"{name}: the implementation returned None")
            continue
        if out.dtype != x.dtype:
            result.problems.append(f"{name}.dtype={out.dtype}: must equal the input dtype {x.dtype}")
        if tuple(out.shape) != tuple(x.shape):
            result.problems.append(f"{name}.shape={tuple(out.shape)}: must equal the input shape {tuple(x.shape)}")
            continue
        if device is not None and out.device != torch.device(device):
            result.problems.append(f"{name}.device={out.device}: must equal the input device {device}")
        compared.append((name, x.to(cpu), out.detach().to(cpu, torch.float64), ref.detach().to(cpu, torch.float64)))
    if not compared:
        return result
    # q and k side by side, [T, (Hq + Hk) * head_size]: one pass of the bound and the error over
    # both (each is per element: a head's bound reads only its own pair and its token's cos/sin).
    widths = [x.shape[1] for _, x, _, _ in compared]
    x, got, exp = (torch.cat([c[i] for c in compared], dim=1) if len(compared) > 1 else compared[0][i]
                   for i in (1, 2, 3))
    err, bound = element_errors(spec, x, got, exp, cos, sin, precision, angle_error,
                                cos_sin_cache.dtype if angles == "cache" else None)
    start = 0
    for (name, *_), width in zip(compared, widths):
        result.errors[name], result.bounds[name] = err[:, start:start + width], bound[:, start:start + width]
        start += width
    result.num_elements = err.numel()
    if err.numel() == 0:
        return result
    ratio = element_ratios(err, bound)
    mismatched = err > bound
    result.num_mismatched = int(mismatched.sum())
    if not result.num_mismatched:      # a pass (nearly every example of a search): its worst ratio is all it reports
        result.worst_ratio = float(ratio.max())
        return result
    candidates: list[Mismatch] = []
    # The worst ``keep`` elements of each tensor with a mismatch (by its own elements' ratios).
    start = 0
    for (name, *_), width in zip(compared, widths):
        flat = ratio[:, start:start + width].flatten()
        if not bool(mismatched[:, start:start + width].any()):
            start += width
            continue
        for i in torch.topk(flat, min(keep, flat.numel())).indices.tolist():
            token, col = divmod(i, width)
            head, channel = divmod(col, spec.head_size)
            candidates.append(Mismatch(name, token, head, channel, float(got[token, start + col]),
                                       float(exp[token, start + col]), float(err[token, start + col]),
                                       float(bound[token, start + col])))
        start += width
    candidates.sort(key=lambda m: m.ratio, reverse=True)
    result.worst = [m for m in candidates[:keep] if m.ratio > 0]
    result.worst_ratio = candidates[0].ratio if candidates else 0.0
    return result


# Elements (q and k side by side) per slice of tokens in :func:`passes_on_device`: a slice's float64
# temporaries (input, output, reference, cos/sin, bound, error: about ten of them) stay near 1 GiB,
# so 16 workers sharing one GPU never hold a 16,384-token case's several GiB at once.
DEVICE_SLICE_ELEMENTS = 1 << 23


def passes_on_device(spec: RopeSpec, positions, query, key, cos_sin_cache, out_q, out_k, precision: str,
                     reference_fn, *, slice_elements: int = DEVICE_SLICE_ELEMENTS) -> tuple[int, float] | None:
    """:func:`compare_rotation`'s verdict of a call whose every element is within its bound,
    computed where the outputs are (a GPU: the float64 reference, cos/sin, the bound and the error of
    a 16,384-token case take milliseconds there and many seconds on one CPU thread), a slice of tokens
    at a time, with one wait at the end: ``(elements compared, worst error/bound)``.

    None where it cannot say "passed": an element past its bound, an output that is not a tensor of
    the input's dtype, shape and device, or a key returned for none.  The caller then runs
    :func:`compare_rotation` on the CPU, which explains the failure (the worst elements, the
    per-element errors the diagnosis reads), so the device never decides a failure's report.

    ``query``/``key``/``positions``/``cos_sin_cache``: the untouched inputs (any device);
    ``reference_fn(spec, positions, query, key, cache)``: the float64 reference the implementation
    is held to, from the cache it was handed (angles computed by the implementation itself are
    compared on the CPU).  Every step is elementwise or a gather, the same float64 operations as on
    the CPU, so the worst ratio is the CPU's to the bit (tests/harness/test_device_compare.py)."""
    device = out_q.device if isinstance(out_q, torch.Tensor) else None
    pairs = [(query, out_q)] + ([(key, out_k)] if key is not None or out_k is not None else [])
    for x, out in pairs:
        if (x is None or not isinstance(out, torch.Tensor) or out.dtype != x.dtype
                or tuple(out.shape) != tuple(x.shape) or out.device != device):
            return None
    width = sum(x.shape[1] for x, _ in pairs)
    num_tokens = query.shape[0]
    if num_tokens == 0 or width == 0:
        return 0, 0.0
    rows_per_slice = max(1, slice_elements // width)
    table = cos_sin_cache.to(device)
    positions = positions.to(device)
    worst = torch.zeros((), dtype=torch.float64, device=device)
    past = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, num_tokens, rows_per_slice):
        rows = slice(start, start + rows_per_slice)
        p = positions[..., rows]
        xs = [x[rows].to(device) for x, _ in pairs]
        refs = reference_fn(spec, p, xs[0], xs[1] if len(xs) > 1 else None, table)
        x = torch.cat(xs, dim=1) if len(xs) > 1 else xs[0]
        got = torch.cat([out[rows].detach().to(torch.float64) for _, out in pairs], dim=1)
        exp = torch.cat([r.to(torch.float64) for r in refs[:len(xs)]], dim=1)
        cos, sin = select_cos_sin(spec, p, table)
        err, bound = element_errors(spec, x, got, exp, cos, sin, precision, None, table.dtype)
        ratio = element_ratios(err, bound)
        worst = torch.maximum(worst, ratio.max())
        past += (err > bound).sum()
    if int(past):              # the one wait
        return None
    return num_tokens * width, float(worst)
