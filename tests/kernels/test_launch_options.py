"""Launch options of the Triton rotation kernel change speed, never bits.

``launch_rotary``'s tiles (block_t, block_h, num_warps), the q/k split, the 3-D cos/sin gather,
programmatic dependent launch (``pdl``), the q/k eviction hint, the grid order (``heads_fastest``),
the key programs' head block (``block_hk``), the bf16 rounding (by hand, or the compiled convert: GPU
only), the cache's 64-bit offsets and where the positions are read (after the PDL wait, before it, or
guessed before it and checked after: ``positions_read``) are picked per size from the H200 sweeps or by
the caller; the rotation properties run only the defaults, so a configuration a sweep prefers
next could hide a masking or indexing bug (a token tile that runs past the batch, a head block
past the heads, a rounding that differs).  Every drawn configuration
must give the default launch's output bit for bit (the math per element is the same fp32 sequence;
only which program computes it changes).  On the CPU the interpreter runs it (pdl falls back to an
ordinary launch there); on a GPU, the compiled kernels.  The large-batch defaults themselves are
held to the reference by properties/rotation/test_rotation.py::test_large_batches_match_reference.

The position kernel's ``block``, ``splits`` (programs per request) and ``pdl`` likewise: drawn small here
so that one request spans several blocks and several programs, held to the reference.
"""

from __future__ import annotations

import pytest
import torch
import triton
from hypothesis import example, given, settings, strategies as st

import reference
from properties.strategies import (OUT_SENTINEL, KINDS, RaggedBatch, RotationCase, build_rotation_inputs,
                                   ragged_batches, rope_specs, rotation_cases)
from rope.devices import synchronize, torch_device
from rope.devices import is_interpreter, triton_runs_on
from rope.models import load_models
from rope.triton.grid import cdiv, next_power_of_2
from rope.triton.positions import launch_prepare_positions
from rope.spec import RopeSpec
from rope.triton.rotary import launch_rotary
from rope.triton.rotary_plan import MIN_BLOCK_F, SPECULATE_MAX_TOKENS, default_plan
from rope.triton.targets import INTERPRETER, TARGETS, cuda_target

pytestmark = pytest.mark.stack      # meets the installed torch and Triton: CI runs it on every stack (.ci/run)

LAUNCH_OPTIONS = st.fixed_dictionaries({
    "block_t": st.sampled_from([1, 2, 4, 8]),
    "block_h": st.sampled_from([1, 2, 4, 8, 16]),
    "num_warps": st.sampled_from([1, 2, 4, 8]),
    "split_qk": st.booleans(),
    "gather_3d": st.booleans(),
    "pdl": st.booleans(),
    "evict_first": st.booleans(),
    "heads_fastest": st.booleans(),
    "bf16_rounding": st.sampled_from(["by_hand", "convert"]),
    "key_head_shift": st.sampled_from([None, 0, 1, 2, 3, 4]),    # block_hk = block_h >> shift
    "cache_offsets_64": st.booleans(),
    # Where the positions are read.  "before_wait" is safe here: the launch before does not write them.
    # "wrong_guesses": speculation whose guesses are wrong for some tokens (out of range for some),
    # the case a GPU only meets in a race with the kernel before.
    "positions_read": st.sampled_from(["default", "after_wait", "before_wait", "speculate", "wrong_guesses"]),
})


def wrong_guesses(positions: torch.Tensor) -> torch.Tensor:
    """Guesses of ``positions`` that are right for every third token, off by one, negative or past any
    cache (2^40) for the others: the reload must take every one of them back to the true row."""
    guesses = positions.clone()
    guesses[..., 1::3] += 1
    guesses[..., 2::3] = torch.where(guesses[..., 2::3] % 2 == 0, -7, 2**40)
    return guesses


def positions_read_options(mode: str, positions: torch.Tensor) -> dict:
    return {"default": {}, "after_wait": {"speculate_positions": False},
            "before_wait": {"positions_before_wait": True}, "speculate": {"speculate_positions": True},
            "wrong_guesses": {"position_guesses": wrong_guesses(positions)}}[mode]
QWEN72 = load_models()["qwen2.5-vl-72b"].spec


@settings(deadline=None, max_examples=40)
@given(case=st.sampled_from(KINDS).flatmap(
           lambda kind: rotation_cases(dtype="bfloat16", kind=kind, min_tokens=1, max_tokens=12)),
       options=LAUNCH_OPTIONS)
@example(case=RotationCase(spec=QWEN72, num_tokens=3, num_q_heads=8, num_kv_heads=1, dtype="bfloat16",
                           positions_kind="grid"),
         options=dict(block_t=2, block_h=16, num_warps=4, split_qk=False, gather_3d=True, pdl=True))
@example(case=RotationCase(spec=load_models()["glm-4.1v-9b"].spec, num_tokens=11, num_q_heads=6, num_kv_heads=2,
                           dtype="bfloat16", positions_kind="grid"),
         options=dict(block_t=2, block_h=8, num_warps=4, split_qk=True, gather_3d=True, heads_fastest=True,
                      key_head_shift=2))
@example(case=RotationCase(spec=load_models()["qwen3-vl-8b"].spec, num_tokens=7, num_q_heads=4, num_kv_heads=2,
                           dtype="bfloat16", positions_kind="grid"),
         options=dict(block_t=1, block_h=2, num_warps=4, pdl=True, positions_read="wrong_guesses"))
@example(case=RotationCase(spec=QWEN72, num_tokens=5, num_q_heads=8, num_kv_heads=1, dtype="bfloat16",
                           positions_kind="grid"),
         options=dict(block_t=4, block_h=4, num_warps=2, gather_3d=True, positions_read="wrong_guesses"))
def test_launch_options_give_the_default_bits(device, case, options):
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    if is_interpreter():      # its fp32 -> bf16 convert truncates: a compiled kernel's rounding only
        options = {**options, "bf16_rounding": "by_hand"}
    options = dict(options)
    shift = options.pop("key_head_shift", None)
    if shift is not None:
        options["block_hk"] = max(1, options["block_h"] >> shift)
    inputs = build_rotation_inputs(case, device)
    options.update(positions_read_options(options.pop("positions_read", "default"), inputs.positions))
    q0, k0 = inputs.query.clone(), inputs.key.clone() if inputs.key is not None else None
    launch_rotary(case.spec, inputs.positions, q0, k0, inputs.cache)
    q1, k1 = inputs.query.clone(), inputs.key.clone() if inputs.key is not None else None
    launch_rotary(case.spec, inputs.positions, q1, k1, inputs.cache, **options)
    assert torch.equal(q1.view(torch.int16), q0.view(torch.int16)), options
    if k0 is not None:
        assert torch.equal(k1.view(torch.int16), k0.view(torch.int16)), options


# One 40-token prefill chunk = blocks 0..2 of 16 over 2 programs: program 0 writes blocks 0 and 2
# (a second round of its loop), program 1 block 1.
LONG_CHUNK = RaggedBatch(3, tuple(range(3 * 64)), (0,), (64,), (5,), (0,), (40,), 3)


@settings(deadline=None, max_examples=30)
@given(batch=ragged_batches(max_reqs=4, max_model_len=160),
       block=st.sampled_from([16, 32, 64, 256]), splits=st.none() | st.integers(1, 6), pdl=st.booleans())
@example(batch=LONG_CHUNK, block=16, splits=2, pdl=True)
def test_position_launch_options_match_reference(device, batch, block, splits, pdl):
    if not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here")
    args = batch.tensors(device)
    out = torch.full((batch.num_dims, batch.num_tokens + batch.padding), OUT_SENTINEL, dtype=torch.int64,
                     device=torch_device(device))
    launch_prepare_positions(**args, out=out, block=block, splits=splits, pdl=pdl)
    synchronize(device)
    expected = reference.prepare_positions(**batch.tensors("cpu"))
    n = batch.num_tokens
    assert torch.equal(out[:, :n].cpu(), expected), (block, splits)
    assert torch.all(out[:, n:].cpu() == OUT_SENTINEL), f"wrote past the step's {n} tokens ({block=}, {splits=})"


def test_position_guesses_must_be_laid_out_like_the_positions():
    positions, q, k, cache = (torch.zeros(3, 4, dtype=torch.long), torch.zeros(4, 128), torch.zeros(4, 128),
                              torch.zeros(8, 128))
    for guesses in (torch.zeros(3, 5, dtype=torch.long), torch.zeros(3, 4, dtype=torch.int32),
                    torch.zeros(4, 3, dtype=torch.long).t()):
        with pytest.raises(ValueError, match=r"position_guesses: must be shaped, strided, typed and placed like positions"):
            launch_rotary(QWEN72, positions, q, k, cache, position_guesses=guesses)
    with pytest.raises(ValueError, match=r"position_guesses: given with speculate_positions=False"):
        launch_rotary(QWEN72, positions, q, k, cache, position_guesses=positions.clone(), speculate_positions=False)
    with pytest.raises(ValueError, match=r"speculate_positions=True with positions_before_wait=True"):
        launch_rotary(QWEN72, positions, q, k, cache, speculate_positions=True, positions_before_wait=True)


@pytest.mark.parametrize("tokens, speculates", [(1, True), (SPECULATE_MAX_TOKENS, True),
                                                (SPECULATE_MAX_TOKENS + 1, False), (200, False)])
def test_the_default_launch_guesses_positions_where_it_waits_for_the_kernel_before(tokens, speculates):
    # Speculation only pays where a PDL wait stands between the guess and the check; recorded with
    # PDL available (compile_offline's recorder), on meta tensors.
    meta = torch.device("meta")
    positions = torch.zeros(3, tokens, dtype=torch.long, device=meta)
    q, k = (torch.empty(tokens, n * 128, device=meta, dtype=torch.bfloat16) for n in (8, 1))
    cache = torch.empty(4096, 128, device=meta, dtype=torch.bfloat16)
    constexprs = _recorded_constexprs(positions, q, k, cache)
    assert constexprs["SPECULATE"] is speculates and constexprs["EARLY_POSITIONS"] is False
    assert _recorded_constexprs(positions, q, k, cache, positions_before_wait=True)["SPECULATE"] is False
    assert _recorded_constexprs(positions, q, k, cache, pdl=False)["SPECULATE"] is False


@settings(deadline=None, max_examples=60)
@given(data=st.data(), kind=st.sampled_from(KINDS), dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
@example(data=None, kind="chunked3", dtype=torch.bfloat16)      # Qwen2.5-VL-72B at TP 1 and 8, 1 and 2-64 tokens
def test_the_speculating_band_compiles_one_kernel_per_shape(data, kind, dtype):
    # Up to SPECULATE_MAX_TOKENS (with PDL) the launch is one tile, 1 token x 8 heads on 2 warps, at
    # every token and head count: a serving engine compiles one kernel per model for its decode and
    # small batches, and a campaign one per drawn shape (docs/launch-defaults.md, the tile row: a
    # third of the specializations the 1-token tiles and the head block narrowed to the heads cost).  Rejects a
    # launcher that narrows the head block, or picks another tile or warp count, by tokens or heads.
    if data is None:
        spec, launches = QWEN72, [(1, 64, 8), (2, 64, 8), (64, 8, 1), (1, 8, 1), (17, 3, 1)]
    else:
        spec = data.draw(rope_specs(kind=kind), label="spec")
        launches = data.draw(st.lists(st.tuples(st.integers(1, SPECULATE_MAX_TOKENS), *[st.integers(1, 96)] * 2),
                                      min_size=2, max_size=4), label="(tokens, q heads, k heads)")
    meta = torch.device("meta")
    cache = torch.empty(4096, spec.rotary_dim, device=meta, dtype=dtype)
    kernels = set()
    for tokens, nq, nk in launches:
        positions = torch.zeros((spec.num_dims, tokens) if spec.num_dims > 1 else (tokens,), dtype=torch.long,
                                device=meta)
        q, k = (torch.empty(tokens, n * spec.head_size, device=meta, dtype=dtype) for n in (nq, nk))
        launch = _recorded_constexprs(positions, q, k, cache, spec=spec)
        assert launch["SPECULATE"] and (launch["BLOCK_T"], launch["BLOCK_H"], launch["BLOCK_HK"],
                                        launch["num_warps"]) == (1, 8, 8, 2), (tokens, nq, nk, launch)
        kernels.add(tuple(sorted(launch.items())))
    assert len(kernels) == 1, kernels


# A spec of 32 pairs of each kind but "mapped" (whose maps vary too much to pair one with).
_WIDE = {"1d": {}, "chunked1": {"sections": (32,)}, "chunked3": {"sections": (16, 8, 8)},
         "chunked4": {"sections": (8, 8, 8, 8)}, "interleaved": {"sections": (12, 10, 10), "layout": "interleaved"}}


@settings(deadline=None, max_examples=60)
@given(data=st.data(), kind=st.sampled_from(KINDS), tokens=st.sampled_from([1, 64, 128, 256, 4096]),
       heads=st.tuples(st.integers(1, 64), st.integers(0, 8)))
@example(data=None, kind="chunked3", tokens=4096, heads=(8, 1))      # head 16 x rotary 8, at a prefill tile
def test_narrow_rotary_widths_share_the_lane_block_of_32_pairs(data, kind, tokens, heads):
    # A program covers at least MIN_BLOCK_F = 32 frequency lanes: rotary widths of 1-31 pairs take
    # the tile of 32 pairs (the same BLOCK_F, BLOCK_T, BLOCK_H and warps, given the same cos/sin
    # gather), one compiled kernel where next_pow2(rotary_dim / 2) made five; every model rotates 32
    # or 64 pairs and keeps its launch.  Rejects a launcher that sizes the lanes, or the tile's
    # tokens, by the width alone.
    if data is None:
        narrow = RopeSpec(16, 8, sections=(2, 1, 1))
    else:
        narrow = data.draw(rope_specs(kind=kind, head_sizes=(8, 16, 32, 64)).filter(lambda s: s.num_freqs < 32),
                           label="narrow spec")
    meta = torch.device("meta")

    def tile(spec, **options):
        positions = torch.zeros((spec.num_dims, tokens) if spec.num_dims > 1 else (tokens,), dtype=torch.long,
                                device=meta)
        q, k = (torch.empty(tokens, n * spec.head_size, device=meta, dtype=torch.bfloat16) for n in heads)
        cache = torch.empty(4096, spec.rotary_dim, device=meta, dtype=torch.bfloat16)
        launch = _recorded_constexprs(positions, q, k if heads[1] else None, cache, spec=spec, **options)
        return {name: launch[name] for name in ("BLOCK_F", "BLOCK_T", "BLOCK_H", "BLOCK_HK", "num_warps", "GATHER_3D")}

    got = tile(narrow)
    assert got["BLOCK_F"] == MIN_BLOCK_F, (narrow, got)
    if kind in _WIDE:
        wide = RopeSpec(64, 64, is_neox_style=narrow.is_neox_style, **_WIDE[kind])
        assert got == tile(wide, gather_3d=got["GATHER_3D"]), (narrow, got)


@settings(deadline=None, max_examples=80)
@given(data=st.data(), kind=st.sampled_from(KINDS), tokens=st.sampled_from([1, 17, 64, 128, 200, 256, 4096, 16384, 65536]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), heads=st.integers(1, 96))
@example(data=None, kind="chunked3", tokens=1, dtype=torch.bfloat16, heads=64)       # Qwen2.5-VL-72B, decode
@example(data=None, kind="chunked3", tokens=65536, dtype=torch.bfloat16, heads=3)    # key programs' own head block
def test_a_launch_without_a_key_compiles_the_keyed_kernel(data, kind, tokens, dtype, heads):
    # Without a key the launch splits q and k as with one (no key programs: 0 key heads), so it
    # compiles the kernel a keyed launch of the same shape, tile and eviction hint does: one compile
    # where there were two (a search draws the key absent in half its cases).  Only those two may
    # differ, where the key's programs or bytes cross a threshold of the size policy.  Rejects a
    # launcher that picks another split or key switch for a launch without a key.
    spec = QWEN72 if data is None else data.draw(rope_specs(kind=kind), label="spec")
    meta = torch.device("meta")
    positions = torch.zeros((spec.num_dims, tokens) if spec.num_dims > 1 else (tokens,), dtype=torch.long, device=meta)
    q = torch.empty(tokens, heads * spec.head_size, device=meta, dtype=dtype)
    k = torch.empty(tokens, heads * spec.head_size, device=meta, dtype=dtype)     # as many key heads: one head block
    cache = torch.empty(4096, spec.rotary_dim, device=meta, dtype=dtype)
    alone = _recorded_constexprs(positions, q, None, cache, spec=spec)
    tile = {"block_t": alone["BLOCK_T"], "block_h": alone["BLOCK_H"], "num_warps": alone["num_warps"],
            "evict_first": alone["QK_EVICT"] == "evict_first"}
    assert alone == _recorded_constexprs(positions, q, k, cache, spec=spec, **tile)


@pytest.mark.parametrize("model", sorted(load_models()))
def test_every_model_keeps_its_lane_block(model):
    # The floor changes no real model's launch: each rotates at least 32 pairs, BLOCK_F = rotary_dim / 2
    # rounded up to a power of two (Phi-3.5-mini's 48 pairs take 64 lanes, 16 of them masked).
    spec = load_models()[model].spec
    meta = torch.device("meta")
    positions = torch.zeros((spec.num_dims, 4096) if spec.num_dims > 1 else (4096,), dtype=torch.long, device=meta)
    q = torch.empty(4096, 8 * spec.head_size, device=meta, dtype=torch.bfloat16)
    cache = torch.empty(4096, spec.rotary_dim, device=meta, dtype=torch.bfloat16)
    assert spec.num_freqs >= MIN_BLOCK_F
    assert _recorded_constexprs(positions, q, None, cache, spec=spec)["BLOCK_F"] == next_power_of_2(spec.num_freqs)


@pytest.mark.parametrize("model, tokens, evict", [("qwen2.5-vl-72b", 8192, True), ("qwen2.5-vl-72b", 16384, False),
                                                  ("qwen3-vl-30b-a3b", 16384, True), ("qwen3-vl-30b-a3b", 16385, False),
                                                  ("qwen3-vl-30b-a3b", 127, False)])
def test_evict_first_by_default_only_for_mid_sized_batches(model, tokens, evict):
    # The q/k eviction hint from SMALL_BATCH_TOKENS to 16384 tokens, while the rotated bytes stay
    # within EVICT_FIRST_MAX_BYTES (Qwen2.5-VL-72B at 16384 tokens: 604 MB).
    spec = load_models()[model].spec
    nq, nk = load_models()[model].sharded(1)
    meta = torch.device("meta")
    positions = torch.zeros(3, tokens, dtype=torch.long, device=meta)
    q, k = (torch.empty(tokens, n * spec.head_size, device=meta, dtype=torch.bfloat16) for n in (nq, nk))
    cache = torch.empty(4096, spec.rotary_dim, device=meta, dtype=torch.bfloat16)
    assert _recorded_constexprs(positions, q, k, cache, spec=spec)["QK_EVICT"] == ("evict_first" if evict else "")


@pytest.mark.parametrize("block_hk", [0, 3, 16])
def test_a_key_head_block_not_dividing_the_head_block_is_refused(block_hk):
    with pytest.raises(ValueError, match=rf"block_hk={block_hk}: must be a power of two dividing block_h=8"):
        launch_rotary(QWEN72, torch.zeros(3, 1, dtype=torch.long), torch.zeros(1, 128), torch.zeros(1, 128),
                      torch.zeros(8, 128), block_h=8, block_hk=block_hk)


def test_unknown_bf16_rounding_is_refused():
    with pytest.raises(ValueError, match=r"bf16_rounding='nearest': must be 'by_hand' or 'convert'"):
        launch_rotary(QWEN72, torch.zeros(3, 1, dtype=torch.long), torch.zeros(1, 128), None,
                      torch.zeros(8, 128), bf16_rounding="nearest")



@given(n=st.integers(0, 1 << 40), b=st.integers(1, 1 << 20))
@example(n=0, b=1)
@example(n=1 << 31, b=3)
def test_grid_arithmetic_is_tritons(n, b):
    # The launches size their grids and tiles with rope.triton.grid's plain-int functions (Triton's
    # cost about 2 us a call from Python); they must be Triton's functions exactly.
    assert cdiv(n, b) == triton.cdiv(n, b)
    assert next_power_of_2(n) == triton.next_power_of_2(n)


def _recorded_constexprs(positions, query, key, cache, spec=QWEN72, **options) -> dict:
    """The constexprs of the one launch launch_rotary makes (kernel intercepted, PDL available)."""
    from tests.kernels.compile_offline import record_launches
    import rope.triton.rotary as rotary
    (_, _grid, _args, kwargs), = record_launches(rotary, "_rotary_kernel", lambda: launch_rotary(
        spec, positions, query, key, cache, **options))
    return kwargs


@pytest.mark.parametrize("rows, row_stride, needs_64", [
    (32768, 128, False),
    ((2**31 - 64) // 128 + 1, 128, False),      # the last row's lanes end at 2^31 - 1
    ((2**31 - 64) // 128 + 2, 128, True),
    (3, 2**30, True),                           # few rows far apart (a strided view of a wider tensor)
])
def test_cache_offsets_are_64_bit_where_32_bits_would_overflow(rows, row_stride, needs_64):
    # The kernel indexes the cache in 32 bits (a shorter position -> cos/sin chain) unless an offset
    # row * row_stride + lane (lanes < 64 here) could pass 2^31 - 1.  Meta tensors: no memory.
    meta = torch.device("meta")
    cache = torch.empty(rows, row_stride, device=meta, dtype=torch.bfloat16)[:, :128]
    positions = torch.zeros(3, 1, dtype=torch.long, device=meta)
    q, k = torch.empty(1, 8 * 128, device=meta, dtype=torch.bfloat16), torch.empty(1, 128, device=meta, dtype=torch.bfloat16)
    assert _recorded_constexprs(positions, q, k, cache)["CACHE_I64"] is needs_64
    assert _recorded_constexprs(positions, q, k, cache, cache_offsets_64=True)["CACHE_I64"] is True
    if needs_64:
        with pytest.raises(ValueError, match=r"cache_offsets_64=False: cos_sin_cache of \d+ rows and row stride \d+ has offsets past 2\^31 - 1"):
            launch_rotary(QWEN72, positions, q, k, cache, cache_offsets_64=False)


# What each compile target's default launches ask for (rope/triton/targets.py and the launch table
# in docs/spec.md): PDL, and the speculation it enables, only on CUDA sm_90+; the q/k eviction hint
# only on CUDA; compile options wherever the kernel is compiled; the bf16 store rounded by hand only
# under the interpreter.  (target, PDL, eviction hint, compile options, bf16 by hand)
_TARGET_OPTIONS = [
    (TARGETS["sm_90"], True, True, True, False),
    (cuda_target((8, 0)), False, True, True, False),
    (TARGETS["gfx942"], False, False, True, False),
    (TARGETS["gfx90a"], False, False, True, False),
    (TARGETS["pvc"], False, False, True, False),
    (INTERPRETER, False, False, False, True),
]


@pytest.mark.parametrize("target, pdl, evict, compiled, by_hand", _TARGET_OPTIONS, ids=lambda v: getattr(v, "arch", None) or None)
def test_each_target_gets_only_the_launch_options_it_has(target, pdl, evict, compiled, by_hand):
    from tests.kernels.compile_offline import record_launches
    import rope.triton.positions as positions_module
    import rope.triton.rotary as rotary
    spec = load_models()["qwen2.5-vl-72b"].spec
    meta = torch.device("meta")
    cache = torch.empty(4096, spec.rotary_dim, device=meta, dtype=torch.bfloat16)
    for tokens in (1, 64, 200, 8192):        # decode, the speculating band's end, one wave, a mid-sized prefill
        positions = torch.zeros(3, tokens, dtype=torch.long, device=meta)
        q, k = (torch.empty(tokens, n * 128, device=meta, dtype=torch.bfloat16) for n in (64, 8))
        (_, _grid, _args, launch), = record_launches(rotary, "_rotary_kernel", lambda: launch_rotary(spec, positions, q, k, cache),
                                             target)
        assert launch["PDL"] is (pdl and tokens != 8192) and ("launch_pdl" in launch) is launch["PDL"], (tokens, launch)
        assert launch["SPECULATE"] is (pdl and tokens <= SPECULATE_MAX_TOKENS), (tokens, launch)
        assert launch["QK_EVICT"] == ("evict_first" if evict and tokens >= 128 else ""), (tokens, launch)
        assert ("num_warps" in launch and launch["enable_fp_fusion"] is False) if compiled else \
            not {"num_warps", "enable_fp_fusion"} & set(launch), (tokens, launch)
        assert launch["ROUND_BF16"] is by_hand
        # Asked for explicitly, an option the target lacks is still not used.
        (_, _grid, _args, forced), = record_launches(rotary, "_rotary_kernel", lambda: launch_rotary(
            spec, positions, q, k, cache, pdl=True, evict_first=True), target)
        assert forced["PDL"] is pdl and forced["QK_EVICT"] == ("evict_first" if evict else ""), (tokens, forced)
    out = torch.empty(3, 40, dtype=torch.int64, device=meta)
    small = [torch.zeros(n, dtype=torch.int32, device=meta) for n in (4, 1, 2, 4, 4)]
    (_, _grid, _args, step), = record_launches(positions_module, "_prepare_positions_kernel", lambda: launch_prepare_positions(
        torch.zeros(12, 64, dtype=torch.int32, device=meta), *small, 3, out), target)
    assert step["PDL"] is pdl and ("launch_pdl" in step) is pdl, step


def test_the_default_plan_is_computed_once_per_signature():
    # The default launch's grid and constexprs are a function of the shapes, the dtype, the cache's
    # rows and row stride and the compile target: computed once, then a lookup.
    meta = torch.device("meta")
    cache = torch.empty(4096, 128, device=meta, dtype=torch.bfloat16)
    q, k = torch.empty(5, 8 * 128, device=meta, dtype=torch.bfloat16), torch.empty(5, 128, device=meta, dtype=torch.bfloat16)
    positions = torch.zeros(3, 5, dtype=torch.long, device=meta)
    default_plan.cache_clear()
    first = _recorded_constexprs(positions, q, k, cache)
    again = _recorded_constexprs(positions, q, k, cache)
    info = default_plan.cache_info()
    assert first == again and (info.misses, info.hits) == (1, 1), info
    # Another token count, or an option given, is planned anew (an option never from the cache).
    _recorded_constexprs(torch.zeros(3, 6, dtype=torch.long, device=meta), q[:1].expand(6, -1), k[:1].expand(6, -1), cache)
    asked = _recorded_constexprs(positions, q, k, cache, evict_first=False, block_h=2)
    info = default_plan.cache_info()
    assert info.misses == 2 and asked["BLOCK_H"] == 2, info


def test_the_public_entrys_checks_are_cached_by_metadata_and_still_refuse_what_differs():
    if not triton_runs_on("cpu"):
        pytest.skip("Triton does not run on the CPU here (TRITON_INTERPRET=1 runs it)")
    import rope.triton.rotary as rotary
    from rope import RopeSpec, cos_sin_cache
    spec = RopeSpec(head_size=64, rotary_dim=64, sections=(8, 12, 12), max_position=16)
    cache = cos_sin_cache(spec, dtype=torch.float32)
    positions = torch.zeros(3, 4, dtype=torch.long)
    q, k = torch.randn(4, 2 * 64), torch.randn(4, 64)
    rotary._CHECKED.clear()
    rotary.rotate_triton(spec, positions, q, k, cache)
    assert len(rotary._CHECKED) == 1
    rotary.rotate_triton(spec, positions, q, k, cache)
    assert len(rotary._CHECKED) == 1                  # the same metadata: no second entry
    with pytest.raises(ValueError, match="key"):       # key is query: refused although q was checked
        rotary.rotate_triton(spec, positions, q, q[:, :64], cache)
    with pytest.raises(ValueError, match="key.dtype"):
        rotary.rotate_triton(spec, positions, q, k.double(), cache)
    # The values are checked on every call where they are checked at all (the CPU): the same
    # metadata with a position past the cache is refused.
    positions[0, 0] = 16                               # in place: the same address
    with pytest.raises(ValueError, match=r"positions=\[0\.\.16\]"):
        rotary.rotate_triton(spec, positions, q, k, cache)


def test_a_cached_signature_still_copies_what_the_kernel_cannot_read_in_place():
    # The public entry keeps, per signature, whether an input must be copied to unit stride; a
    # second call with the same strided buffers takes that from the cache and must copy again
    # (a kernel handed a column-strided q would read every other element).
    if not triton_runs_on("cpu"):
        pytest.skip("Triton does not run on the CPU here (TRITON_INTERPRET=1 runs it)")
    import reference
    import rope.triton.rotary as rotary
    from rope import RopeSpec, cos_sin_cache
    spec = RopeSpec(head_size=64, rotary_dim=64, sections=(8, 12, 12), max_position=16)
    cache = cos_sin_cache(spec, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    positions = torch.randint(0, 16, (3, 4), generator=gen)
    q0, k0 = torch.randn(4, 2 * 2 * 64, generator=gen), torch.randn(4, 64, generator=gen)
    q_storage, k = q0.clone(), k0.clone()
    rotary._CHECKED.clear()
    for call in range(2):
        q_storage.copy_(q0), k.copy_(k0)                  # the same buffers, the same signature
        q = q_storage[:, ::2]
        expected_q, expected_k = reference.rotate(spec, positions, q.clone(), k.clone(), cache)
        got_q, got_k = rotary.rotate_triton(spec, positions, q, k, cache)
        assert len(rotary._CHECKED) == 1, call
        torch.testing.assert_close(got_q, expected_q.to(got_q.dtype), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_k, expected_k.to(got_k.dtype), rtol=1e-5, atol=1e-5)


def test_a_cached_step_signature_still_copies_strided_vectors(monkeypatch):
    # As for the rotation: the step's entry keeps whether a 1-D input is strided, and a second call
    # with the same strided views (values unread, as on a GPU) must copy them again.
    if not triton_runs_on("cpu"):
        pytest.skip("Triton does not run on the CPU here (TRITON_INTERPRET=1 runs it)")
    import rope.triton.positions as positions_module
    from properties.position_step.known_steps import CHUNK_2
    from reference.runner_positions import prepare_positions
    from rope.harness.position_step.check import POSITION_ARGUMENTS
    tensors = CHUNK_2.tensors("cpu")
    args = [tensors[name] if name != "num_dims" else CHUNK_2.num_dims for name in POSITION_ARGUMENTS]
    width = CHUNK_2.num_tokens + CHUNK_2.padding
    expected = torch.full((CHUNK_2.num_dims, width), OUT_SENTINEL, dtype=torch.int64)
    expected[:, :CHUNK_2.num_tokens] = prepare_positions(*args)
    # Every 1-D input as a stride-2 view of a buffer twice its length, same values.
    for i in range(1, 6):
        buffer = torch.zeros(2 * args[i].numel(), dtype=args[i].dtype)
        buffer[::2] = args[i]
        args[i] = buffer[::2]
    monkeypatch.setenv("ROPE_CHECK_VALUES", "0")
    positions_module._CHECKED.clear()
    out = torch.empty(CHUNK_2.num_dims, width, dtype=torch.int64)
    for call in range(2):
        out.fill_(OUT_SENTINEL)
        positions_module.prepare_positions_triton(*args, out)
        assert len(positions_module._CHECKED) == 1, call
        assert torch.equal(out, expected), call


def test_the_position_steps_metadata_checks_are_cached_where_values_are_not_read(monkeypatch):
    # On a GPU (values unread) a step's metadata is checked once per signature; a tensor that
    # differs is checked again, and ROPE_CHECK_VALUES=1 checks every call whole.
    if not triton_runs_on("cpu"):
        pytest.skip("Triton does not run on the CPU here (TRITON_INTERPRET=1 runs it)")
    import rope.triton.positions as positions_module
    from properties.position_step.known_steps import CHUNK_2
    from rope.harness.position_step.check import POSITION_ARGUMENTS
    tensors = CHUNK_2.tensors("cpu")
    args = [tensors[name] if name != "num_dims" else CHUNK_2.num_dims for name in POSITION_ARGUMENTS]
    out = torch.full((CHUNK_2.num_dims, CHUNK_2.num_tokens + CHUNK_2.padding), OUT_SENTINEL, dtype=torch.int64)
    positions_module._CHECKED.clear()
    monkeypatch.setenv("ROPE_CHECK_VALUES", "0")
    positions_module.prepare_positions_triton(*args, out)
    positions_module.prepare_positions_triton(*args, out)
    assert len(positions_module._CHECKED) == 1
    with pytest.raises(ValueError, match="out"):
        positions_module.prepare_positions_triton(*args, out[:, :1].contiguous().to(torch.int32))
    monkeypatch.setenv("ROPE_CHECK_VALUES", "1")
    args[2][0] = 7                                         # idx_mapping in place: a slot past the table
    with pytest.raises(ValueError, match="idx_mapping"):   # the cached signature, values checked all the same
        positions_module.prepare_positions_triton(*args, out)
    assert len(positions_module._CHECKED) == 1             # a checked-values call is never cached


@pytest.mark.parametrize("tokens", [1, 7, 300, 4096, 16384])
def test_the_interpreter_takes_as_many_tokens_as_fill_its_tile_and_a_gpu_keeps_its_own(tokens):
    # The interpreter's cost is per program: its token block fills INTERPRETED_TILE elements of the
    # heads (a power of two, never past the batch); a GPU's tile is the measured default, unchanged.
    from rope.triton.rotary_plan import INTERPRETED_TILE, lane_block
    spec = RopeSpec(128, 128, True, (16, 24, 24), "interleaved", 1e6, 32768)
    args = (spec, tokens, 28, 4, True, torch.bfloat16, 32768, 128)
    interpreted = default_plan(*args, INTERPRETER)[1]["BLOCK_T"]
    per_token = lane_block(spec) * next_power_of_2(28)
    assert interpreted == min(next_power_of_2(tokens), INTERPRETED_TILE // per_token)
    assert default_plan(*args, cuda_target((9, 0)))[1]["BLOCK_T"] <= 8
