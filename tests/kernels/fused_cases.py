"""Cases, strategies and per-element bounds for the fused-op kernels' tests (test_fused_qk_norm_rope.py,
test_rope_kv_cache.py): a case is drawn as a description and built into tensors from its seed; the
kernels' outputs are held to the float64 references (reference/fused.py) element by element.

The bounds follow docs/tolerance.md's derivation (rope/harness/rotation/bound.py: ``rotation_bound``) and
docs/spec.md, "Fused ops":

* QK-norm (working precision fp32, u = 2^-24): the normalized value y_j = x_j w_j / sqrt(S/D + eps)
  of an fp32 implementation is within eps_y |y_j| of the exact one, eps_y = ((D + 1)/2 + 6) u: the
  square sum of D terms in any order ((D - 1) u; the squares of bf16/fp16 values are exact in fp32),
  the mean, + eps and the root (halved under the root: (D + 1)/2 u), the reciprocal, an rsqrt of up to
  2 ulp, and the two products.  A rotated channel then carries eps_y (|y_a||c| + |y_b||s|) besides the
  rotation's own rounding; a pass-through channel eps_y |y_j| and the store's rounding.
* FP8 store: the code of fl32(x / scale), x the implementation's rounded value, within half the FP8
  spacing at |expected| + delta, plus delta, of the reference's value / scale, where delta bounds the
  implementation's value error over the scale plus the fp32 division's rounding.  Saturation is
  1-Lipschitz, so the reference's clamped quotient is held to the same bound.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from rope.cache import attention_factor, cos_sin_cache, inv_freq
from rope.fused import is_fp8
from rope.harness.rotation.cases import make_positions
from rope.models import load_models
from rope.harness.rotation.bound import SUBNORMAL_SPACING, UNIT_ROUNDOFF, rotation_bound
from reference.rotation import pair_indices, select_cos_sin
from rope.spec import RopeSpec

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CACHE_KINDS = ("activation", "float8_e4m3fn", "float8_e5m2")
BLOCK_SIZES = (16, 32, 64, 128, 256)
SCALES = (0.05, 0.3, 2.5, 7.0)          # never 1: divide and multiply must differ
U32 = UNIT_ROUNDOFF[torch.float32]
# FP8: (mantissa bits, smallest normal exponent).
_FP8_FORMAT = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}


FULL_TABLE_ROWS = 1 << 15


@functools.lru_cache(maxsize=8)
def _full_table(spec: RopeSpec, dtype: torch.dtype) -> torch.Tensor:
    return cos_sin_cache(spec, dtype)


def table(spec: RopeSpec, dtype: torch.dtype, positions: torch.Tensor) -> torch.Tensor:
    """The spec's cos/sin cache in ``dtype``.  Past FULL_TABLE_ROWS rows only the rows ``positions``
    select (and row 0) hold cos | sin, as rope.cache computes them (the same float32 products); every
    other row is NaN, so a read of a wrong row shows, and building it costs no trigonometry."""
    if spec.max_position <= FULL_TABLE_ROWS:
        return _full_table(spec, dtype)
    rows = torch.unique(torch.cat((positions.flatten().cpu().long(), torch.zeros(1, dtype=torch.long))))
    out = torch.full((spec.max_position, spec.rotary_dim), float("nan"), dtype=dtype)
    freqs = torch.outer(rows.to(torch.float32), inv_freq(spec))
    cos, sin, scale = freqs.cos(), freqs.sin(), attention_factor(spec)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    out[rows] = torch.cat((cos, sin), dim=-1).to(dtype)
    return out


def model_spec(name: str, max_rows: int = 1 << 17) -> RopeSpec:
    """A catalogued model's spec (rope/models.yaml) with its cache cut to ``max_rows`` rows (the
    M-RoPE caches of 4 x max_position_embeddings reach 2^20 rows: 256 MB of bf16 per table)."""
    spec = load_models()[name].spec
    return dataclasses.replace(spec, max_position=min(spec.max_position, max_rows))


def head_magnitudes(num_tokens: int, num_heads: int, gen: torch.Generator) -> torch.Tensor:
    """[T, H, 1] per-head scales: mostly 1, some 1e-3 (a mean square near eps: an implementation
    that drops eps shows) and some 30."""
    pick = torch.randint(0, 6, (num_tokens, num_heads, 1), generator=gen)
    return torch.where(pick == 0, 1e-3, torch.where(pick == 1, 30.0, 1.0))


def weights(head_size: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """An RMSNorm weight in [0.25, 2): never uniform, so a norm applied after the rotation (which
    moves channels between weights) shows."""
    return (0.25 + 1.75 * torch.rand(head_size, generator=gen)).to(dtype)


# ------------------------------------------------------------------------------------------ bounds
def qk_norm_bound(spec: RopeSpec, positions, normed: torch.Tensor, ref: torch.Tensor, cos_sin: torch.Tensor,
                  dtype: torch.dtype, *, rounded_norm: bool = False) -> torch.Tensor:
    """float64 [T, H * D]: the bound of an fp32 implementation's q (or k) against the reference
    ``ref``, given the exact normalized, unrotated heads ``normed`` (reference.fused.rms_norm_heads).
    ``rounded_norm``: the implementation rounds the normalized value to ``dtype`` before rotating it
    (one rounding more: u_o |y| on top of eps_y)."""
    d = spec.head_size
    u_o = UNIT_ROUNDOFF[dtype] if dtype != torch.float32 else 0.0
    eps_y = ((d + 1) / 2 + 6) * U32 + (u_o * (1 + U32) if rounded_norm else 0.0)
    eta = SUBNORMAL_SPACING[dtype]
    cos, sin = select_cos_sin(spec, positions.cpu(), cos_sin.cpu())
    y = normed.cpu()
    num_tokens = y.shape[0]
    heads = y.abs().reshape(num_tokens, -1, d)
    out = ref.cpu().abs().reshape(heads.shape)
    bound = (eps_y * (1 + u_o) + u_o) * heads + eta                 # pass-through channels
    a_idx, b_idx = pair_indices(spec)
    a, b = heads[..., a_idx], heads[..., b_idx]
    c, s = cos.abs()[:, None, :], sin.abs()[:, None, :]
    for idx, mag in ((a_idx, a * c + b * s), (b_idx, b * c + a * s)):
        r = out[..., idx]
        bound[..., idx] = (eps_y + U32) * (1 + u_o) * mag + (U32 + u_o) * r + 3 * U32 * U32 * mag + eta
    return bound.reshape(y.shape)


def fp8_half_spacing(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the spacing of ``dtype``'s values at each float64 magnitude (the subnormal spacing below
    the smallest normal): the largest error of a round-to-nearest store."""
    mant, emin = _FP8_FORMAT[dtype]
    exponent = torch.floor(torch.log2(magnitude.clamp_min(2.0 ** emin))).clamp_min(emin)
    return torch.pow(2.0, exponent - mant - 1)


def fp8_bound(expected: torch.Tensor, value_error: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bound of a stored FP8 code (decoded) against ``expected`` = value / scale, saturated, when
    the value the implementation quantizes may be off by ``value_error`` / scale already (both float64,
    in the stored units; the fp32 division's rounding is added here)."""
    delta = value_error + U32 * (expected.abs() + value_error)
    return fp8_half_spacing(expected.abs() + delta, dtype) + delta


# ------------------------------------------------------------------------------------------ checks
def mismatches(name: str, got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> list[str]:
    """The problems of ``got`` against ``expected`` within ``bound`` (all float64-comparable): empty
    when every element is within; else the count and the worst element, index included."""
    got = got.detach().cpu().to(torch.float64)
    expected = expected.detach().cpu().to(torch.float64)
    err = torch.where(torch.isnan(got) & torch.isnan(expected), 0.0, (got - expected).abs())
    err = torch.where(torch.isnan(err), float("inf"), err)
    bad = err > bound.cpu()
    if not bool(bad.any()):
        return []
    ratio = torch.where(bound.cpu() > 0, err / bound.cpu(), float("inf"))
    worst = int(torch.argmax(torch.where(bad, ratio, -1.0)))
    index, rest = [], worst
    for size in reversed(got.shape):
        rest, i = divmod(rest, size)
        index.insert(0, i)
    index = tuple(index)
    return [f"{name}: {int(bad.sum())} of {got.numel()} elements past the bound; worst at {index}: got "
            f"{float(got.flatten()[worst]):.9g}, expected {float(expected.flatten()[worst]):.9g}, bound "
            f"{float(bound.cpu().flatten()[worst]):.3g}"]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The storage bits of ``t`` as an integer tensor of its shape (NaN payloads and -0 compared too)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def rows_mask(written: torch.Tensor, cache: torch.Tensor, layout: str) -> torch.Tensor:
    """bool, the cache's shape: the elements of the rows ``written`` [num_blocks, block_size] marks."""
    if cache.dim() == 3:                                    # MLA latent cache [blocks, block_size, width]
        return written[:, :, None].expand(cache.shape)
    if layout == "HND":
        return written[:, None, :, None].expand(cache.shape)
    return written[:, :, None, None].expand(cache.shape)


def kept_rows(name: str, before: torch.Tensor, after: torch.Tensor, written: torch.Tensor, layout: str) -> list[str]:
    """Every row the call does not write keeps its bits (stale contents survive)."""
    keep = ~rows_mask(written.cpu(), before, layout)
    changed = (bits(before.cpu()) != bits(after.cpu())) & keep
    if bool(changed.any()):
        first = tuple(int(i) for i in changed.nonzero()[0])
        return [f"{name}: {int(changed.sum())} elements of rows no slot names changed (first at {first})"]
    return []


# ------------------------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class CacheCase:
    """A RoPE + KV-cache write, as drawn: rebuilt into tensors by :func:`build_cache_case`."""
    spec: RopeSpec
    num_tokens: int
    num_q_heads: int
    num_kv_heads: int
    dtype: str
    cache: str                   # "activation" or an FP8 dtype's name
    layout: str                  # "NHD" or "HND"
    block_size: int
    num_blocks: int
    padding: float               # share of tokens with slot -1
    short_slots: int             # tokens past slot_mapping's end
    scale_as_tensor: bool
    k_scale: float
    v_scale: float
    packed: bool                 # q, k, v as column views of one qkv
    joint_cache: bool            # key and value caches as views of one [num_blocks, 2, ...] buffer
    positions_kind: str
    seed: int


@dataclass
class CacheInputs:
    positions: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor
    cos_sin_cache: torch.Tensor
    k_scale: object
    v_scale: object


def _stale_cache(shape, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Garbage that must survive where no slot writes: random bytes for FP8 (NaN codes included),
    values of either sign and any size for bf16/fp16/fp32."""
    if is_fp8(dtype):
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).view(dtype)
    return (torch.randn(shape, generator=gen) * 100).to(dtype)


def build_cache_case(case: CacheCase, device: str = "cpu") -> CacheInputs:
    """The tensors of ``case``, regenerated bit for bit from its seed."""
    gen = torch.Generator().manual_seed(case.seed)
    spec, t, d = case.spec, case.num_tokens, case.spec.head_size
    dtype = DTYPES[case.dtype]
    cache_dtype = dtype if case.cache == "activation" else getattr(torch, case.cache)
    widths = (case.num_q_heads * d, case.num_kv_heads * d, case.num_kv_heads * d)
    x = (torch.randn(t, sum(widths), generator=gen) * 4).to(dtype).to(device)
    if case.packed:
        q, k, v = x.split(widths, dim=1)
    else:
        q, k, v = (part.contiguous() for part in x.split(widths, dim=1))
    heads = (case.num_kv_heads, d)
    shape = ((case.num_blocks, case.block_size) + heads if case.layout == "NHD"
             else (case.num_blocks, case.num_kv_heads, case.block_size, d))
    if case.joint_cache:        # vLLM's flash layout: key_cache = kv[:, 0], value_cache = kv[:, 1]
        joint = _stale_cache((shape[0], 2) + shape[1:], cache_dtype, gen).to(device)
        key_cache, value_cache = joint[:, 0], joint[:, 1]
    else:
        key_cache, value_cache = (_stale_cache(shape, cache_dtype, gen).to(device) for _ in range(2))
    num_slots = case.num_blocks * case.block_size
    n = max(0, t - case.short_slots)
    if n > num_slots:
        raise ValueError(f"num_blocks={case.num_blocks}: {num_slots} slots cannot hold {n} tokens' rows")
    slots = torch.randperm(num_slots, generator=gen)[:n]
    slots[torch.rand(n, generator=gen) < case.padding] = -1
    fp8 = is_fp8(cache_dtype)

    def scale(value):
        if not fp8:
            return None
        return torch.tensor([value], dtype=torch.float32, device=device) if case.scale_as_tensor else value
    positions = make_positions(spec, t, case.positions_kind, gen)
    # Moved before any view is taken, so the views keep their strides on the device.
    return CacheInputs(positions.to(device), q, k, v, key_cache, value_cache, slots.to(device),
                       table(spec, dtype, positions).to(device), scale(case.k_scale), scale(case.v_scale))


def token_counts(max_small: int = 40, big: int = 2080):
    """Mostly 1..max_small tokens, about one draw in ten ``big`` (with 16 heads, past 2^15 token x
    head products)."""
    return st.integers(0, 9).flatmap(lambda i: st.just(big) if i == 0 else st.integers(1, max_small))



@dataclass(frozen=True)
class QKNormCase:
    """A QK-norm + RoPE call, as drawn: rebuilt into tensors by :func:`build_qk_norm_case`."""
    spec: RopeSpec
    num_tokens: int
    num_heads_q: int
    num_heads_k: int
    num_heads_v: int
    dtype: str
    eps: float
    row_padding: int             # columns past v in each row of the buffer qkv is a view of
    positions_kind: str
    seed: int


@dataclass
class QKNormInputs:
    positions: torch.Tensor
    qkv: torch.Tensor
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    cos_sin_cache: torch.Tensor


def build_qk_norm_case(case: QKNormCase, device: str = "cpu") -> QKNormInputs:
    """The tensors of ``case``, regenerated bit for bit from its seed: heads of mixed magnitudes
    (:func:`head_magnitudes`), weights never uniform and different for q and k."""
    gen = torch.Generator().manual_seed(case.seed)
    spec, t, d = case.spec, case.num_tokens, case.spec.head_size
    dtype = DTYPES[case.dtype]
    heads = case.num_heads_q + case.num_heads_k + case.num_heads_v
    x = torch.randn(t, heads, d, generator=gen) * head_magnitudes(t, heads, gen)
    buffer = torch.zeros(t, heads * d + case.row_padding, dtype=dtype)
    buffer[:, :heads * d] = x.reshape(t, heads * d).to(dtype)
    qkv = buffer[:, :heads * d]
    positions = make_positions(spec, t, case.positions_kind, gen)
    inputs = QKNormInputs(positions, qkv, weights(d, dtype, gen), weights(d, dtype, gen), table(spec, dtype, positions))
    if device != "cpu":
        for name, value in vars(inputs).items():
            setattr(inputs, name, value.to(device) if name != "qkv" else buffer.to(device)[:, :heads * d])
    return inputs
