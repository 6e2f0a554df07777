"""The Triton rotation's backward: the kernel's INVERSE switch (rotation by -θ) behind the
differentiable custom op ``rope_harness::rotary`` and its entry ``rope.triton.ops.rotate_with_grad``
(registered as ``"triton-autograd"``).

torch.autograd through the entry is held to the float64 reference VJP over drawn layouts, pairings,
partial widths and dtypes (rope/harness/rotation/backward.py: the forward, the gradients of q and k under
the rotation's own bound, the upstream gradient left unwritten); the check is shown to fail, with its
diagnosis, on broken backwards (properties/mutants/broken_backwards.py) and on an in-place kernel with
no backward;
the op keeps its declarations (torch.library.opcheck: schema, fake, autograd registration),
torch.compile(fullgraph=True) differentiates a function calling it, and the INVERSE launches
compile for sm_90.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, strategies as st

import reference
from properties.strategies import DTYPES, KINDS, rotation_cases
from rope import RopeSpec, cos_sin_cache
from rope.devices import triton_runs_on
from rope.implementation import Implementation
from rope.registry import get_implementation, implementation_record
from rope.triton import ops
from rope.triton.rotary import rotate_triton
from properties.mutants.broken_backwards import BROKEN_BACKWARDS, in_place_with_cache_grad
from properties.rotation.backward_cases import model_cases, with_model_examples
from rope.harness import causes
from rope.harness.rotation.backward import BACKWARD_LABELS, assert_backward_matches_reference, check_rotation_backward

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _triton_runs_there(request):
    device = request.getfixturevalue("device") if "device" in request.fixturenames else None
    if device is not None and not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here (TRITON_INTERPRET=1 runs it on the CPU)")


def _few_heads(case):
    """At most 3 query and 2 key heads: the interpreter runs a program per token and head block."""
    return dataclasses.replace(case, num_q_heads=min(case.num_q_heads, 3), num_kv_heads=min(case.num_kv_heads, 2))


# Every kind of map, both pairings, partial widths, fp32 / bf16 / fp16, NaN and infinities planted
# in the upstream gradient too; a few tokens and heads.
BACKWARD_CASES = st.tuples(st.sampled_from(KINDS), st.sampled_from(tuple(DTYPES))).flatmap(
    lambda kind_dtype: rotation_cases(kind=kind_dtype[0], dtype=kind_dtype[1], max_tokens=4, head_sizes=(16, 32, 64),
                                      nonfinite=True)).map(_few_heads)


@given(case=BACKWARD_CASES)
@with_model_examples("bfloat16", num_tokens=2, num_q_heads=1)
def test_triton_backward_matches_reference_vjp(device, case):
    # Rejects: the upstream gradient rotated by +θ, by another row's angle or pairing, pass-through
    # gradients touched, a rounding worse than the forward's, a gradient written into the upstream one.
    assert_backward_matches_reference("triton-autograd", get_implementation("triton-autograd"), case, device)


# GPT-J pairs, partial rotary, 3 rows, a key: the case every broken backward below is run on.
MUTANT_CASE = model_cases("float32", keys=["glm-4.1v-9b"], num_tokens=3)[0]


# Each broken backward -> (whether the check differentiates the cache, its label, what its failure says).
BROKEN_BACKWARD_FAILURES = {
    "backward_returns_none": (False, "gradient_missing", "gradient of query and key: the backward returned None"),
    "backward_rotates_forward": (False, "gradient_wrong",
                                 "the upstream gradient rotated by +θ, as the forward rotates"),
    "backward_writes_upstream_gradient": (False, "upstream_gradient_written",
                                          "grad_query, grad_key: the backward wrote the upstream gradient"),
    "backward_reads_overwritten_input": (True, "gradient_wrong", "gradient of cos_sin_cache: "),
}


def test_every_broken_backward_has_its_failure_and_a_label():
    assert set(BROKEN_BACKWARD_FAILURES) == set(BROKEN_BACKWARDS)
    assert {label for _, label, _ in BROKEN_BACKWARD_FAILURES.values()} <= set(BACKWARD_LABELS)


@pytest.mark.parametrize("name", list(BROKEN_BACKWARDS))
def test_the_backward_property_fails_on_a_broken_backward(device, name):
    wrt_cache, label, says = BROKEN_BACKWARD_FAILURES[name]
    with pytest.raises(AssertionError) as failure:
        assert_backward_matches_reference(name, BROKEN_BACKWARDS[name], MUTANT_CASE, device, wrt_cache=wrt_cache)
    text = " ".join(str(failure.value).split())
    assert f"diagnosis: {label}: " in text and says in text, text
    assert causes.failure_of(failure.value)["cause"] == label
    assert "forward:" not in text, "only the backward is broken"


def test_an_in_place_kernel_without_a_backward_fails_the_property(device):
    # rotate_triton rotates the tensor it is handed in place: autograd sees the copy it was made from
    # and passes the upstream gradient through unrotated.  The serving entry is not a training one.
    verdict = check_rotation_backward("triton", rotate_triton, MUTANT_CASE, device)
    diagnosis = verdict.diagnosis()
    assert diagnosis.label == "gradient_wrong" and "passed through unrotated" in diagnosis.sentence, \
        verdict.message()
    assert "Mismatched elements" in verdict.message()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_cache_gradient_check_passes_a_right_one(device, dtype):
    # The cache half of the check passes a right in-place implementation that differentiates the
    # cache (from copies of q and k kept before rotating them), so the failure above is the bug's.
    for case in model_cases(dtype, keys=["glm-4.1v-9b", "qwen3-vl-2b"], num_tokens=6):
        assert_backward_matches_reference("in_place_with_cache_grad", in_place_with_cache_grad, case, device,
                                          wrt_cache=True)


def test_the_entry_declares_autograd_and_refuses_a_cache_that_wants_a_gradient():
    record = implementation_record("triton-autograd")
    assert record.autograd and record.working_precision == "float32"
    assert record.switch_tokens == Implementation.of("triton", rotate_triton).switch_tokens
    assert not Implementation.of("triton", rotate_triton).autograd
    def mine(spec, positions, query, key, cos_sin_cache):
        return query, key
    mine.autograd = "yes"
    with pytest.raises(ValueError, match=r"mine\.autograd='yes': must be True or False"):
        Implementation.of("mine", mine)
    spec = RopeSpec(16, 16, True, None, max_position=4)
    cache = cos_sin_cache(spec, dtype=torch.float32).requires_grad_()
    with pytest.raises(ValueError, match=r"cos_sin_cache\.requires_grad=True: .* no gradient"):
        ops.rotate_with_grad(spec, torch.zeros(1, dtype=torch.long), torch.zeros(1, 16), None, cache)


QWEN3VL = RopeSpec(head_size=64, rotary_dim=64, is_neox_style=True, sections=(12, 10, 10), layout="interleaved",
                   max_position=64)
GLM41V = RopeSpec(head_size=64, rotary_dim=32, is_neox_style=False, sections=(4, 6, 6), layout="chunked",
                  max_position=64)


@pytest.mark.parametrize("spec, with_key, inverse", [(GLM41V, True, False), (QWEN3VL, False, True)],
                         ids=["glm41v-key", "qwen3vl-no-key-inverse"])
def test_the_differentiable_op_keeps_its_declarations(device, spec, with_key, inverse):
    # Schema, fake implementation, autograd registration (the backward on a key and on no key) and
    # its trace (torch.library.opcheck's checks).
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, spec.max_position, (3, 2), generator=gen).to(device)
    query = torch.randn(2, 2 * spec.head_size, generator=gen).to(device).requires_grad_()
    key = torch.randn(2, spec.head_size, generator=gen).to(device).requires_grad_() if with_key else None
    cache = cos_sin_cache(spec, dtype=torch.float32, device=device)
    fields = (spec.head_size, spec.rotary_dim, spec.is_neox_style, list(spec.sections), spec.layout, [])
    torch.library.opcheck(torch.ops.rope_harness.rotary.default, (positions, query, key, cache, *fields, inverse))


def _attention_preamble(spec):
    """q, k, v from one projection, q and k rotated (differentiably), a loss of all three."""
    def preamble(x, weight, positions, cache):
        q, k, v = (x @ weight).split([2 * spec.head_size, spec.head_size, spec.head_size], dim=-1)
        q, k = ops.rotate_with_grad(spec, positions, q, k, cache)
        return (q[:, :spec.head_size] * k).sum() + (q[:, spec.head_size:] * v).sum()
    return preamble


def test_compile_differentiates_through_the_op_in_one_graph(device):
    spec = QWEN3VL
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, spec.max_position, (3, 4), generator=gen).to(device)
    x = torch.randn(4, 16, generator=gen).to(device)
    weight = torch.randn(16, 4 * spec.head_size, generator=gen).to(device).requires_grad_()
    cache = cos_sin_cache(spec, dtype=torch.float32, device=device)
    preamble = _attention_preamble(spec)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(preamble)(x, weight, positions, cache)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    # Inductor on the CPU compiles C++ around the opaque op (it works, but costs seconds of a
    # compiler): the CPU run traces with aot_eager, which builds the same joint forward-backward graph.
    backend = "inductor" if device != "cpu" else "aot_eager"
    compiled = torch.compile(preamble, fullgraph=True, backend=backend)
    (got,) = torch.autograd.grad(compiled(x, weight, positions, cache), weight)
    (expected,) = torch.autograd.grad(preamble(x, weight, positions, cache), weight)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_backward_is_differentiable_too(device):
    # The backward is the op with INVERSE flipped, so a second derivative (d dq / d upstream) is the
    # forward rotation of its upstream.
    spec = GLM41V
    gen = torch.Generator().manual_seed(2)
    positions = torch.randint(0, spec.max_position, (3, 3), generator=gen).to(device)
    query = torch.randn(3, 2 * spec.head_size, generator=gen).to(device).requires_grad_()
    upstream = torch.randn(query.shape, generator=gen).to(device).requires_grad_()
    cache = cos_sin_cache(spec, dtype=torch.float32, device=device)
    (dq,) = torch.autograd.grad(ops.rotate_with_grad(spec, positions, query, None, cache)[0], query, upstream,
                                create_graph=True)
    v = torch.randn(query.shape, generator=gen).to(device)
    (second,) = torch.autograd.grad(dq, upstream, v)
    forward, _ = rotate_triton(spec, positions, v.clone(), None, cache)
    assert torch.equal(second, forward)


@pytest.mark.needs_no_gpu
@pytest.mark.skipif("nvidia" not in __import__("triton.backends", fromlist=["backends"]).backends,
                    reason="this Triton has no CUDA backend to compile with")
def test_the_inverse_launches_compile_for_sm90():
    # tests/kernels/test_kernel_compiles.py compiles every default launch with INVERSE off; here the
    # plan's INVERSE on (the decode launch, speculating, and the prefill one with key programs of
    # fewer heads), compiled the same way: Triton's NVIDIA backend and ptxas, no driver.
    script = "\n".join([
        "import json",
        "import rope.triton.rotary as rotary",
        "from rope.harness.mutation.kernel_mutant import KernelMutant",
        "from tests.kernels.compile_offline import compile_all, rotation_launches",
        "inverse = KernelMutant('inverse', rotary, 'rotate_triton', [('INVERSE=bool(inverse)', 'INVERSE=True')], '')",
        "launches = [launch for launch in rotation_launches(inverse.module, models=['glm-4.1v-9b'], defaults_only=True)",
        "            if launch[0].split(' ')[2] in ('1', '65536')]",
        "for record in compile_all(launches):",
        "    print(json.dumps(record, default=str))",
    ])
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0 and len(records) == 2, run.stderr[-2000:]
    assert all(r["ok"] and r["constexprs"]["INVERSE"] for r in records), records
    assert {r["constexprs"]["SPECULATE"] for r in records} == {True, False}
    assert any(r["constexprs"]["BLOCK_HK"] < r["constexprs"]["BLOCK_H"] for r in records)


def test_the_inverse_switch_is_the_reference_vjp(device):
    # The entry with inverse=True, outside autograd, is the reference's VJP of its input taken as
    # the upstream gradient, within the forward's bound (the comparison of the suite).
    from rope.harness.rotation.bound import compare_rotation
    spec = GLM41V
    gen = torch.Generator().manual_seed(3)
    positions = torch.randint(0, spec.max_position, (3, 5), generator=gen)
    query, key = torch.randn(5, 2 * spec.head_size, generator=gen), torch.randn(5, spec.head_size, generator=gen)
    cache = cos_sin_cache(spec, dtype=torch.float32)
    handed_q = query.clone().to(device)
    got_q, got_k = rotate_triton(spec, positions.to(device), handed_q, key.clone().to(device), cache.to(device),
                                 inverse=True)
    ref_q, ref_k = reference.rotate_grad(spec, positions, cache, query, key)
    # The outputs stay where the inputs were put: that torch device (cuda:0), not the name "cuda".
    comparison = compare_rotation(spec, positions, query, key, cache, got_q, got_k, ref_q, ref_k,
                                  device=handed_q.device)
    assert comparison.ok, comparison.message("inverse=True")
