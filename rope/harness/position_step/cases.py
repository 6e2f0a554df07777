"""The position step's case: one model-runner step over persistent request slots (docs/spec.md §5),
as plain lists, and the tensors it becomes on a device.  The Hypothesis strategies that draw it live
in the suite (properties.strategies.ragged_batches)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rope.devices import torch_device

__all__ = ["OUT_SENTINEL", "RaggedBatch"]


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

