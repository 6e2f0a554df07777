"""The position step as a model runner calls it (rope/harness/position_step/modes.py): step after step
on the same buffers, refilled in place with each step's request state, and captured in a CUDA graph
replayed with each step's state copied in.  An implementation declares the modes it runs in
(``modes``, default all); a mode it does not declare, or one the device cannot run, is a skip with
its reason."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings

from properties.position_step.step_sequences import CHUNKED_THEN_DECODE, request_state_sequences
from rope.harness.modes import declared_mode_reason
from rope.harness.position_step.modes import assert_steps_match
from rope.registry import get_positions_implementation, implementation_record, positions_unsupported_reason


def _record_or_skip(name: str, mode: str, device: str):
    """The implementation's record, or a skip with the reason it is not checked in ``mode`` on ``device``."""
    fn = get_positions_implementation(name)
    reason = positions_unsupported_reason(name, fn, device) or \
        declared_mode_reason(implementation_record(name, "position_step", fn), mode, device)
    if reason:
        pytest.skip(reason)
    return fn


# Few examples: each is 2 to 4 calls (the Triton kernel under the CPU's interpreter), 0.3 s for 12 on the CPU.
@given(steps=request_state_sequences())
@example(steps=CHUNKED_THEN_DECODE)
@settings(max_examples=12)
def test_steps_on_reused_buffers_match_reference(positions_impl_name, device, steps):
    # A runner refills its persistent buffers in place each step: every step is held to the
    # reference of its own inputs.  A request state read to the host or copied per buffer on the
    # first call (the first chunk's progress kept for the second) passes every check on fresh tensors.
    fn = _record_or_skip(positions_impl_name, "eager", device)
    assert_steps_match(positions_impl_name, fn, steps, device, mode="eager")


@pytest.fixture
def graph_fn(positions_impl_name, device):
    # Skipped before Hypothesis runs (its explicit example would otherwise print under the skip).
    return _record_or_skip(positions_impl_name, "graph", device)


@pytest.mark.gpu
@given(steps=request_state_sequences())
@example(steps=CHUNKED_THEN_DECODE)
# The fixture only resolves the implementation (or skips): nothing in it changes between examples.
@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_graph_replays_match_reference_of_their_own_inputs(positions_impl_name, device, graph_fn, steps):
    # Captured once in a CUDA graph on static buffers, then replayed with each step's request state
    # copied in (new computed-token counts, chunk lengths within the captured columns, padding after
    # the real tokens, new deltas): each replay is held to the reference of its own inputs.  A value
    # taken on the host at capture (candle#3728), or a buffer the warm-up left (vllm#33800), replays stale.
    assert_steps_match(positions_impl_name, graph_fn, steps, device, mode="graph")
