"""The rotation's backward, for an implementation that declares ``autograd`` (a training kernel):
torch.autograd through it is held to the float64 reference VJP (rope/harness/rotation/backward.py):
the forward, the gradients of query and key under the rotation's own bound, the upstream gradient
left unwritten, and, where it declares ``cache_grad``, the gradient of the cos/sin cache.  An
implementation that does not declare autograd is a skip that says so, never a pass."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st

from properties.rotation.backward_cases import model_cases
from properties.strategies import DTYPES, KINDS, rotation_cases, supported_shapes
from rope.harness.rotation.backward import assert_backward_matches_reference, backward_unchecked_reason
from rope.harness.rotation.check import skip_if_known_defect, skip_if_unsupported
from rope.registry import get_implementation, implementation_record

pytestmark = pytest.mark.backward

# Small cases: Triton's interpreter runs a program per token and head block, forward and backward.
MAX_TOKENS, HEAD_SIZES, MAX_Q_HEADS, MAX_KV_HEADS = 4, (16, 32, 64), 3, 2


@pytest.fixture
def differentiable(impl_name):
    """The implementation under test, when it declares autograd; else the test is skipped, saying so
    (before Hypothesis runs: a skip, not a failing example).  Nothing in it to reset between examples."""
    impl = get_implementation(impl_name)
    reason = backward_unchecked_reason(implementation_record(impl_name, fn=impl))
    if reason:
        pytest.skip(reason)
    return impl


def _draw_case(data, impl_name, impl, device):
    """Every kind of map, both pairings, partial widths, every dtype the implementation runs (NaN and
    infinities planted in the inputs and the upstream gradient too); a few tokens and heads."""
    variants = [(dtype, kind, neox, narrowed) for dtype in DTYPES for kind in KINDS for neox in (True, False)
                if (narrowed := supported_shapes(impl_name, impl, kind, neox, dtype, device)) is not None]
    if not variants:
        pytest.skip(f"{impl_name} runs none of the probed shapes of any kind on {device}")
    dtype, kind, neox, narrowed = data.draw(st.sampled_from(variants), label="variant")
    heads = tuple(h for h in narrowed.get("head_sizes", HEAD_SIZES) if h in HEAD_SIZES) or \
        narrowed["head_sizes"][:1]
    case = data.draw(rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, max_tokens=MAX_TOKENS,
                                    nonfinite=True, **{**narrowed, "head_sizes": heads}), label="case")
    return dataclasses.replace(case, num_q_heads=min(case.num_q_heads, MAX_Q_HEADS),
                               num_kv_heads=min(case.num_kv_heads, MAX_KV_HEADS))


def _with_model_examples(test):
    """An @example per distinct rotation of the catalogued models (properties/rotation/backward_cases.py),
    bf16, 2 tokens, one query head and one key head; the cache differentiated too where declared."""
    for case in reversed(model_cases("bfloat16", num_tokens=2, num_q_heads=1)):
        test = example(case=case, data=None)(test)
    return test


# Few examples: each is a forward and a backward (under the interpreter on a CPU, seconds for a big head).
@given(case=st.none(), data=st.data())
@_with_model_examples
@settings(max_examples=8, suppress_health_check=[*settings.default.suppress_health_check,
                                                 HealthCheck.function_scoped_fixture])
def test_backward_matches_reference_vjp(impl_name, device, differentiable, case, data):
    # ``case`` is a model's (@example) or None: then drawn from what the implementation runs.
    # Rejects: no gradient (None, or an output without a graph: an in-place kernel autograd never
    # sees), the upstream gradient rotated by +θ, by another row's angle or pairing, pass-through
    # gradients touched, a rounding worse than the forward's, the upstream gradient written in place
    # (Liger-Kernel 0.8.5), a cache gradient read from inputs the forward overwrote.
    impl = differentiable
    if case is None:
        case = _draw_case(data, impl_name, impl, device)
    skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
    skip_if_known_defect(impl_name, impl, case, device)
    wrt_cache = implementation_record(impl_name, fn=impl).cache_grad and (data is None or data.draw(
        st.booleans(), label="cache differentiated"))
    if wrt_cache:
        event("the cos/sin cache differentiated")
    assert_backward_matches_reference(impl_name, impl, case, device, wrt_cache=wrt_cache)
