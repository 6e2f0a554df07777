"""The table's case: a spec, the rows asked for and the dtype, plus the seed of the rows compared.

The implementation builds the whole table; the check compares a sample of its rows (the first
three, the last two, and ``SAMPLED_ROWS`` drawn from the seed), so a 2^20-row table costs a float64
reference of a few dozen rows.  The case draws nothing itself (properties/table/strategies.py does)
and regenerates its rows bit for bit from the seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rope.spec import MAX_POSITION, RopeSpec

__all__ = ["DTYPES", "SAMPLED_ROWS", "TableCase"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SAMPLED_ROWS = 48


@dataclass(frozen=True)
class TableCase:
    """``fn(spec, max_position, dtype, device)`` and the rows of its answer compared."""

    spec: RopeSpec
    max_position: int
    dtype: torch.dtype = torch.float32
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.spec, RopeSpec):
            raise ValueError(f"spec={self.spec!r}: must be a RopeSpec")
        if not isinstance(self.max_position, int) or isinstance(self.max_position, bool) \
                or not 1 <= self.max_position <= MAX_POSITION:
            raise ValueError(f"max_position={self.max_position!r}: must be an int in [1, {MAX_POSITION}]")
        if self.dtype not in DTYPES.values():
            raise ValueError(f"dtype={self.dtype!r}: must be one of {', '.join(DTYPES)}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2 ** 63:
            raise ValueError(f"seed={self.seed!r}: must be an int in [0, 2**63)")

    @property
    def size(self) -> int:
        return self.max_position

    def rows(self) -> torch.Tensor:
        """The sorted int64 rows compared: 0, 1, 2, the last two, powers of two below max_position and
        SAMPLED_ROWS from the seed."""
        n = self.max_position
        fixed = {0, 1, 2, n - 2, n - 1} | {(1 << k) - 1 for k in range(1, n.bit_length())}
        g = torch.Generator().manual_seed(self.seed)
        drawn = torch.randint(0, n, (SAMPLED_ROWS,), generator=g).tolist()
        return torch.tensor(sorted(r for r in fixed | set(drawn) if 0 <= r < n), dtype=torch.int64)

    def brief(self) -> str:
        s = self.spec.scaling
        kind = "default" if s is None else s.rope_type
        return f"{kind} R={self.spec.rotary_dim} rows={self.max_position} {str(self.dtype).replace('torch.', '')}"

    def to_dict(self) -> dict:
        return {"spec": self.spec.to_dict(), "max_position": self.max_position,
                "dtype": str(self.dtype).replace("torch.", ""), "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict) -> "TableCase":
        if not isinstance(d, dict) or set(d) != {"spec", "max_position", "dtype", "seed"}:
            raise ValueError("table case: must be an object with spec, max_position, dtype and seed")
        if d["dtype"] not in DTYPES:
            raise ValueError(f"dtype={d['dtype']!r}: must be one of {', '.join(DTYPES)}")
        return cls(RopeSpec.from_dict(d["spec"]), d["max_position"], DTYPES[d["dtype"]], d["seed"])
