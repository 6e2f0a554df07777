"""Position-id implementations against ``reference.prompt_positions`` (docs/spec.md §4).

Every test takes ``position_ids_impl_name``: the implementations named by
``--rope-position-ids-impl`` (transformers, vllm, sglang, or ``package.module:callable``), by default
transformers where it is installed.  Each prompt goes through the implementation (batched where
its API is, padded left or right) and each result must equal the reference, or, where the
implementation declares a documented upstream departure that applies (``known_deviations``), the
exact value that departure is pinned to give.

1. ``test_known_bug_prompts_match``: a fixed prompt for every position-id bug this field has
   shipped, and for the models' grid limits; the fastest way to catch a regression.
2. ``test_position_ids_match_reference``: drawn batches per family (properties/prompt_strategies.py).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from properties.position_ids.known_prompts import KNOWN_BUG_PROMPTS
from properties.prompt_strategies import LONG_PROMPT, batches
from rope.prompts import FAMILIES, PromptBatch
from rope.harness.position_ids.implementations import get_position_ids_implementation, unsupported_reason
from rope.harness.position_ids.check import assert_matches


def _implementation(name: str, family: str):
    fn = get_position_ids_implementation(name)
    reason = unsupported_reason(name, fn, family)
    if reason:
        pytest.skip(reason)
    return fn


def _runnable(name: str, fn, family: str, batch: PromptBatch) -> PromptBatch | None:
    """The batch less the prompts ``fn`` says it cannot express (transformers' one
    use_audio_in_video flag per call), or None when none is left."""
    keep = [i for i, p in enumerate(batch.prompts) if not unsupported_reason(name, fn, family, p)]
    if not keep:
        return None
    return PromptBatch(tuple(batch.prompts[i] for i in keep), tuple(batch.pads[i] for i in keep), batch.side)


@pytest.mark.fixed_cases
@pytest.mark.parametrize("family, batch", [pytest.param(f, b, id=i) for i, f, b in KNOWN_BUG_PROMPTS])
def test_known_bug_prompts_match(position_ids_impl_name, family, batch):
    fn = _implementation(position_ids_impl_name, family)
    runnable = _runnable(position_ids_impl_name, fn, family, batch)
    if runnable is None:
        pytest.skip(unsupported_reason(position_ids_impl_name, fn, family, batch.prompts[0]))
    assert_matches(position_ids_impl_name, fn, family, runnable)


@pytest.mark.parametrize("family", FAMILIES)
@settings(deadline=None)
@given(data=st.data())
def test_position_ids_match_reference(position_ids_impl_name, family, data):
    fn = _implementation(position_ids_impl_name, family)
    batch = _runnable(position_ids_impl_name, fn, family,
                      data.draw(batches(family=family, max_leading_text=LONG_PROMPT), label="batch"))
    assume(batch is not None)
    for key in assert_matches(position_ids_impl_name, fn, family, batch):
        event(f"known deviation: {key}")
