"""The entry points of the rotation kernel: ``rotate_triton`` (the registered ``"triton"``
implementation: checks its inputs, then launches), ``launch_rotary`` (the launch alone, every
launch option exposed), ``bare_launch`` (the benchmark's yardstick of the host path) and
``stream_launch`` (the kernel's loads and stores without the rotation: the benchmark's floor).

The kernel itself is rope/triton/rotary_kernel.py; what a launch runs (grid, tile, constexprs, the
kernel's arguments), computed from the shapes alone, is rope/triton/rotary_plan.py, whose defaults
docs/launch-defaults.md states with their measurements.
"""

from __future__ import annotations

import torch

from rope.devices import device_name, triton_runs_on
from rope.spec import RopeSpec, check_position_range, check_rotation_inputs, checks_values

from rope.triton.checked import CheckedCalls
from rope.triton.launcher import launch
from rope.triton.rotary_plan import (EVICT_FIRST_TOKENS, FEW_TOKENS, KEY_HEAD_BLOCK_TOKENS, ONE_WAVE_TOKENS,
                                     PDL_MAX_TOKENS, PER_LANE_TILE_TOKENS, PER_LANE_WIDE_TOKENS, SMALL_BATCH_TOKENS,
                                     SPECULATE_MAX_TOKENS, check_guesses, default_plan, kernel_arguments, plan)
# The kernel under the module-level name the launches below read at each call, so that a recorder or
# a stub put in its place is what they launch (tests/kernels/compile_offline.py, lab/bench/host_path.py).
from rope.triton.rotary_kernel import rotary_kernel as _rotary_kernel
from rope.triton.targets import launch_target

__all__ = ["SUPPORTED_DTYPES", "bare_launch", "launch_rotary", "launch_signature", "rotate_triton", "stream_launch",
           "supports",
           # the plan's token bands the benchmark reads (rope.harness.bench), from rope/triton/rotary_plan.py
           "ONE_WAVE_TOKENS", "PDL_MAX_TOKENS"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DEFAULTS = (None,) * 12        # launch_rotary's options, none given: the default launch


def launch_rotary(spec: RopeSpec, positions, query, key, cos_sin_cache, *, block_h: int | None = None,
                  num_warps: int | None = None, block_t: int | None = None, split_qk: bool | None = None,
                  gather_3d: bool | None = None, pdl: bool | None = None, evict_first: bool | None = None,
                  heads_fastest: bool | None = None, bf16_rounding: str | None = None,
                  block_hk: int | None = None, cache_offsets_64: bool | None = None,
                  positions_before_wait: bool = False, speculate_positions: bool | None = None,
                  position_guesses=None, inverse: bool = False):
    """Launch the kernel without validation (the caller has checked); returns (query, key), rotated
    in place (query/key must have unit stride in the last dim).  ``inverse``: rotated by -θ instead
    (the backward: the kernel's INVERSE switch; every other option and default as for the forward).

    Every option defaults to the launch measured fastest on an H200; docs/launch-defaults.md states
    each default with its measurement, and no option changes a value (tests/kernels/
    test_launch_options.py).  The tile: ``block_t`` tokens x ``block_h`` heads per program on
    ``num_warps`` warps; ``split_qk``: q and k in separate programs, the key's of ``block_hk`` heads
    (a power of two dividing ``block_h``; they take ``block_h // block_hk`` times the tokens);
    ``gather_3d``: cos/sin gathered straight into the tile's layout; ``heads_fastest``: a 1-D grid,
    the head blocks of a token block in consecutive programs.  ``pdl``: programmatic dependent
    launch, ``evict_first``: the q/k eviction hint (each only where the compile target has it:
    rope/triton/targets.py).  ``bf16_rounding``: ``"convert"`` (the store's own rounding, compiled)
    or ``"by_hand"`` (bit arithmetic, the same bits; under the interpreter, whose convert truncates).
    ``cache_offsets_64``: cache rows and offsets in 64-bit arithmetic (forced where a 32-bit offset
    could overflow).  ``positions_before_wait``: with PDL, read the positions before waiting for
    the previous kernel and trust them (valid only when that kernel does not write them; off by
    default: tests/kernels/test_pdl_order.py shows the hazard).  ``speculate_positions``: guess the
    positions before the PDL wait, check them after it, re-read cos/sin where a guess was wrong;
    ``position_guesses`` (tests): where the guesses are read from (see ``check_guesses``).  The
    default launch's plan (grid, constexprs) is computed once per signature (``default_plan``).
    """
    if bf16_rounding not in (None, "by_hand", "convert"):
        raise ValueError(f"bf16_rounding={bf16_rounding!r}: must be 'by_hand' or 'convert'")
    if positions.shape[-1] == 0:
        return query, key
    signature = launch_signature(spec, positions, query, key, cos_sin_cache)
    asked = (block_h, num_warps, block_t, split_qk, gather_3d, pdl, evict_first, heads_fastest, bf16_rounding,
             block_hk, cache_offsets_64, speculate_positions)
    if asked == _DEFAULTS and not positions_before_wait and position_guesses is None:
        if inverse:
            grid, constexprs = default_plan(*signature, True)
            plan_key = (signature, True)
        else:
            grid, constexprs = default_plan(*signature)           # once per signature
            plan_key = signature
    else:
        speculate_positions = check_guesses(positions, position_guesses, speculate_positions, positions_before_wait)
        grid, constexprs = plan(*signature, *asked[:-1], speculate_positions, positions_before_wait, bool(inverse))
        plan_key = (signature, asked, positions_before_wait, speculate_positions, bool(inverse))
    # Through the compiled kernel's launcher once Triton's path has launched this plan with
    # arguments specialized alike (rope/triton/launcher.py).
    launch(_rotary_kernel, grid, kernel_arguments(signature, positions, query, key, cos_sin_cache, position_guesses,
                                                  constexprs["MAP_TABLE"]), constexprs, plan_key)
    return query, key


def launch_signature(spec: RopeSpec, positions, query, key, cos_sin_cache) -> tuple:
    """What the default launch's plan depends on (``default_plan``'s arguments): the spec, the token
    and head counts, whether there is a key, the dtype, the cache's rows and row stride, and the
    compile target (rope/triton/targets.py: PDL and the eviction hint exist on some targets only,
    and the interpreter takes no compile options)."""
    return (spec, positions.shape[-1], query.shape[1] // spec.head_size,
            key.shape[1] // spec.head_size if key is not None else 0, key is not None, query.dtype,
            cos_sin_cache.shape[0], cos_sin_cache.stride(0), launch_target(query.device))


def bare_launch(spec: RopeSpec, positions, query, key, cos_sin_cache):
    """The default launch of these inputs as a function of no arguments that launches it the way
    Triton's documentation does, ``kernel[grid](*args, **constexprs)``, with the plan and the
    arguments computed here once: the yardstick of the host path (rope-harness bench's
    ``triton-bare``).  Returns (query, key) per call, rotated in place."""
    signature = launch_signature(spec, positions, query, key, cos_sin_cache)
    grid, constexprs = default_plan(*signature)
    args = kernel_arguments(signature, positions, query, key, cos_sin_cache, None, constexprs["MAP_TABLE"])

    def call():
        if signature[1]:                # tokens
            _rotary_kernel[grid](*args, **constexprs)
        return query, key
    return call


def stream_launch(spec: RopeSpec, positions, query, key, cos_sin_cache, *, block_t: int | None = None):
    """The kernel's same-bytes stream over these inputs (validated as a rotation's) as a function of
    no arguments: the launch of the rotation's plan without programmatic dependent launch (as the
    benchmark's graph timer races ours), ``block_t`` tokens a program where given, with the kernel's
    STREAM switch on: every position, cos/sin entry and rotated channel the rotation reads, read
    alike, and each pair (x1, x2) stored back as (x1 * cos, x2 * sin).  The benchmark's floor
    (rope.harness.bench_floor).  Returns (query, key) per call, scaled in place; the function's
    ``block_t`` is the tokens a program its plan took."""
    _check_inputs(spec, positions, query, key, cos_sin_cache)
    if (cos_sin_cache.stride(1) != 1 or positions.stride(-1) != 1 or query.stride(-1) != 1
            or (key is not None and key.stride(-1) != 1)):
        raise ValueError("stream_launch: positions, query, key and cos_sin_cache need unit-stride columns")
    signature = launch_signature(spec, positions, query, key, cos_sin_cache)
    grid, constexprs = plan(*signature, block_t=block_t, pdl=False, stream=True)
    args = kernel_arguments(signature, positions, query, key, cos_sin_cache, None, constexprs["MAP_TABLE"])
    plan_key = (signature, "stream", block_t)

    def call():
        if signature[1]:                # tokens
            launch(_rotary_kernel, grid, args, constexprs, plan_key)
        return query, key
    call.block_t = constexprs["BLOCK_T"]
    return call


def _unit_last_stride(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or t.stride(-1) == 1:
        return t
    return t.contiguous()


def rotate_triton(spec: RopeSpec, positions, query, key, cos_sin_cache, *, inverse: bool = False):
    """Rotate query/key in place with the Triton kernel; returns the rotated tensors.

    Args:
        positions: int64/int32 [T] (1-D RoPE) or [spec.num_dims, T].
        query: [T, num_q_heads * head_size], any row stride; key: [T, num_kv_heads * head_size] or None.
        cos_sin_cache: [>= max position + 1, rotary_dim], cos | sin.
        inverse: rotate by -θ (the rotation's backward, applied to the upstream gradients dq_out and
            dk_out in place of query and key: reference/rotation_grad.py).
    Returns:
        (query, key): the same tensors, rotated (copies only if the last dim was strided).
    """
    signature = CheckedCalls.signature((spec,), (positions, query, key, cos_sin_cache))
    copies = _CHECKED.get(signature)
    if copies is None:                  # a signature not seen (or none): every check
        _check_inputs(spec, positions, query, key, cos_sin_cache)
        copies = (cos_sin_cache.stride(1) != 1 or positions.stride(-1) != 1 or query.stride(-1) != 1
                  or (key is not None and key.stride(-1) != 1))
        _CHECKED.add(signature, copies)
    elif checks_values(positions):      # the metadata passed before; the values are new
        check_position_range(positions, cos_sin_cache.shape[0])
    if copies:                          # the kernel reads unit-stride columns: strided inputs are copied
        if cos_sin_cache.stride(1) != 1:
            cos_sin_cache = cos_sin_cache.contiguous()
        if positions.stride(-1) != 1:       # 1-D or row-strided positions: columns must be contiguous
            positions = positions.contiguous()
        query, key = _unit_last_stride(query), _unit_last_stride(key)
    return launch_rotary(spec, positions, query, key, cos_sin_cache, inverse=inverse)


# Calls whose metadata passed the checks, each with whether it copies a strided input
# (rope/triton/checked.py).
_CHECKED = CheckedCalls()


def _check_inputs(spec: RopeSpec, positions, query, key, cos_sin_cache) -> None:
    """The public entry's checks: the contract's (rope.spec.check_rotation_inputs, the values among
    them where rope.spec.checks_values says so: on the CPU, or under ROPE_CHECK_VALUES=1), then the
    kernel's own limits (dtypes, devices)."""
    check_rotation_inputs(spec, positions, query, key, cos_sin_cache)
    if query.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"query.dtype={query.dtype}: the Triton kernel supports {SUPPORTED_DTYPES}")
    device = device_name(query.device)
    if not triton_runs_on(device):
        raise ValueError(f"query.device={query.device}: Triton needs a GPU tensor here, or TRITON_INTERPRET=1")


def supports(spec: RopeSpec, dtype: torch.dtype, device: str) -> bool:
    return dtype in SUPPORTED_DTYPES and triton_runs_on(device)


rotate_triton.working_precision = "float32"
# Where launch_rotary's defaults change path by the token count alone: speculating (GPU, PDL) with
# 8-head programs of 2 warps up to SPECULATE_MAX_TOKENS; 2-head programs for
# interleaved sections up to FEW_TOKENS; PDL off above PDL_MAX_TOKENS, on again in ONE_WAVE_TOKENS; from
# SMALL_BATCH_TOKENS token x head x frequency tiles and the heads-fastest 1-D grid; the per-lane
# gather's tiles at PER_LANE_WIDE_TOKENS and above PER_LANE_TILE_TOKENS; evict_first off above
# 16384; key programs of the key's head count above KEY_HEAD_BLOCK_TOKENS.  (The program-count
# switches of rotary_plan._default_tile and evict_first's byte bound move with the head counts;
# test_launch_options holds every tile and hint to the default's bits.)
rotate_triton.switch_tokens = tuple(sorted({FEW_TOKENS + 1, PDL_MAX_TOKENS + 1, SPECULATE_MAX_TOKENS + 1,
                                            SMALL_BATCH_TOKENS, PER_LANE_WIDE_TOKENS,
                                            ONE_WAVE_TOKENS[1] + 1, PER_LANE_TILE_TOKENS + 1, EVICT_FIRST_TOKENS[1] + 1,
                                            KEY_HEAD_BLOCK_TOKENS + 1}))
rotate_triton.supports = supports
rotate_triton.unchecked = launch_rotary   # hot path for the benchmark: no validation, no host sync
rotate_triton.bare_launch = bare_launch   # the benchmark's yardstick of the host path
