"""The compiler hints of the Triton rotation kernel are promises the interpreter never checks
(``tl.multiple_of`` / ``tl.max_contiguous`` are no-ops there): a wrong promise gives wrong loads
only on a GPU.  So the promise itself is a property: ``_position_run`` may declare runs of R lanes
only if every aligned run of R frequency lanes, padding lanes up to BLOCK_F included, takes one
position row (the spec's axis map) and the cache offsets of a run start stay multiples of R."""

from __future__ import annotations

import triton
from hypothesis import example, given, strategies as st

from properties.strategies import KINDS, rope_specs
from rope.models import load_models
from rope.spec import RopeSpec
from rope.triton.rotary import _position_run


def _lane_axis(spec: RopeSpec, lane: int) -> int:
    """The row the kernel's lane takes: the axis map inside rotary_dim/2; padding lanes (masked)
    take what the kernel's map gives them (chunked: the last row; interleaved: by lane % 3)."""
    axes = spec.axis_map()
    if lane < len(axes):
        return axes[lane]
    if spec.num_dims == 1:
        return 0
    if spec.layout == "interleaved":
        secs = spec.sections
        if lane % 3 == 1 and lane < 3 * secs[1]:
            return 1
        if lane % 3 == 2 and lane < 3 * secs[2]:
            return 2
        return 0
    return spec.num_dims - 1


@given(spec=st.sampled_from(KINDS).flatmap(lambda kind: rope_specs(kind=kind)),
       stride_extra=st.sampled_from([0, 1, 2, 4, 8, 16]))
@example(spec=load_models()["qwen2.5-vl-72b"].spec, stride_extra=0)
@example(spec=load_models()["glm-4.1v-9b"].spec, stride_extra=0)
@example(spec=load_models()["qwen3-vl-8b"].spec, stride_extra=0)
@example(spec=load_models()["hunyuan-ocr"].spec, stride_extra=0)
def test_position_run_is_a_true_promise(spec, stride_extra):
    stride = spec.rotary_dim + stride_extra          # a cache row may be padded (a strided view)
    run = _position_run(spec, stride)
    assert run in (1, 2, 4, 8)
    assert stride % run == 0 and spec.num_freqs % run == 0
    block_f = triton.next_power_of_2(spec.num_freqs)
    for start in range(0, block_f, run):
        rows = {_lane_axis(spec, lane) for lane in range(start, start + run)}
        assert len(rows) == 1, f"lanes {start}..{start + run - 1} take rows {sorted(rows)} (run {run})"


def test_position_run_declares_the_widest_true_run():
    # Not only safe but useful: the measured shapes get their vector width (perf-notes §6).
    models = load_models()
    assert _position_run(models["qwen2.5-vl-72b"].spec, 128) == 8    # [16, 24, 24]
    assert _position_run(models["glm-4.1v-9b"].spec, 64) == 4        # [8, 12, 12]
    assert _position_run(models["qwen3-vl-8b"].spec, 128) == 1       # interleaved
    assert _position_run(models["qwen2.5-vl-72b"].spec, 130) == 2    # a padded cache row
