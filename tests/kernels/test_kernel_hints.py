"""The compiler hints of the Triton rotation kernel are promises the interpreter never checks
(``tl.multiple_of`` / ``tl.max_contiguous`` are no-ops there): a wrong promise gives wrong loads
only on a GPU.  So the promise itself is a property: ``position_run`` may declare runs of R lanes
only if every aligned run of R frequency lanes, padding lanes up to BLOCK_F included, takes one
position row (as the kernel's own ``lane_axes`` computes it, checked against the spec's axis map)
and the cache offsets of a run start stay multiples of R."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import example, given, settings, strategies as st

from properties.strategies import KINDS, rope_specs
from rope.models import load_models
from rope.spec import RopeSpec
from rope.triton.rotary_kernel import lane_axes
from rope.triton.rotary_plan import lane_block, map_table, plan, position_run
from rope.triton.targets import launch_target

pytestmark = pytest.mark.stack      # meets the installed torch and Triton: CI runs it on every stack (.ci/run)


@triton.jit
def _lane_axes_kernel(out_ptr, map_ptr, half, sec0, sec1, sec2, NUM_DIMS: tl.constexpr, INTERLEAVED: tl.constexpr,
                      MAP_TABLE: tl.constexpr, BLOCK_F: tl.constexpr):
    freq = tl.arange(0, BLOCK_F)
    tl.store(out_ptr + freq, lane_axes(freq, half, map_ptr, sec0, sec1, sec2, NUM_DIMS, INTERLEAVED, MAP_TABLE))


def kernel_lane_axes(spec: RopeSpec) -> list[int]:
    """The position row of every lane, padding lanes included, as the kernel's own ``lane_axes``
    computes it (under the interpreter here, compiled on a GPU box)."""
    block_f = lane_block(spec)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.full((block_f,), -1, dtype=torch.int32, device=device)
    sec0, sec1, sec2 = (*(spec.sections or ()), 0, 0, 0)[:3]      # the kernel's: the first three sections
    constexprs = plan(spec, 1, 1, 0, False, torch.float32, spec.max_position, spec.rotary_dim,
                      launch_target(torch.device(device)))[1]
    table = map_table(spec, torch.device(device)) if constexprs["MAP_TABLE"] else out
    _lane_axes_kernel[(1,)](out, table, spec.num_freqs, sec0, sec1, sec2, NUM_DIMS=spec.num_dims,
                            INTERLEAVED=constexprs["INTERLEAVED"], MAP_TABLE=constexprs["MAP_TABLE"], BLOCK_F=block_f)
    return out.cpu().tolist()


@settings(deadline=None)
@given(spec=st.sampled_from(KINDS).flatmap(lambda kind: rope_specs(kind=kind)),
       stride_extra=st.sampled_from([0, 1, 2, 4, 8, 16]))
@example(spec=load_models()["qwen2.5-vl-72b"].spec, stride_extra=0)
@example(spec=load_models()["glm-4.1v-9b"].spec, stride_extra=0)
@example(spec=load_models()["qwen3-vl-8b"].spec, stride_extra=0)
@example(spec=load_models()["hunyuan-ocr"].spec, stride_extra=0)
@example(spec=load_models()["ernie-4.5-vl-28b-a3b"].spec, stride_extra=0)
@example(spec=load_models()["hunyuan-image-3.0"].spec, stride_extra=0)
def test_position_run_is_a_true_promise(spec, stride_extra):
    stride = spec.rotary_dim + stride_extra          # a cache row may be padded (a strided view)
    run = position_run(spec, stride)
    assert run in (1, 2, 4, 8)
    assert stride % run == 0 and spec.num_freqs % run == 0
    axes = kernel_lane_axes(spec)
    assert axes[:spec.num_freqs] == list(spec.axis_map())     # the kernel's map is the spec's
    for start in range(0, len(axes), run):
        rows = set(axes[start:start + run])
        assert len(rows) == 1, f"lanes {start}..{start + run - 1} take rows {sorted(rows)} (run {run})"


def test_position_run_declares_the_widest_true_run():
    # Not only safe but useful: the measured shapes get their vector width (docs/launch-defaults.md, gather_3d).
    models = load_models()
    assert position_run(models["qwen2.5-vl-72b"].spec, 128) == 8    # [16, 24, 24]
    assert position_run(models["glm-4.1v-9b"].spec, 64) == 4        # [8, 12, 12]
    assert position_run(models["qwen3-vl-8b"].spec, 128) == 1       # interleaved
    assert position_run(models["qwen2.5-vl-72b"].spec, 130) == 2    # a padded cache row
    # A custom map of runs of four lanes (the table path) keeps the vector width of its runs.
    assert position_run(RopeSpec.from_map((0,) * 4 + (1,) * 4 + (0,) * 4 + (2,) * 4, head_size=32), 32) == 4
