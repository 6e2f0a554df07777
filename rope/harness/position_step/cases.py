"""The position step's case: one model-runner step over persistent request slots (docs/spec.md §5),
as plain lists, and the tensors it becomes on a device.  The Hypothesis strategies that draw it live
in the suite (properties.strategies.ragged_batches)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rope.devices import torch_device

__all__ = ["BUFFER_SHAPE_FIELDS", "MAX_STEP_ELEMENTS", "OUT_SENTINEL", "RaggedBatch", "STALE_LABELS", "STEP_MODES",
           "buffer_shape"]

# What a case file may ask a replay to build: the slots' prefill positions and the step's tokens.
MAX_STEP_ELEMENTS = 1 << 24
# A runner calls the step step after step on one set of buffers refilled in place: eagerly, or replayed
# in a CUDA graph (rope.harness.position_step.modes); a step right alone but stale there is grouped
# under its mode's label (and a sequence case file records both).
STEP_MODES = ("eager", "graph")
STALE_LABELS = {"eager": "reused_buffers_stale", "graph": "graph_replay_stale"}
# What one set of buffers fixes, in :func:`buffer_shape`'s order.
BUFFER_SHAPE_FIELDS = ("num_dims", "prefill_lens (slots)", "prefill_positions (table size)", "idx_mapping (requests)",
                       "num_tokens + padding (out columns)")
_LISTS = ("prefill_positions", "prefill_delta", "prefill_lens", "num_computed_tokens", "idx_mapping", "query_lens")


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

    def to_dict(self) -> dict:
        """The case as JSON (a case file's ``batch``)."""
        return {"num_dims": self.num_dims, **{name: list(getattr(self, name)) for name in _LISTS},
                "padding": self.padding}

    @classmethod
    def from_dict(cls, d: dict) -> "RaggedBatch":
        """The case a case file's ``batch`` describes; ValueError naming the field for anything that is
        not a step the contract admits (docs/spec.md §5): a case file is data from a stranger."""
        if not isinstance(d, dict) or set(d) != {"num_dims", "padding", *_LISTS}:
            raise ValueError(f"batch: must be an object with exactly num_dims, padding, {', '.join(_LISTS)}")
        ints = lambda v: isinstance(v, int) and not isinstance(v, bool)      # noqa: E731
        num_dims, padding = d["num_dims"], d["padding"]
        if not ints(num_dims) or not 1 <= num_dims <= 4:
            raise ValueError(f"batch.num_dims={num_dims!r}: must be an int in [1, 4]")
        if not ints(padding) or not 0 <= padding <= 1024:
            raise ValueError(f"batch.padding={padding!r}: must be an int in [0, 1024]")
        for name in _LISTS:
            if not isinstance(d[name], list) or not all(ints(v) for v in d[name]):
                raise ValueError(f"batch.{name}: must be a list of ints")
        slots = len(d["prefill_lens"])
        flat = d["prefill_positions"]      # [slots * num_dims][max_model_len], row-major
        if not slots or not flat or len(flat) % (slots * num_dims):
            raise ValueError(f"batch.prefill_positions: {len(flat)} ints: must be {slots} slots x {num_dims} rows "
                             f"of one length, row-major")
        if len(flat) + sum(d["query_lens"]) > MAX_STEP_ELEMENTS:
            raise ValueError(f"batch: more than {MAX_STEP_ELEMENTS} positions to build")
        if len(d["prefill_delta"]) != slots or len(d["num_computed_tokens"]) != slots:
            raise ValueError(f"batch.prefill_delta, batch.num_computed_tokens: one per slot ({slots})")
        if len(d["idx_mapping"]) != len(d["query_lens"]) or len(set(d["idx_mapping"])) != len(d["idx_mapping"]) \
                or not all(0 <= i < slots for i in d["idx_mapping"]):
            raise ValueError(f"batch.idx_mapping: distinct slots in [0, {slots}), one per entry of query_lens")
        if any(n < 0 for n in d["query_lens"]):
            raise ValueError("batch.query_lens: must be non-negative")
        return cls(num_dims, *(tuple(d[name]) for name in _LISTS), padding)

    def brief(self) -> str:
        n = len(self.query_lens)
        return f"{self.num_tokens} tokens, {n} request{'s' if n != 1 else ''}, {self.num_dims} rows"

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


def buffer_shape(step: RaggedBatch) -> tuple[int, int, int, int, int]:
    """What one set of buffers fixes for ``step`` (BUFFER_SHAPE_FIELDS): rows, slots, prefill-table size,
    requests, output columns."""
    return (step.num_dims, len(step.prefill_lens), len(step.prefill_positions), len(step.idx_mapping),
            step.num_tokens + step.padding)
