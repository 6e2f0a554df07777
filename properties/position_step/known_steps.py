"""The position step's fixed cases: known bugs' steps, long and prefill-size steps, and the bad inputs a
built-in must reject with a message naming the field (a case module: the properties of
properties/position_step/ and the project's tests use them)."""

from __future__ import annotations

import torch

from properties.strategies import RaggedBatch, affine_table

# vllm#10388 / #10403: a 40-token prompt in chunks of 32 then 8, then decode with the full-prompt delta.
PROMPT = [0, 1, 2, 3] + [4] * 12 + [5 + i for i in range(24)]          # 40 tokens, max position 28
ROWS = (tuple(PROMPT) + (0,) * 24) * 3                                  # 3 rows, max_model_len 64
CHUNK_1 = RaggedBatch(3, ROWS, (28 + 1 - 40,), (40,), (0,), (0,), (32,))
CHUNK_2 = RaggedBatch(3, ROWS, (28 + 1 - 40,), (40,), (32,), (0,), (8,), 2)
DECODE = RaggedBatch(3, ROWS, (28 + 1 - 40,), (40,), (40,), (0,), (1,), 1)

# Three blocks in one request; two requests of 2 and 3 blocks (slot 1 first) beside a decode step.
LONG_1D = RaggedBatch(1, tuple(range(7, 707)), (0,), (700,), (0,), (0,), (600,), 2)
LONG_3D = RaggedBatch(3, tuple((c * 3 + row) % 997 for row in range(9) for c in range(600)), (0, 0, -9),
                      (600, 600, 20), (0, 40, 25), (1, 0, 2), (300, 520, 2), 1)
# One request of 16,384 tokens (64 of the Triton kernel's 256-token blocks); four chunks totalling
# 16,384 beside a decode request, slots permuted.
PREFILL_ONE = RaggedBatch(3, affine_table(3, 2, 16400, 2), (0, 0), (16400, 0), (16, 0), (0,), (16384,), 3)
PREFILL_MIXED = RaggedBatch(3, affine_table(3, 5, 8200, 2), (5, -7, 0, 3, 40), (8200, 4000, 2400, 2200, 30),
                            (100, 0, 37, 0, 31), (1, 3, 0, 2, 4), (4000, 2000, 8098, 2284, 2), 1)


def good_args() -> dict:
    """A valid step's CPU inputs (CHUNK_1's), for the bad-input cases to spoil one at a time."""
    return CHUNK_1.tensors()


ERRORS = {
    "num-dims": (dict(num_dims=5), r"num_dims=5: must be an int in \[1, 4\]"),
    "table-rows": (dict(num_dims=2), r"prefill_positions.shape=\(3, 64\): must be \[max_reqs \* num_dims"),
    "slot-out-of-range": (dict(idx_mapping=torch.tensor([1], dtype=torch.int32)), r"idx_mapping=\[1\]: every slot must lie in \[0, max_reqs=1\)"),
    "delta-length": (dict(prefill_delta=torch.zeros(2, dtype=torch.int32)), r"prefill_delta.shape=\(2,\): must be \[1\]"),
    "qsl-length": (dict(query_start_loc=torch.tensor([0], dtype=torch.int32)), r"query_start_loc.shape=\(1,\): must be \[2\]"),
    "qsl-decreasing": (dict(query_start_loc=torch.tensor([3, 1], dtype=torch.int32)), r"query_start_loc=\[3, 1\]: must start at 0"),
    "float-lens": (dict(prefill_lens=torch.tensor([40.0])), r"prefill_lens.dtype=torch.float32"),
    "read-past-table": (dict(num_computed_tokens=torch.tensor([39], dtype=torch.int32)), r"num_computed_tokens\[0\]=39: prefill reads columns up to 70, past max_model_len=64"),
    # Decode positions nc + i + delta past int64 wrapped silently in native and Triton.
    "delta-overflow": (dict(num_computed_tokens=torch.tensor([40], dtype=torch.int32),
                            prefill_delta=torch.tensor([2 ** 63 - 10], dtype=torch.int64)),
                       r"prefill_delta\[0\]=9223372036854775798: decode positions 9223372036854775838\.\.\d+ overflow int64"),
}
