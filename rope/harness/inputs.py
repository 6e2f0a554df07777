"""The case model: a rotation case or a runner step described well enough to regenerate its
tensors anywhere, and the code that regenerates them.

A :class:`RotationCase` holds a spec, head counts, a token count, a dtype, a position pattern, a
memory layout and a seed; :func:`build_rotation_inputs` turns it into tensors with a
``torch.Generator`` on the CPU and then moves them, so a case regenerates bit-identically on any
device and from a case file.  A :class:`RaggedBatch` is one model-runner step (docs/spec.md §5)
as plain lists.  The Hypothesis strategies that draw both live in the test suite.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.spec import RopeSpec

# The head sizes cases are drawn from: real models' first (64 shrinks best), then small ones for
# edge cases (the strategies draw from it; tools that sweep "every head size the properties draw" too).
HEAD_SIZES = (64, 128, 80, 96, 112, 160, 192, 256, 32, 16, 8)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

POSITION_KINDS = ("uniform", "text", "grid", "last_row")


def check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: must be one of {allowed}")


@dataclass(frozen=True)
class RotationCase:
    """A rotation input, described well enough to regenerate it anywhere."""
    spec: RopeSpec
    num_tokens: int
    num_q_heads: int
    num_kv_heads: int          # 0: key absent
    dtype: str
    positions_kind: str = "uniform"
    packed_qkv: bool = False   # q and k are row-strided views into one [T, (Hq + 2 Hkv) * hs] tensor
    seed: int = 0
    nonfinite: bool = False    # NaN, +inf and -inf planted in q and k (inject_nonfinite)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spec"] = self.spec.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RotationCase":
        d = dict(d)
        d["spec"] = RopeSpec.from_dict(d["spec"])
        return cls(**d)


# --------------------------------------------------------------------------- tensors
@functools.lru_cache(maxsize=4)
def _cached_table(base: float, rotary_dim: int, max_position: int, dtype: torch.dtype) -> torch.Tensor:
    return cos_sin_cache(RopeSpec(rotary_dim, rotary_dim, base=base, max_position=max_position), dtype, "cpu")


def _cpu_cache(spec: RopeSpec, dtype: torch.dtype) -> torch.Tensor:
    """The spec's cache; memoized on what it depends on (base, rotary_dim, length, dtype) only."""
    return _cached_table(spec.effective_base, spec.rotary_dim, spec.max_position, dtype)


def make_positions(spec: RopeSpec, num_tokens: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """int64 [T] or [num_dims, T] with values in [0, spec.max_position)."""
    check_choice("positions_kind", kind, POSITION_KINDS)
    rows, limit = spec.num_dims, spec.max_position
    if kind == "uniform":
        pos = torch.randint(0, limit, (rows, num_tokens), generator=gen)
    elif kind == "text":        # all rows equal, consecutive from a random start
        start = int(torch.randint(0, max(1, limit - num_tokens + 1), (1,), generator=gen))
        pos = (start + torch.arange(num_tokens)).remainder(limit).expand(rows, num_tokens).clone()
    elif kind == "grid":        # one image-like block: t-major, then h, then w from a common base
        w = int(torch.randint(1, 6, (1,), generator=gen))
        h = int(torch.randint(1, 6, (1,), generator=gen))
        j = torch.arange(num_tokens)
        coords = [j // (h * w), (j // w) % h, j % w, j]
        base = int(torch.randint(0, limit, (1,), generator=gen))
        pos = torch.stack([(base + coords[d]) for d in range(rows)]).remainder(limit)
    else:                       # "last_row": the last cache row, mixed with random rows
        pos = torch.randint(0, limit, (rows, num_tokens), generator=gen)
        pos[torch.rand(rows, num_tokens, generator=gen) < 0.5] = limit - 1
        if num_tokens:
            pos[:, -1] = limit - 1
    pos = pos.to(torch.int64)
    return pos[0].contiguous() if spec.num_dims == 1 else pos


@dataclass
class RotationInputs:
    positions: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor | None
    cache: torch.Tensor
    storage: torch.Tensor        # the tensor q and k live in (packed qkv or q itself)


def inject_nonfinite(t: torch.Tensor, gen: torch.Generator) -> None:
    """Plant NaN, +inf and -inf at 1 + numel/50 drawn elements of ``t`` (a CPU tensor or view),
    rotary and pass-through channels alike.  Drawn after every finite value, so the finite
    elements are those of the same case without them."""
    rows, cols = t.shape
    if not t.numel():
        return
    count = 1 + t.numel() // 50
    flat = torch.randint(0, t.numel(), (count,), generator=gen)
    values = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=t.dtype)
    t[flat // cols, flat % cols] = values[torch.randint(0, 3, (count,), generator=gen)]


def build_rotation_inputs(case: RotationCase, device: str = "cpu") -> RotationInputs:
    """Regenerate the case's tensors bit-identically (CPU generator), then move them to ``device``."""
    spec, hs = case.spec, case.spec.head_size
    dtype = DTYPES[case.dtype]
    gen = torch.Generator().manual_seed(case.seed)
    positions = make_positions(spec, case.num_tokens, case.positions_kind, gen)
    q_width, k_width = case.num_q_heads * hs, case.num_kv_heads * hs
    dev = torch_device(device)
    if case.packed_qkv:
        storage = torch.randn(case.num_tokens, q_width + 2 * k_width, generator=gen).to(dtype)
        parts = [storage[:, :q_width], storage[:, q_width:q_width + k_width] if k_width else None]
    else:
        parts = [torch.randn(case.num_tokens, q_width, generator=gen).to(dtype),
                 torch.randn(case.num_tokens, k_width, generator=gen).to(dtype) if k_width else None]
        storage = parts[0]
    if case.nonfinite:
        for t in parts:
            if t is not None:
                inject_nonfinite(t, gen)
    if case.packed_qkv:
        storage = storage.to(dev)
        query = storage[:, :q_width]
        key = storage[:, q_width:q_width + k_width] if k_width else None
    else:
        query, key = (t.to(dev) if t is not None else None for t in parts)
        storage = query
    # A private copy: the memoized table must not be shared with (and writable by) the implementation.
    cache = _cpu_cache(spec, dtype).to(dev, copy=True)
    return RotationInputs(positions.to(dev), query, key, cache, storage)


# --------------------------------------------------------------------------- ragged batches
@dataclass(frozen=True)
class RaggedBatch:
    """One model-runner step over persistent request slots (docs/spec.md §5), as plain lists."""
    num_dims: int
    prefill_positions: tuple          # [max_reqs * num_dims][max_model_len]
    prefill_delta: tuple              # [max_reqs]
    prefill_lens: tuple               # [max_reqs]
    num_computed_tokens: tuple        # [max_reqs]
    idx_mapping: tuple                # [num_reqs], injective into the slots
    query_lens: tuple                 # [num_reqs]
    padding: int = 0                  # extra output columns the implementation must not write

    @property
    def query_start_loc(self) -> list[int]:
        out = [0]
        for n in self.query_lens:
            out.append(out[-1] + n)
        return out

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def tensors(self, device: str = "cpu") -> dict:
        dev = torch_device(device)
        i32 = dict(dtype=torch.int32, device=dev)
        return dict(prefill_positions=torch.tensor(self.prefill_positions, **i32).reshape(
                        len(self.prefill_lens) * self.num_dims, -1),
                    prefill_delta=torch.tensor(self.prefill_delta, **i32),
                    idx_mapping=torch.tensor(self.idx_mapping, **i32),
                    query_start_loc=torch.tensor(self.query_start_loc, **i32),
                    prefill_lens=torch.tensor(self.prefill_lens, **i32),
                    num_computed_tokens=torch.tensor(self.num_computed_tokens, **i32),
                    num_dims=self.num_dims)


OUT_SENTINEL = -7777
