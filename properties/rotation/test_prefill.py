"""Prefill-size batches: the token counts where kernels switch code paths.

The rotation properties draw up to 48 tokens; an engine's prefill chunk is 2,048 to 16,384
tokens, and that is where kernels change tiles, grids and kernels (FlashInfer picks its kernel
by token count, flashinfer#609 -> #619; grids overflow 65,535 programs in a dimension, vllm#43684;
32-bit offsets overflow, Liger#804).  Every implementation is held to the reference

- at the powers of two from 1,024 to 16,384, each +-1, one layout / pairing / dtype per count,
  cycling, so that every combination meets a large count (explicit, every profile);
- at each token count it declares a switch at (``switch_tokens``, the first count of a new
  path), +-1;
- on drawn prefill cases of 1,024 to 16,384 tokens and the boundaries, any layout, pairing,
  dtype and layout of q/k, as many as fit the property's time budget;
- at token x head products (tokens x (query + key heads), where fused kernels switch, vllm#51049)
  of at least 2^15 on every layout, pairing and rotary width, and on both sides of each product it
  declares a switch at (``switch_token_heads``).

A boundary case whose turn falls on a layout (or, of the table-read maps, a map) the implementation
does not run takes the next one along the cycle that it runs, so a kernel of chunked and
interleaved sections only meets every boundary, 16,384 tokens included, on the CPU too.

On the CPU (Triton under its interpreter runs one program at a time, ~10 ms each) the cases have
one query head of 32 channels and at most one kv head, and from 2,048 tokens a boundary (a
power of two, a declared switch) runs without its +-1: they differ from it only by a partial last
tile, the code every boundary's +-1 below runs (an interpreted case there takes 10-40 s); on a
GPU, real head counts and every boundary.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from hypothesis import Phase, given, settings

from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.harness import report
from rope.harness.rotation.check import (angle_source, assert_matches_reference, call_rotation, reference_rotation,
                                         skip_if_unsupported)
from rope.harness.rotation.cases import build_rotation_inputs
from rope.harness.plugin import default_profile
from rope.harness.rotation.bound import compare_rotation
from rope.registry import get_implementation, switch_token_heads, switch_tokens, unsupported_reason, working_precision
from rope.spec import RopeSpec
import reference
from properties.rotation.prefill_cases import (
    POWER_OF_TWO_LOG2,
    TOKEN_HEAD_PRODUCT,
    boundary_case,
    declared_switch_counts,
    declared_token_head_cases,
    power_of_two_counts,
    small_heads,
    supported_boundary_case,
    supported_token_head_case,
    token_head_variants,
)
from properties.strategies import (
    DTYPES,
    KINDS,
    POWER_OF_TWO_BOUNDARIES,
    RotationCase,
    boundary_token_counts,
    prefill_cases,
    prefill_token_counts,
)

# The prefill sizes: a campaign leaves them out by this marker (rope.harness.campaign).
pytestmark = pytest.mark.prefill

# Seconds of implementation + reference time the drawn prefill property may spend per test
# (the explicit boundaries always run); ROPE_PREFILL_BUDGET overrides.
PREFILL_BUDGET_S = {"cpu": 20.0}
DEFAULT_PREFILL_BUDGET_S = 120.0
# Where a drawn prefill failure is reported as drawn, not shrunk: on the CPU, where Triton kernels
# run under the interpreter, each shrink step is another 1-7 s launch of 1,024-16,384 tokens, and
# shrinking a token count moves it towards 1,024, below the boundaries where paths switch (a
# 12,821-token GPT-J failure of a path switched at 4,096 tokens: 20 s of shrinking reached 10,947,
# and the run reported 44 s later).  The device decides, not the implementation: a torch one on the
# CPU is reported unshrunk too.  The failure's diagnosis names the tokens and channels that differ,
# and its case file replays it on a GPU, where the property shrinks.
NO_SHRINK_DEVICES = ("cpu",)


def _check(impl_name, impl, case, device) -> bool:
    """Hold ``impl`` to the reference on ``case``; False when it does not support the case.  The
    run report learns the implementation's declared switches once it ran on the device."""
    if unsupported_reason(impl_name, impl, case.spec, DTYPES[case.dtype], device):
        return False
    thresholds = switch_tokens(impl_name, impl)
    if thresholds:
        report.record(kind="switches", impl=impl_name, device=device, thresholds=list(thresholds))
    assert_matches_reference(impl_name, impl, case, device)
    return True


POWER_OF_TWO_PARAMS = [pytest.param(k, id=f"{1 << k}") for k in POWER_OF_TWO_LOG2]


@pytest.mark.fixed_cases
@pytest.mark.boundary
@pytest.mark.parametrize("log2", POWER_OF_TWO_PARAMS)
def test_power_of_two_boundaries_match_reference(impl_name, device, log2):
    # 2^k, 2^k + 1, 2^k - 1 tokens, three different configurations.  Rejects a path switched at a
    # power of two (a tile, a grid or a kernel chosen by token count) that pairs, maps or indexes wrongly.
    # The power itself first: a path switched at 2^k starts there, so a run stopping at its first
    # failure hears of it one interpreted case (seconds at 4096 tokens) sooner.
    impl = get_implementation(impl_name)
    ran = 0
    for num_tokens in power_of_two_counts(log2, device):
        index = POWER_OF_TWO_BOUNDARIES.index(num_tokens)
        ran += _check(impl_name, impl, supported_boundary_case(impl_name, impl, index, num_tokens, device), device)
    if not ran:
        pytest.skip(f"{impl_name} supports none of the boundary cases at {1 << log2} tokens on {device}")


@pytest.mark.fixed_cases
@pytest.mark.boundary
def test_declared_switches_match_reference(impl_name, device):
    # Each count an implementation declares it switches at, +-1 (the Triton kernel: 2-head programs
    # for interleaved sections up to 16 tokens, PDL off above 64 and on again from 128 to 256, large
    # tiles and the heads-fastest grid from 128, the per-lane gather's tiles at 192 and above 4096,
    # evict_first off and key programs of the key's head count above 16,384).
    impl = get_implementation(impl_name)
    thresholds = switch_tokens(impl_name, impl)
    if not thresholds:
        pytest.skip(f"{impl_name} declares no switch_tokens")
    counts = declared_switch_counts(thresholds, device)
    ran = 0
    for index, num_tokens in enumerate(counts):
        ran += _check(impl_name, impl, supported_boundary_case(impl_name, impl, index, num_tokens, device), device)
    if not ran:
        pytest.skip(f"{impl_name} supports none of the cases at its declared switches on {device}")


@pytest.mark.fixed_cases
@pytest.mark.parametrize("kind", KINDS)
def test_token_head_products_match_reference(impl_name, device, kind):
    # NeoX and GPT-J, full and partial rotary, each at tokens x heads >= 2^15 (1,024 tokens x 32
    # heads on the CPU).  Rejects a path chosen by the product that pairs, maps or indexes wrongly.
    impl = get_implementation(impl_name)
    ran = sum(_check(impl_name, impl, supported_token_head_case(impl_name, impl, kind, neox, partial, index, device),
                     device)
              for index, (neox, partial) in enumerate(token_head_variants(kind, device)))
    if not ran:
        pytest.skip(f"{impl_name} supports none of the {kind} cases past {TOKEN_HEAD_PRODUCT} token-heads on {device}")


@pytest.mark.fixed_cases
def test_declared_token_head_switches_match_reference(impl_name, device):
    # Each product an implementation declares it switches at (``switch_token_heads``): the last
    # token count under it and the first at it, every pairing and rotary width.
    impl = get_implementation(impl_name)
    thresholds = switch_token_heads(impl_name, impl)
    if not thresholds:
        pytest.skip(f"{impl_name} declares no switch_token_heads")
    ran = sum(_check(impl_name, impl, case, device) for _, case in declared_token_head_cases(thresholds, device))
    if not ran:
        pytest.skip(f"{impl_name} supports none of the cases at its declared token x head switches on {device}")


def _budget(device: str) -> float:
    raw = os.environ.get("ROPE_PREFILL_BUDGET")
    if raw:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"ROPE_PREFILL_BUDGET={raw!r}: must be a number of seconds") from None
    return PREFILL_BUDGET_S.get(device, DEFAULT_PREFILL_BUDGET_S)


def test_prefill_batches_match_reference(impl_name, device):
    # Drawn prefill cases (1,024 to 16,384 tokens and every boundary above): as many examples as
    # the profile asks, or as fit the budget at the cost of a 1,024-token probe, at least 3.
    impl = get_implementation(impl_name)
    thresholds = switch_tokens(impl_name, impl)
    probe = boundary_case(1, 1024, device)
    start = time.perf_counter()
    if _check(impl_name, impl, probe, device):
        per_token = (time.perf_counter() - start) / probe.num_tokens
    else:
        per_token = 0.0
    mean_tokens = sum(boundary_token_counts(thresholds)) / len(boundary_token_counts(thresholds))
    affordable = int(_budget(device) / max(per_token * mean_tokens, 1e-9))
    examples = max(3, min(settings.default.max_examples, affordable))
    phases = settings.default.phases
    if device in NO_SHRINK_DEVICES:
        phases = tuple(phase for phase in phases if phase != Phase.shrink)

    @settings(max_examples=examples, phases=phases)
    @given(case=prefill_cases(tokens=prefill_token_counts(thresholds), small_heads=small_heads(device)))
    def prefill_matches_reference(case):
        skip_if_unsupported(impl_name, impl, case.spec, case.dtype, device)
        assert_matches_reference(impl_name, impl, case, device)

    prefill_matches_reference()


# ------------------------------------------------------------------ beyond the grid limit and 2^31 elements
# (tokens, query heads, kv heads): 70,000 tokens at 28/4 heads of 128 launch 175,000 programs on the
# harness's kernel (past the 65,535 of a grid dimension); 262,160 tokens at 64 heads of 128 hold
# 2^31 + 131,072 elements in q (4 GiB of bf16), past every 32-bit element offset.
HUGE_CASES = [pytest.param(70_000, 28, 4, id="grid-past-65535"),
              pytest.param(262_160, 64, 8, id="q-past-2^31-elements"),
              # 4 key heads: the Triton kernel's key programs then take 4 heads x twice the tokens,
              # and q its own program order (rope/triton/rotary_plan.py, BLOCK_HK): 64-bit offsets there too.
              pytest.param(262_160, 64, 4, id="q-past-2^31-elements-4-kv-heads")]
HUGE_CHUNK_TOKENS = 8192


def assert_matches_reference_in_chunks(impl_name: str, impl, case: RotationCase, device: str) -> None:
    """The implementation on the whole case, the float64 reference and the comparison a chunk of
    tokens at a time (the reference of 2^31 elements would not fit)."""
    x = build_rotation_inputs(case, device)
    query, key = x.query.clone(), None if x.key is None else x.key.clone()    # untouched copies
    q_out, k_out = call_rotation(impl, case.spec, x.positions, x.query, x.key, x.cache)
    for start in range(0, case.num_tokens, HUGE_CHUNK_TOKENS):
        rows = slice(start, min(start + HUGE_CHUNK_TOKENS, case.num_tokens))
        positions = x.positions[..., rows]
        q_in, k_in = query[rows], None if key is None else key[rows]
        ref_q, ref_k = reference_rotation(impl, case.spec, positions, q_in, k_in, x.cache)
        result = compare_rotation(case.spec, positions, q_in, k_in, x.cache, q_out[rows],
                                  None if k_out is None else k_out[rows], ref_q.cpu(),
                                  None if ref_k is None else ref_k.cpu(), working_precision(impl),
                                  device=q_out.device, angles=angle_source(impl))
        assert result.ok, result.message(f"{impl_name} on {device} does not match the reference on tokens "
                                         f"{rows.start}..{rows.stop - 1} of {case.num_tokens}\ncase: {case}")


@pytest.mark.fixed_cases
@pytest.mark.slow
@pytest.mark.parametrize("num_tokens, q_heads, kv_heads", HUGE_CASES)
def test_huge_batches_match_reference_in_chunks(impl_name, device, num_tokens, q_heads, kv_heads, request):
    # Rejects a grid dimension that overflows (vllm#43684) and 32-bit offsets (Liger#804).  GPU only
    # (the CPU interpreter would take hours), deep profile only (a minute and ~14 GiB of GPU memory).
    if device == "cpu":
        pytest.skip("GPU only: 2^31 elements are hours of the Triton interpreter")
    if (request.config.getoption("hypothesis_profile", None) or default_profile()) != "deep":
        pytest.skip("deep profile only (--hypothesis-profile deep): a minute and ~14 GiB per case")
    impl = get_implementation(impl_name)
    spec = RopeSpec(128, 128, True, (16, 24, 24), max_position=32768)
    case = RotationCase(spec, num_tokens, q_heads, kv_heads, "bfloat16", "uniform", False, 0)
    skip_if_unsupported(impl_name, impl, spec, case.dtype, device)
    assert_matches_reference_in_chunks(impl_name, impl, case, device)


# The cache past 2^31 elements: the Triton kernel indexes the cache in 32 bits unless an offset could
# pass 2^31 - 1 (rope/triton/rotary_kernel.py, CACHE_I64).  The cache is a view that starts 2^31 elements
# into a zeroed buffer, so an offset that wrapped in 32 bits reads zeros inside the buffer (a wrong
# answer, not a fault); only its last HUGE_CACHE_ROWS_USED rows hold cos/sin, and the positions point there.
HUGE_CACHE_START = 2**31
HUGE_CACHE_ROWS = (2**31 + 2**20) // 256          # rotary_dim 256 (RopeSpec allows up to 2^24 rows)
HUGE_CACHE_ROWS_USED = 4096


@pytest.mark.fixed_cases
@pytest.mark.slow
def test_a_cache_past_2_31_elements_is_indexed_in_64_bits(impl_name, device, request):
    if device == "cpu":
        pytest.skip("GPU only: the cache is 4 GiB (and 4 GiB before it)")
    if (request.config.getoption("hypothesis_profile", None) or default_profile()) != "deep":
        pytest.skip("deep profile only (--hypothesis-profile deep): ~9 GiB of GPU memory")
    impl = get_implementation(impl_name)
    spec = RopeSpec(256, 256, True, (32, 48, 48), max_position=HUGE_CACHE_ROWS)
    skip_if_unsupported(impl_name, impl, spec, "bfloat16", device)
    dev = torch_device(device)
    buffer = torch.zeros(HUGE_CACHE_START + HUGE_CACHE_ROWS * 256, dtype=torch.bfloat16, device=dev)
    cache = buffer[HUGE_CACHE_START:].view(HUGE_CACHE_ROWS, 256)
    small = RopeSpec(256, 256, True, (32, 48, 48), max_position=HUGE_CACHE_ROWS_USED)
    cache[-HUGE_CACHE_ROWS_USED:] = cos_sin_cache(small, torch.bfloat16, dev)
    gen = torch.Generator().manual_seed(11)
    tokens = 300
    positions = torch.randint(HUGE_CACHE_ROWS - HUGE_CACHE_ROWS_USED, HUGE_CACHE_ROWS, (3, tokens), generator=gen)
    query = torch.randn(tokens, 8 * 256, generator=gen).to(torch.bfloat16)
    key = torch.randn(tokens, 256, generator=gen).to(torch.bfloat16)
    positions, query, key = positions.to(dev), query.to(dev), key.to(dev)
    q_out, k_out = call_rotation(impl, spec, positions, query.clone(), key.clone(), cache)
    ref_q, ref_k = reference.rotate(spec, positions, query, key, cache)
    result = compare_rotation(spec, positions, query, key, cache, q_out, k_out, ref_q.cpu(), ref_k.cpu(),
                              working_precision(impl), device=q_out.device)
    del buffer, cache
    assert result.ok, result.message(f"{impl_name} on {device}: a cache of {HUGE_CACHE_ROWS} x 256 elements")
