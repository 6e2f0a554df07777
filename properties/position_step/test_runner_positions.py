"""The position step (docs/spec.md §5): every implementation on every device against the
reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given

from rope.devices import synchronize, torch_device
from rope.harness.comparison import call_positions, check_positions, positions_failure, skip_unless_builtin
from rope.registry import get_positions_implementation, positions_unsupported_reason
import reference
from properties.strategies import OUT_SENTINEL, RaggedBatch, affine_table, prefill_steps, ragged_batches

# vllm#10388 / #10403: a 40-token prompt in chunks of 32 then 8, then decode with the full-prompt delta.
_PROMPT = [0, 1, 2, 3] + [4] * 12 + [5 + i for i in range(24)]          # 40 tokens, max position 28
_ROWS = (tuple(_PROMPT) + (0,) * 24) * 3                                  # 3 rows, max_model_len 64
CHUNK_1 = RaggedBatch(3, _ROWS, (28 + 1 - 40,), (40,), (0,), (0,), (32,))
CHUNK_2 = RaggedBatch(3, _ROWS, (28 + 1 - 40,), (40,), (32,), (0,), (8,), 2)
DECODE = RaggedBatch(3, _ROWS, (28 + 1 - 40,), (40,), (40,), (0,), (1,), 1)


def run_positions(fn, batch: RaggedBatch, device: str) -> torch.Tensor:
    args = batch.tensors(device)
    out = torch.full((batch.num_dims, batch.num_tokens + batch.padding), OUT_SENTINEL,
                     dtype=torch.int64, device=torch_device(device))
    call_positions(fn, args, out)
    synchronize(device)
    return out.cpu()


def assert_positions_match(name: str, fn, batch: RaggedBatch, device: str) -> None:
    out = run_positions(fn, batch, device)
    n = batch.num_tokens
    past = [] if torch.all(out[:, n:] == OUT_SENTINEL) else [f"wrote columns past the step's {n} tokens"]
    problems = check_positions(name, device, batch.tensors("cpu"), out[:, :n], past)
    if problems:
        raise positions_failure(f"{name} on {device}: the step's positions are wrong", problems, tokens=n,
                                requests=len(batch.query_lens))


def positions_impl_or_skip(name: str, device: str):
    """The implementation, or a skip with its reason when it does not run on ``device``."""
    fn = get_positions_implementation(name)
    reason = positions_unsupported_reason(name, fn, device)
    if reason:
        pytest.skip(reason)
    return fn


# Three blocks in one request; two requests of 2 and 3 blocks (slot 1 first) beside a decode step.
LONG_1D = RaggedBatch(1, tuple(range(7, 707)), (0,), (700,), (0,), (0,), (600,), 2)
LONG_3D = RaggedBatch(3, tuple((c * 3 + row) % 997 for row in range(9) for c in range(600)), (0, 0, -9),
                      (600, 600, 20), (0, 40, 25), (1, 0, 2), (300, 520, 2), 1)
# One request of 16,384 tokens (64 of the Triton kernel's 256-token blocks); four chunks totalling
# 16,384 beside a decode request, slots permuted.
PREFILL_ONE = RaggedBatch(3, affine_table(3, 2, 16400, 2), (0, 0), (16400, 0), (16, 0), (0,), (16384,), 3)
PREFILL_MIXED = RaggedBatch(3, affine_table(3, 5, 8200, 2), (5, -7, 0, 3, 40), (8200, 4000, 2400, 2200, 30),
                            (100, 0, 37, 0, 31), (1, 3, 0, 2, 4), (4000, 2000, 8098, 2284, 2), 1)
# Short steps; steps with chunks of up to 700 tokens (several of the Triton kernel's 256-token blocks
# per request, spread over programs by the default split); steps of prefill size, up to 16,384
# tokens (a block or split computed for short steps only, an index that overflows).
STEPS = ragged_batches() | ragged_batches(max_reqs=3, max_model_len=700) | prefill_steps()


@given(batch=STEPS)
@example(batch=CHUNK_1)
@example(batch=CHUNK_2)
@example(batch=DECODE)
@example(batch=LONG_1D)
@example(batch=LONG_3D)
@example(batch=PREFILL_ONE)
@example(batch=PREFILL_MIXED)
def test_prepared_positions_match_reference(positions_impl_name, device, batch):
    fn = positions_impl_or_skip(positions_impl_name, device)
    assert_positions_match(positions_impl_name, fn, batch, device)


@given(batch=ragged_batches())
@example(batch=CHUNK_1)
@example(batch=DECODE)
def test_prepared_positions_pass_under_guards(positions_impl_name, device, batch):
    # Every input a view into a sentinel-guarded allocation (properties/guards.py): a stray write
    # changes a guard, a stray read reaches `out` as garbage; under the interpreter every load and
    # store is traced (an out-of-bounds read is reported even when its value is never used).
    from properties.guards import assert_positions_match_guarded
    fn = positions_impl_or_skip(positions_impl_name, device)
    assert_positions_match_guarded(positions_impl_name, fn, batch, device)


@given(batch=STEPS)
@example(batch=CHUNK_2)
@example(batch=LONG_3D)
def test_unchecked_launches_match_reference(positions_impl_name, device, batch):
    # The benchmark times `fn.unchecked` (no validation, no host sync): it must compute what `fn`
    # does and leave the columns past the step alone, although it cannot know where the step ends.
    fn = positions_impl_or_skip(positions_impl_name, device)
    if not hasattr(fn, "unchecked"):
        pytest.skip(f"{positions_impl_name} has no unchecked launch")
    assert_positions_match(f"{positions_impl_name}.unchecked", fn.unchecked, batch, device)


def _good():
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


@pytest.mark.fixed_cases
@pytest.mark.builtins_only
@pytest.mark.parametrize("error", list(ERRORS) + ["out-too-short"], ids=list(ERRORS) + ["out-too-short"])
def test_implementation_rejects_bad_position_input(positions_impl_name, device, error, monkeypatch):
    skip_unless_builtin(positions_impl_name, kind="positions")
    monkeypatch.setenv("ROPE_CHECK_VALUES", "1")   # values are checked on a GPU under the debug switch only
    fn = positions_impl_or_skip(positions_impl_name, device)
    args = {k: v.to(torch_device(device)) if isinstance(v, torch.Tensor) else v for k, v in _good().items()}
    out = torch.zeros(3, 40, dtype=torch.int64, device=torch_device(device))
    if error == "out-too-short":
        out, pattern = out[:, :10], r"out.shape=\(3, 10\): must be \[num_dims=3, >= num_tokens=32\]"
    else:
        change, pattern = ERRORS[error]
        args.update({k: v.to(torch_device(device)) if isinstance(v, torch.Tensor) else v for k, v in change.items()})
    with pytest.raises(ValueError, match=pattern):
        call_positions(fn, args, out)


@pytest.mark.fixed_cases
def test_strided_vector_inputs_are_read_by_value(positions_impl_name, device):
    # query_start_loc as a stride-2 view once made the kernel read ql = 99 and write past out.
    fn = positions_impl_or_skip(positions_impl_name, device)
    args = {k: v.to(torch_device(device)) if isinstance(v, torch.Tensor) else v for k, v in CHUNK_2.tensors().items()}
    args["query_start_loc"] = torch.tensor([0, 99, 8, 77], dtype=torch.int32, device=torch_device(device))[::2]
    out = torch.full((3, 8 + 4), OUT_SENTINEL, dtype=torch.int64, device=torch_device(device))
    call_positions(fn, args, out)
    expected = reference.prepare_positions(**CHUNK_2.tensors())
    assert torch.equal(out[:, :8].cpu(), expected) and torch.all(out[:, 8:].cpu() == OUT_SENTINEL)
