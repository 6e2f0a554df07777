"""The position step across a scheduler's sequence of steps (the state machine: properties/position_step/
scheduler.py), for every position implementation on every device, and a known bug's fixed case."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from properties.position_step.scheduler import FAMILIES, MAX_MODEL_LEN, make_machine
from reference.position_ids import decode_positions, prompt_positions
from rope.devices import synchronize, torch_device
from rope.prompts import Image, Prompt, Text
from rope.registry import get_positions_implementation, positions_unsupported_reason


@pytest.mark.parametrize("family", FAMILIES)
def test_scheduler_positions_match_whole_sequence(positions_impl_name, device, family):
    fn = get_positions_implementation(positions_impl_name)
    reason = positions_unsupported_reason(positions_impl_name, fn, device)
    if reason:
        pytest.skip(reason)
    machine = make_machine(positions_impl_name, device, family)
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=25))


@pytest.mark.fixed_cases
@pytest.mark.known_bug
def test_known_bug_triggers_chunked_prefill_keeps_the_prompt_delta(positions_impl_name, device):
    # A prompt prefilled in two chunks whose last chunk is text only, then one decode step: the
    # decode position must carry the whole prompt's delta (vLLM computes it once per prompt), not
    # a delta worked out from the last chunk alone.  The state machine above finds this too, after
    # a search; this fixed case finds it at once.  Qwen2-VL: Text(2), a 2x2-merged image between
    # its vision start/end tokens, Text(3): t = 0 1 | 2 3 3 3 3 5 | 6 7 8, 11 tokens, delta -2; the
    # text-only chunk alone would give +6.
    fn = get_positions_implementation(positions_impl_name)
    reason = positions_unsupported_reason(positions_impl_name, fn, device)
    if reason:
        pytest.skip(reason)
    family, dims = "qwen2_vl", 3
    pp = prompt_positions(family, Prompt((Text(2), Image((1, 4, 4)), Text(3))))
    assert pp.length == 11 and pp.delta == -2      # the case is what it says
    dev = torch_device(device)
    i32 = dict(dtype=torch.int32, device=dev)
    table = torch.full((dims, MAX_MODEL_LEN), -1, **i32)
    table[:, :pp.length] = pp.positions.to(table)
    delta, lens = torch.tensor([pp.delta], **i32), torch.tensor([pp.length], **i32)
    expected = torch.cat([pp.positions, decode_positions(pp.length, 1, pp.delta, dims)], dim=1)
    computed = 0
    for n in (8, 3, 1):                                  # image chunk, text-only chunk, decode
        out = torch.full((dims, n), -9, dtype=torch.int64, device=dev)
        fn(table, delta, torch.tensor([0], **i32), torch.tensor([0, n], **i32), lens,
           torch.tensor([computed], **i32), dims, out)
        synchronize(device)
        assert torch.equal(out.cpu(), expected[:, computed:computed + n]), (
            f"tokens {computed}..{computed + n - 1}: prepared {out.cpu().tolist()}, "
            f"whole-sequence {expected[:, computed:computed + n].tolist()}")
        computed += n
