"""The comparison made where the outputs are (rope.harness.rotation.bound.passes_on_device): on a
pass, the elements and the worst error/bound of the CPU's comparison to the bit, however the tokens
are sliced; never a pass where one element is past its bound (in any slice, the last included) or
an output is malformed; and the one-case check that uses it reports a failure exactly as the CPU
comparison does (the device only ever says "passed")."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from properties.mutants import broken_rotations
from properties.strategies import rotation_cases
from rope.harness.rotation import check
from rope.harness.rotation.bound import compare_rotation, passes_on_device
from rope.harness.rotation.cases import RotationCase, build_rotation_pair
from rope.registry import get_implementation, working_precision
from rope.spec import RopeSpec

NATIVE = get_implementation("native")


def _run(case, device):
    inputs, ref_in = build_rotation_pair(case, device)
    q_out, k_out = NATIVE(case.spec, inputs.positions, inputs.query, inputs.key, inputs.cache)
    return ref_in, q_out, k_out


def _on_cpu(case, ref_in, q_out, k_out):
    ref_q, ref_k = reference.rotate(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache)
    return compare_rotation(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache, q_out, k_out,
                            ref_q, ref_k, working_precision(NATIVE))


def _on_device(case, ref_in, q_out, k_out, slice_elements):
    return passes_on_device(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache, q_out, k_out,
                            working_precision(NATIVE), reference.rotate, slice_elements=slice_elements)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), slice_elements=st.sampled_from([1, 64, 1000, 1 << 23]))
def test_a_pass_is_the_cpu_comparison_to_the_bit(device, data, slice_elements):
    case = data.draw(rotation_cases(dtype=data.draw(st.sampled_from(["float32", "bfloat16", "float16"]))))
    ref_in, q_out, k_out = _run(case, device)
    cpu = _on_cpu(case, ref_in, q_out, k_out)
    assert cpu.ok, cpu.message()
    assert _on_device(case, ref_in, q_out, k_out, slice_elements) == (cpu.num_elements, cpu.worst_ratio)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), slice_elements=st.sampled_from([1, 64, 1 << 23]))
def test_one_element_past_its_bound_anywhere_is_never_a_pass(device, data, slice_elements):
    case = data.draw(rotation_cases(dtype=data.draw(st.sampled_from(["float32", "bfloat16"]))))
    ref_in, q_out, k_out = _run(case, device)
    outputs = [q_out] + ([k_out] if k_out is not None and k_out.numel() else [])
    target = data.draw(st.sampled_from(range(len(outputs))), label="tensor")
    if not outputs[target].numel():
        return
    token = data.draw(st.sampled_from([0, case.num_tokens - 1]), label="token")      # first or last slice
    column = data.draw(st.integers(0, outputs[target].shape[1] - 1), label="column")
    wrong = outputs[target].clone()
    wrong[token, column] = wrong[token, column] + 1 if torch.isfinite(wrong[token, column]) else 0.0
    outputs[target] = wrong
    q_bad, k_bad = outputs[0], (outputs[1] if len(outputs) > 1 else k_out)
    assert not _on_cpu(case, ref_in, q_bad, k_bad).ok
    assert _on_device(case, ref_in, q_bad, k_bad, slice_elements) is None


@pytest.mark.parametrize("malformed", ["dtype", "shape", "none", "key-for-none"])
def test_a_malformed_output_is_never_a_pass(malformed):
    case = RotationCase(RopeSpec(64, 64, True), 5, 2, 0 if malformed == "key-for-none" else 1, "float32",
                        "uniform", False, seed=3)
    ref_in, q_out, k_out = _run(case, "cpu")
    if malformed == "dtype":
        q_out = q_out.to(torch.float64)
    elif malformed == "shape":
        q_out = q_out[:-1]
    elif malformed == "none":
        q_out = None
    else:
        k_out = q_out[:, :64].clone()
    assert _on_device(case, ref_in, q_out, k_out, 1 << 23) is None


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_the_one_case_check_reports_a_failure_as_the_cpu_does(data):
    """With the device comparison on (as on a GPU), a correct call passes with the CPU's figures and
    no reference kept; a wrong one falls back to the CPU comparison: the same mismatches, the same
    worst elements, and the reference the diagnosis reads."""
    case = data.draw(rotation_cases(dtype=data.draw(st.sampled_from(["float32", "bfloat16"]))))
    fn = broken_rotations.neox_for_gptj
    on, off = [], []
    for flag, runs in ((True, on), (False, off)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(check, "compares_on_device", lambda device, flag=flag: flag)
            runs.append(check.evaluate_case("native", NATIVE, case, "cpu"))
            runs.append(check.evaluate_case("neox_for_gptj", fn, case, "cpu"))
    assert on[0].comparison.ok and on[0].ref_q is None
    assert (on[0].comparison.num_elements, on[0].comparison.worst_ratio) == \
        (off[0].comparison.num_elements, off[0].comparison.worst_ratio)
    assert on[1].comparison.ok == off[1].comparison.ok
    assert on[1].comparison.message() == off[1].comparison.message()
    if not on[1].comparison.ok:
        assert on[1].ref_q is not None and torch.equal(on[1].ref_q, off[1].ref_q)


def test_a_gpu_compares_on_the_gpu_and_the_cpu_on_the_cpu():
    assert not check.compares_on_device(torch.device("cpu"))
    assert check.compares_on_device(torch.device("cuda", 0))
