"""The bodies of the rotation properties that run more than one call of an implementation (a case module:
properties/rotation/test_rotation.py runs them as properties, the project's tests run them on deliberately
broken implementations): one shape through many batches, and text tokens reducing to 1-D RoPE bit for bit."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import strategies as st

from properties.strategies import (KINDS, RotationCase, as_1d, batches_of, build_rotation_inputs, rotation_cases,
                                   seeded_batches_of, supported_shapes)
from rope.harness.campaign_settings import campaign_batches
from rope.harness.rotation.batch import assert_batch_matches_reference
from rope.harness.rotation.check import assert_matches_reference, call_rotation, checked_run, skip_if_unsupported
from rope.implementation import Implementation
from rope.registry import get_implementation


def supported_variants(impl_name, impl, device, dtypes) -> list[tuple]:
    """(dtype, kind, is_neox_style, narrowed rotation_cases arguments) for every variant the
    implementation runs some shape of; the test is skipped when there is none."""
    variants = [(dtype, kind, neox, narrowed) for dtype in dtypes for kind in KINDS for neox in (True, False)
                if (narrowed := supported_shapes(impl_name, impl, kind, neox, dtype, device)) is not None]
    if not variants:
        pytest.skip(f"{impl_name} runs none of the probed shapes of any kind in {', '.join(dtypes)} on {device}")
    return variants


# The most batches the one-shape property draws as a list: Hypothesis draws each batch's five fields,
# so past this the draws cost more than the batches' checks and the list nears the choices an example
# may make (the rotation property's further batches derive from one drawn seed, and may be more).
LISTED_MOST = 127


def listed_batches(env, device: str) -> int:
    """The most batches the one-shape property draws: two on the CPU, where the Triton interpreter
    runs one program at a time; 12 on a GPU, and in a campaign there as many as campaign_batches
    gives a drawn case, up to :data:`LISTED_MOST`."""
    if device == "cpu" or device.startswith("cpu:"):
        return 2
    return max(12, min(LISTED_MOST, campaign_batches(env, device)[1]))


def one_shape_many_batches_match_reference(impl_name, device, dtype, data) -> None:
    """One shape the implementation runs (drawn from ``data``), then 1-12 batches through it (2 on the
    CPU, more in a campaign), held to the reference together: one call each, then one float64
    reference and one bound over all of them (rope.harness.rotation.batch); a batch that fails is
    reported by the one-case check (test_rotation.py's test_one_shape_many_batches_match_reference)."""
    impl = get_implementation(impl_name)
    variants = supported_variants(impl_name, impl, device, [dtype])
    _, kind, neox, narrowed = data.draw(st.sampled_from(variants), label="variant")
    shape = data.draw(rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, nonfinite=True, **narrowed),
                      label="shape")
    skip_if_unsupported(impl_name, impl, shape.spec, dtype, device)
    batches = data.draw(st.lists(batches_of(shape), min_size=1, max_size=listed_batches(os.environ, device)),
                        label="batches")
    assert_batch_matches_reference(impl_name, impl, batches, device)


def more_batches_match_reference(impl_name, impl, case: RotationCase, device, data) -> None:
    """In a campaign on a GPU, further batches through the drawn case's shape (its spec, head counts and
    dtypes; rope.harness.campaign_settings.campaign_batches), held to the reference together
    (rope.harness.rotation.batch, CHECKED_TOGETHER at a time) after the case's own one-case check;
    elsewhere nothing is drawn."""
    low, high = campaign_batches(os.environ, device)
    if not high:
        return
    shape = RotationCase(**{**case.__dict__, "view": "contiguous", "packed_qkv": False})
    batches = data.draw(seeded_batches_of(shape, low, high), label="more batches")
    if shape.cache_dtype is not None:           # batches_of draws the table in q's dtype: keep the case's
        batches = [RotationCase(**{**b.__dict__, "cache_dtype": shape.cache_dtype}) for b in batches]
    assert_batch_matches_reference(impl_name, impl, batches, device)


def check_text_tokens_reduce_to_1d(impl_name, impl, case: RotationCase, device: str) -> None:
    spec_1d = as_1d(case.spec)
    if Implementation.of(impl_name, impl).separate_1d_kernel:
        # Two kernels by design (vLLM: triton_mrope for rows, another kernel for [T]): bit-for-bit
        # agreement is not promised, so each is held to the reference on the same text tokens.
        assert_matches_reference(impl_name, impl, case, device)
        assert_matches_reference(impl_name, impl, RotationCase(**{**case.__dict__, "spec": spec_1d}), device)
        return
    # The rows' call is held to the reference first (and counted as a check), then to the 1-D call.
    run = checked_run(impl_name, impl, case, device)
    q_multi, k_multi = run.q_out, run.k_out
    fresh = build_rotation_inputs(case, device)
    q_1d, k_1d = call_rotation(impl, spec_1d, fresh.positions[0].contiguous(), fresh.query, fresh.key, fresh.cache)
    assert torch.equal(q_multi.cpu(), q_1d.cpu())
    if case.num_kv_heads:
        assert torch.equal(k_multi.cpu(), k_1d.cpu())
