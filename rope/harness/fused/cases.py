"""The fused ops' cases (docs/spec.md §10): a QK-norm + RoPE call (:class:`QKNormCase`, contract A),
a RoPE + KV-cache write (:class:`CacheCase`, contract B) and an MLA RoPE + latent-cache write
(:class:`MLACase`, contract C), each a frozen description that draws nothing itself (the strategies in
properties/fused/ do) and regenerates its tensors bit for bit on any device from its seed
(:func:`build_qk_norm_case`, :func:`build_cache_case`, :func:`build_mla_case`): on the device for a
``counter`` case (rope.harness.seeded.CounterDraws), on the host and then copied for a ``torch-cpu`` one.  ``to_dict`` /
``from_dict`` give the record form, ``size`` orders a failure group, ``brief`` names the case."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from rope.cache import attention_factor, cos_sin_cache, inv_freq
from rope.fused import is_fp8
from rope.harness.rotation.cases import GENERATORS, POSITION_KINDS, make_positions
from rope.harness.seeded import draws_for
from rope.models import load_models
from rope.spec import RopeSpec

__all__ = ["BLOCK_SIZES", "CACHE_KINDS", "DTYPES", "FULL_TABLE_ROWS", "GENERATORS", "POSITION_KINDS", "Q_LAYOUTS",
           "SCALES", "CacheCase", "CacheInputs", "MLACase", "MLAInputs", "QKNormCase", "QKNormInputs", "build_cache_case", "build_mla_case",
           "build_qk_norm_case", "head_magnitudes", "model_spec", "table", "weights"]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CACHE_KINDS = ("activation", "float8_e4m3fn", "float8_e5m2")
BLOCK_SIZES = (16, 32, 64, 128, 256)
SCALES = (0.05, 0.3, 2.5, 7.0)          # never 1: divide and multiply must differ
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


def head_magnitudes(num_tokens: int, num_heads: int, draws) -> torch.Tensor:
    """[T, H, 1] per-head scales: mostly 1, some 1e-3 (a mean square near eps: an implementation
    that drops eps shows) and some 30.  ``draws``: a source of rope.harness.seeded."""
    pick = draws.integers((num_tokens, num_heads, 1), 0, 6)
    return torch.where(pick == 0, 1e-3, torch.where(pick == 1, 30.0, 1.0))


def weights(head_size: int, dtype: torch.dtype, draws) -> torch.Tensor:
    """An RMSNorm weight in [0.25, 2): never uniform, so a norm applied after the rotation (which
    moves channels between weights) shows."""
    return (0.25 + 1.75 * draws.uniform((head_size,))).to(dtype)


class _Record:
    """to_dict / from_dict of a case dataclass whose ``spec`` is a RopeSpec, and its ``generator`` checked."""

    def __post_init__(self):
        if self.generator not in GENERATORS:
            raise ValueError(f"{type(self).__name__}: generator={self.generator!r}: must be one of {GENERATORS}")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["spec"] = self.spec.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict):
        fields = {f.name for f in dataclasses.fields(cls)}
        if isinstance(d, dict) and "generator" not in d:       # written before the field: drawn on the host
            d = d | {"generator": "torch-cpu"}
        if not isinstance(d, dict) or set(d) != fields:
            raise ValueError(f"{cls.__name__}: fields must be {sorted(fields)}")
        return cls(**(d | {"spec": RopeSpec.from_dict(d["spec"])}))


# ------------------------------------------------------------------------------- B: RoPE + KV cache
@dataclass(frozen=True)
class CacheCase(_Record):
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
    generator: str = "torch-cpu"   # what makes the tensors from the seed (rope.harness.rotation.cases.GENERATORS)

    @property
    def size(self) -> int:
        return self.num_tokens * (self.num_q_heads + self.num_kv_heads)

    def brief(self) -> str:
        return (f"{self.spec.variant()} T={self.num_tokens} "
                f"Hq={self.num_q_heads} Hkv={self.num_kv_heads} D={self.spec.head_size} {self.dtype} cache={self.cache} "
                f"{self.layout} block={self.block_size}")


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


def _stale_cache(shape, dtype: torch.dtype, draws) -> torch.Tensor:
    """Garbage that must survive where no slot writes: random bytes for FP8 (NaN codes included),
    values of either sign and any size for bf16/fp16/fp32."""
    if is_fp8(dtype):
        return draws.integers(shape, 0, 256, dtype=torch.uint8).view(dtype)
    return (draws.normal(shape) * 100).to(dtype)


def _slots(num_tokens: int, short_slots: int, padding: float, num_blocks: int, block_size: int,
           draws) -> torch.Tensor:
    """Distinct slots of the first num_tokens - short_slots tokens, a ``padding`` share of them -1."""
    num_slots = num_blocks * block_size
    n = max(0, num_tokens - short_slots)
    if n > num_slots:
        raise ValueError(f"num_blocks={num_blocks}: {num_slots} slots cannot hold {n} tokens' rows")
    slots = draws.permutation(num_slots)[:n]
    slots[draws.uniform((n,)) < padding] = -1
    return slots


def _scale(case: CacheCase, value: float, fp8: bool, device):
    if not fp8:
        return None
    return torch.tensor([value], dtype=torch.float32, device=device) if case.scale_as_tensor else value


def build_cache_case(case: CacheCase, device: str = "cpu") -> CacheInputs:
    """The tensors of ``case``, regenerated bit for bit from its seed."""
    gen = draws_for(case.generator, case.seed, device)
    spec, t, d = case.spec, case.num_tokens, case.spec.head_size
    dtype = DTYPES[case.dtype]
    cache_dtype = dtype if case.cache == "activation" else getattr(torch, case.cache)
    widths = (case.num_q_heads * d, case.num_kv_heads * d, case.num_kv_heads * d)
    x = (gen.normal((t, sum(widths))) * 4).to(dtype).to(device)
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
    slots = _slots(t, case.short_slots, case.padding, case.num_blocks, case.block_size, gen)
    fp8 = is_fp8(cache_dtype)
    positions = make_positions(spec, t, case.positions_kind, gen)
    # Moved before any view is taken, so the views keep their strides on the device.
    return CacheInputs(positions.to(device), q, k, v, key_cache, value_cache, slots.to(device),
                       table(spec, dtype, positions).to(device), _scale(case, case.k_scale, fp8, device),
                       _scale(case, case.v_scale, fp8, device))


# ------------------------------------------------------------------------------- A: QK-norm + RoPE
@dataclass(frozen=True)
class QKNormCase(_Record):
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
    generator: str = "torch-cpu"   # what makes the tensors from the seed (rope.harness.rotation.cases.GENERATORS)

    @property
    def size(self) -> int:
        return self.num_tokens * (self.num_heads_q + self.num_heads_k)

    def brief(self) -> str:
        return (f"{self.spec.variant()} T={self.num_tokens} Hq={self.num_heads_q} Hk={self.num_heads_k} "
                f"Hv={self.num_heads_v} D={self.spec.head_size} rotary={self.spec.rotary_dim} {self.dtype}")


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
    gen = draws_for(case.generator, case.seed, device)
    spec, t, d = case.spec, case.num_tokens, case.spec.head_size
    dtype = DTYPES[case.dtype]
    heads = case.num_heads_q + case.num_heads_k + case.num_heads_v
    x = gen.normal((t, heads, d)) * head_magnitudes(t, heads, gen)
    buffer = torch.zeros(t, heads * d + case.row_padding, dtype=dtype, device=x.device)
    buffer[:, :heads * d] = x.reshape(t, heads * d).to(dtype)
    qkv = buffer[:, :heads * d]
    positions = make_positions(spec, t, case.positions_kind, gen)
    inputs = QKNormInputs(positions, qkv, weights(d, dtype, gen), weights(d, dtype, gen), table(spec, dtype, positions))
    if device != "cpu":
        for name, value in vars(inputs).items():
            setattr(inputs, name, value.to(device) if name != "qkv" else buffer.to(device)[:, :heads * d])
    return inputs


# ------------------------------------------------------------------------------- C: MLA
Q_LAYOUTS = ("token_major", "heads_major")


@dataclass(frozen=True)
class MLACase(_Record):
    """An MLA RoPE + latent-cache write, as drawn: rebuilt into tensors by :func:`build_mla_case`.
    The spec's head_size = rotary_dim = R (DeepSeek: 64, GPT-J pairs); q is [T, H, nope_dim + R] with
    q_pe its last R channels, token-major or heads-major (a transposed [H, T, nope_dim + R]: the
    output of a batched matmul over heads, aiter#3841)."""
    spec: RopeSpec
    num_tokens: int
    num_heads: int
    kv_lora_rank: int
    nope_dim: int                # q's channels before q_pe (0: q is q_pe)
    q_layout: str                # "token_major" or "heads_major"
    packed_kv: bool              # kv_c and k_pe as column views of one kv_a [T, L + R]
    k_pe_3d: bool                # k_pe as [T, 1, R]
    dtype: str
    cache: str                   # "activation" or an FP8 dtype's name
    block_size: int
    num_blocks: int
    padding: float               # share of tokens with slot -1
    short_slots: int             # tokens past slot_mapping's end
    scale_as_tensor: bool
    scale: float
    positions_kind: str
    seed: int
    generator: str = "torch-cpu"   # what makes the tensors from the seed (rope.harness.rotation.cases.GENERATORS)

    @property
    def size(self) -> int:
        return self.num_tokens * (self.num_heads + 1)

    def brief(self) -> str:
        return (f"{self.spec.variant()} T={self.num_tokens} H={self.num_heads} R={self.spec.head_size} "
                f"L={self.kv_lora_rank} nope={self.nope_dim} {self.q_layout} {self.dtype} cache={self.cache} "
                f"block={self.block_size}")


@dataclass
class MLAInputs:
    positions: torch.Tensor
    q: torch.Tensor              # [T, H, nope_dim + R]: q_nope and q_pe side by side (a view)
    q_pe: torch.Tensor
    k_pe: torch.Tensor
    kv_c: torch.Tensor
    kv_cache: torch.Tensor
    slot_mapping: torch.Tensor
    cos_sin_cache: torch.Tensor
    scale: object


def build_mla_case(case: MLACase, device: str = "cpu") -> MLAInputs:
    """The tensors of ``case``, regenerated bit for bit from its seed (the views taken on the device,
    so they keep their strides there)."""
    if case.q_layout not in Q_LAYOUTS:
        raise ValueError(f"q_layout={case.q_layout!r}: must be one of {Q_LAYOUTS}")
    gen = draws_for(case.generator, case.seed, device)
    spec, t, h, r, lora = case.spec, case.num_tokens, case.num_heads, case.spec.head_size, case.kv_lora_rank
    dtype = DTYPES[case.dtype]
    cache_dtype = dtype if case.cache == "activation" else getattr(torch, case.cache)
    width = case.nope_dim + r
    heads_major = case.q_layout == "heads_major"
    q_buffer = (gen.normal((h, t, width) if heads_major else (t, h, width)) * 4).to(dtype).to(device)
    q = q_buffer.transpose(0, 1) if heads_major else q_buffer
    kv_a = (gen.normal((t, lora + r)) * 4).to(dtype).to(device)
    kv_c, k_pe = kv_a[:, :lora], kv_a[:, lora:]
    if not case.packed_kv:
        kv_c, k_pe = kv_c.contiguous(), k_pe.contiguous()
    if case.k_pe_3d:
        k_pe = k_pe.unsqueeze(1)
    kv_cache = _stale_cache((case.num_blocks, case.block_size, lora + r), cache_dtype, gen).to(device)
    slots = _slots(t, case.short_slots, case.padding, case.num_blocks, case.block_size, gen)
    positions = make_positions(spec, t, case.positions_kind, gen)
    scale = None
    if is_fp8(cache_dtype):
        scale = (torch.tensor([case.scale], dtype=torch.float32, device=device) if case.scale_as_tensor
                 else case.scale)
    return MLAInputs(positions.to(device), q, q[..., case.nope_dim:], k_pe, kv_c, kv_cache, slots.to(device),
                     table(spec, dtype, positions).to(device), scale)
