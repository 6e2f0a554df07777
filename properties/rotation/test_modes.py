"""The rotation as engines call it: twice on the same inputs (the same bits back), under
torch.compile, and captured in a CUDA graph replayed with new inputs (rope/harness/rotation/modes.py).  An
implementation declares the modes it runs in (``modes``, default all); a mode it does not declare,
or one the device cannot run, is a skip with its reason."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings, strategies as st

from rope.harness import causes
from rope.harness.rotation.check import checked_run, run_rotation, skip_if_unsupported, write_mode_case_file
from rope.harness.rotation.diagnosis import Diagnosis
from rope.harness.rotation.modes import (GraphCaptureFailed, bit_differences, compiled_implementation, graph_case,
                                         mode_unsupported_reason, stale_replay)
from rope.registry import get_implementation, implementation_record
from properties.strategies import DTYPES, KINDS, rotation_cases, supported_shapes


def _record_or_skip(impl_name: str, mode: str, device: str):
    impl = get_implementation(impl_name)
    record = implementation_record(impl_name, fn=impl)
    reason = mode_unsupported_reason(record, mode, device)
    if reason:
        pytest.skip(reason)
    return impl, record


def _draw_case(data, impl_name, impl, device, **bounds):
    """A case of a dtype, kind and pairing the implementation runs (skipped when it runs none)."""
    variants = [(dtype, kind, neox, narrowed) for dtype in DTYPES for kind in KINDS for neox in (True, False)
                if (narrowed := supported_shapes(impl_name, impl, kind, neox, dtype, device)) is not None]
    if not variants:
        pytest.skip(f"{impl_name} runs none of the probed shapes of any kind on {device}")
    dtype, kind, neox, narrowed = data.draw(st.sampled_from(variants), label="variant")
    case = data.draw(rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, **{**narrowed, **bounds}),
                     label="case")
    skip_if_unsupported(impl_name, impl, case.spec, dtype, device)
    return case


@given(data=st.data())
def test_the_same_inputs_give_the_same_bits(impl_name, device, data):
    # Called again on fresh copies of the same inputs, an implementation must return the same bits
    # (a kernel reading a tile still being filled, or two unordered writers, answers differently:
    # vllm-ascend#16674, 1Cat-vLLM#162).  One that declares deterministic=False is held to the
    # reference on both calls instead, and the run's statistics say so.
    impl, record = _record_or_skip(impl_name, "eager", device)
    case = _draw_case(data, impl_name, impl, device, nonfinite=True)
    first = checked_run(impl_name, impl, case, device)
    if not record.deterministic:
        event("declared nondeterministic: each call held to the reference, not to the other's bits")
        checked_run(impl_name, impl, case, device)
        return
    _, q_again, k_again = run_rotation(impl, case, device)
    problems = bit_differences(first.q_out, q_again, "query") + bit_differences(first.k_out, k_again, "key")
    if problems:
        raise causes.tag(AssertionError(
            f"{impl_name} on {device} is not deterministic ({case.brief()}):\n" + "\n".join(problems)
            + "\n(declare deterministic=False if it is meant to be, and it is held to its bound instead)"),
            cause="nondeterministic", size=case.size, case=case.brief())


# Few examples: every drawn spec is a recompile (Dynamo guards on the spec), seconds each on the CPU.
@pytest.mark.traced
@given(data=st.data())
@settings(max_examples=3)
def test_rotation_matches_reference_under_compile(impl_name, device, data):
    # The same property, the implementation called inside torch.compile (dynamic token counts;
    # fullgraph where it declares it): a rotation skipped, or its inputs guarded wrongly, only in
    # the compiled model (olmoearth_pretrain#600) passes every eager check.
    impl, record = _record_or_skip(impl_name, "compile", device)
    case = _draw_case(data, impl_name, impl, device, max_tokens=24)
    under_compile = compiled_implementation(record, device)
    try:
        checked_run(impl_name, under_compile, case, device, mode="compile")
    except AssertionError as exc:
        # The eager properties pass this case: what differs is the mode (the case file records it,
        # and its replay calls the implementation under torch.compile again).
        fields = causes.failure_of(exc) | {"cause": "compile_only"}
        raise causes.tag(AssertionError(f"under torch.compile: {exc}"), **fields) from None


@pytest.mark.gpu
@given(data=st.data())
@settings(max_examples=8)
def test_graph_replays_match_reference_of_their_own_inputs(impl_name, device, data):
    # Captured once in a CUDA graph, then replayed with new positions, q and k copied into the
    # captured buffers (fewer real tokens, padding rows after them, as a runner pads a graph
    # batch): each replay is held to the reference of its own inputs.  A host-side value taken at
    # capture (candle#3728), or a buffer the warm-up left behind (vllm#33800), replays stale.
    impl, record = _record_or_skip(impl_name, "graph", device)
    case = graph_case(_draw_case(data, impl_name, impl, device, min_tokens=1, max_tokens=64))
    replays = data.draw(st.integers(2, 4), label="replays")
    tokens = [case.num_tokens] + [data.draw(st.integers(1, case.num_tokens), label=f"real tokens {i}")
                                  for i in range(1, replays)]
    try:
        stale, _ = stale_replay(record, case, tokens, device)
    except GraphCaptureFailed as exc:
        raise causes.tag(AssertionError(
            f"{impl_name} on {device} declares the graph mode ({case.brief()}), but {exc} (declare modes "
            f"without 'graph' if it is not meant to be captured)"), cause="graph_capture_failed", size=case.size,
            case=case.brief()) from None
    if stale is not None:
        sentence = stale.sentence(case.num_tokens)
        lines = write_mode_case_file(impl_name, impl, case, device, stale.comparison,
                                     Diagnosis("graph_replay_stale", sentence), mode="graph", replay_tokens=tokens)
        raise causes.tag(AssertionError("\n".join([stale.comparison.message(
            f"{impl_name} on {device}: {sentence}, {case.brief()}"), *lines])),
            cause="graph_replay_stale", size=case.size, case=case.brief())
