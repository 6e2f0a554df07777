"""The reference position step (reference/runner_positions.py) on its own: a chunked prefill
concatenates to the prompt's positions and decodes with the delta, and every bad input of the
suite's table is a ValueError naming the field."""

from __future__ import annotations

import pytest
import torch

import reference
from properties.position_step.known_steps import CHUNK_1, CHUNK_2, DECODE, ERRORS, PROMPT, good_args


def test_chunked_prefill_concatenates_to_prompt_then_decodes_with_delta():
    first = reference.prepare_positions(**CHUNK_1.tensors())
    second = reference.prepare_positions(**CHUNK_2.tensors())
    prompt = torch.tensor(PROMPT).expand(3, -1)
    assert torch.equal(torch.cat([first, second], 1), prompt)
    assert reference.prepare_positions(**DECODE.tensors()).tolist() == [[29]] * 3   # 40 + (28 + 1 - 40)


@pytest.mark.parametrize("error", list(ERRORS), ids=list(ERRORS))
def test_reference_rejects_bad_position_input(error):
    change, pattern = ERRORS[error]
    with pytest.raises(ValueError, match=pattern):
        reference.prepare_positions(**{**good_args(), **change})
