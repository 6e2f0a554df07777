"""The prefill boundaries reach every implementation on a layout it runs: a kernel of chunked and
interleaved sections only (no 1-D, no table-read map) meets every power of two from 1,024 to
16,384, where the boundary's turn in the layout cycle fell on a layout it lacks (16,384 took the
Ernie-4.5 map on the CPU, and such a kernel skipped it, green)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from properties.rotation.prefill_cases import (BOUNDARY_KINDS, POWER_OF_TWO_LOG2, boundary_case, power_of_two_counts,
                                              supported_boundary_case, supported_token_head_case)
from properties.strategies import POWER_OF_TWO_BOUNDARIES
from rope.harness.suite import plugin_args
from tests.fresh_runs import fresh_env

# A user's kernel of chunked and interleaved sections only: the project's torch implementation
# behind a declaration; ``wrong_from_16384`` reads the wrong position row for its first frequency
# from 16,384 tokens on, a slip only the largest boundary shows.
_KERNEL = '''
from rope.native import rotate_native


def _reason(spec, dtype, device):
    if spec.sections is None or len(spec.sections) != 3 or spec.freq_rows is not None:
        return "chunked and interleaved sections of three rows only"
    if spec.layout not in ("chunked", "interleaved"):
        return "chunked and interleaved sections of three rows only"
    return None


def rotate(spec, positions, query, key, cos_sin_cache):
    return rotate_native(spec, positions, query, key, cos_sin_cache)


def wrong_from_16384(spec, positions, query, key, cos_sin_cache):
    if positions.shape[-1] >= 16384:
        positions = positions.flip(0)
    return rotate_native(spec, positions, query, key, cos_sin_cache)


for fn in (rotate, wrong_from_16384):
    fn.working_precision = rotate_native.working_precision
    fn.unsupported_reason = _reason
'''


def _kernel(tmp_path):
    (tmp_path / "threerows.py").write_text(_KERNEL)
    namespace: dict = {}
    exec(compile(_KERNEL, "threerows.py", "exec"), namespace)
    return namespace


def test_every_power_of_two_count_takes_a_layout_the_kernel_runs(tmp_path):
    kernel = _kernel(tmp_path)["rotate"]
    layouts = set()
    for log2 in POWER_OF_TWO_LOG2:
        for count in power_of_two_counts(log2, "cpu"):
            index = POWER_OF_TWO_BOUNDARIES.index(count)
            case = supported_boundary_case("threerows:rotate", kernel, index, count, "cpu")
            assert kernel.unsupported_reason(case.spec, None, "cpu") is None, (count, case.spec)
            assert case.num_tokens == count
            layouts.add(case.spec.layout)
            # Where the cycle's own turn runs, it is kept: the built-ins' cases do not change.
            cycled = boundary_case(index, count, "cpu")
            if kernel.unsupported_reason(cycled.spec, None, "cpu") is None:
                assert case == cycled
    assert layouts == {"chunked", "interleaved"}
    assert BOUNDARY_KINDS[POWER_OF_TWO_BOUNDARIES.index(16384) % len(BOUNDARY_KINDS)] == "mapped"  # why it mattered


def test_the_mapped_product_case_takes_a_map_the_kernel_runs():
    def glm_only(spec, positions, query, key, cos_sin_cache):
        raise AssertionError("not called")
    glm_only.unsupported_reason = lambda spec, dtype, device: (
        None if spec.variant().startswith("glmrr") else "the GLM round-robin map only")
    for index in range(4):
        case = supported_token_head_case("glm_only", glm_only, "mapped", True, False, index, "cpu")
        assert case.spec.variant().startswith("glmrr"), case.spec.variant()


@pytest.mark.needs_no_gpu          # a pytest session pinned to the CPU
def test_a_slip_only_the_16384_boundary_shows_is_caught_in_a_kernel_without_the_map_of_its_turn(tmp_path):
    _kernel(tmp_path)
    env = fresh_env(keep_pythonpath=False)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q",
                          "--pyargs", "properties.rotation.test_prefill", "-k", "power_of_two and 16384",
                          "--rope-impl", "threerows:wrong_from_16384", "--rope-device", "cpu"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and "1 failed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
