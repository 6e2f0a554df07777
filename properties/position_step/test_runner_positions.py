"""The position step (docs/spec.md §5): every implementation on every device against the
reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import reference
from properties.position_step.known_steps import (CHUNK_1, CHUNK_2, DECODE, ERRORS, LONG_1D, LONG_3D, PREFILL_MIXED,
                                                  PREFILL_ONE, good_args)
from properties.strategies import OUT_SENTINEL, prefill_steps, ragged_batches
from rope.devices import torch_device
from rope.harness.draws import skip_unless_builtin
from rope.harness.position_step.batch import assert_batch_matches_reference
from rope.harness.position_step.check import assert_positions_match, call_positions
from rope.registry import get_positions_implementation, positions_unsupported_reason

def positions_impl_or_skip(name: str, device: str):
    """The implementation, or a skip with its reason when it does not run on ``device``."""
    fn = get_positions_implementation(name)
    reason = positions_unsupported_reason(name, fn, device)
    if reason:
        pytest.skip(reason)
    return fn


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


@given(steps=st.lists(ragged_batches(), min_size=1, max_size=8))
@example(steps=[CHUNK_1, DECODE, CHUNK_2])
def test_steps_checked_in_batches_match_reference(positions_impl_name, device, steps):
    # Steps called back to back with no wait between them, waited for once (the batched check,
    # rope.harness.position_step.batch): a step must not read what the step before it left behind.
    fn = positions_impl_or_skip(positions_impl_name, device)
    assert_batch_matches_reference(positions_impl_name, fn, steps, device)


@pytest.mark.guarded
@given(batch=ragged_batches())
@example(batch=CHUNK_1)
@example(batch=DECODE)
def test_prepared_positions_pass_under_guards(positions_impl_name, device, batch):
    # Every input a view into a sentinel-guarded allocation (rope.harness.position_step.guards): a stray
    # write changes a guard, a stray read reaches `out` as garbage; under the interpreter every load and
    # store is traced (an out-of-bounds read is reported even when its value is never used).
    from rope.harness.position_step.guards import assert_positions_match_guarded
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


@pytest.mark.fixed_cases
@pytest.mark.builtins_only
@pytest.mark.parametrize("error", list(ERRORS) + ["out-too-short"], ids=list(ERRORS) + ["out-too-short"])
def test_implementation_rejects_bad_position_input(positions_impl_name, device, error, monkeypatch):
    skip_unless_builtin(positions_impl_name, kind="positions")
    monkeypatch.setenv("ROPE_CHECK_VALUES", "1")   # values are checked on a GPU under the debug switch only
    fn = positions_impl_or_skip(positions_impl_name, device)
    args = {k: v.to(torch_device(device)) if isinstance(v, torch.Tensor) else v for k, v in good_args().items()}
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
