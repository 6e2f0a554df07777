"""The built-in Triton entries as torch custom ops (rope/triton/ops.py): their schema, mutation
declarations and fake implementations hold (torch.library.opcheck), they give the entries' bits,
and torch.compile(fullgraph=True) traces a serving engine's attention preamble through them; on a
GPU the compiled preamble is captured in a CUDA graph and replayed with new inputs."""

from __future__ import annotations

import pytest
import torch

import reference
from rope import RopeSpec, cos_sin_cache
from rope.triton import ops
from rope.devices import triton_runs_on
from rope.triton.rotary import rotate_triton

pytestmark = pytest.mark.stack      # meets the installed torch and Triton: CI runs it on every stack (.ci/run)

GLM41V = RopeSpec(head_size=128, rotary_dim=64, is_neox_style=False, sections=(8, 12, 12), layout="chunked",
                  max_position=64)
QWEN3VL = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(24, 20, 20), layout="interleaved",
                   max_position=64)
# A map the kernel reads from its table (layout "custom": the op passes freq_rows).
CUSTOM_MAP = RopeSpec.from_map(tuple(i % 3 for i in range(64))[::-1], head_size=128, is_neox_style=False,
                               max_position=64)
Q_HEADS, KV_HEADS = 4, 2


@pytest.fixture(autouse=True)
def _triton_runs_there(request):
    """The ops launch the Triton kernels: on a device where Triton does not run here (the CPU of a
    GPU box, without TRITON_INTERPRET=1) there is nothing to check."""
    device = request.getfixturevalue("device") if "device" in request.fixturenames else None
    if device is not None and not triton_runs_on(device):
        pytest.skip(f"Triton does not run on {device} here (TRITON_INTERPRET=1 runs it on the CPU)")


def _inputs(spec: RopeSpec, tokens: int, device: str, dtype=torch.bfloat16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, spec.max_position, (spec.num_dims, tokens), generator=g).to(device)
    width = (Q_HEADS + 2 * KV_HEADS) * spec.head_size
    qkv = torch.randn(tokens, width, generator=g).to(device=device, dtype=dtype)
    return positions, qkv, cos_sin_cache(spec, dtype=dtype, device=device)


def _split(qkv, spec):
    return qkv.split([Q_HEADS * spec.head_size, KV_HEADS * spec.head_size, KV_HEADS * spec.head_size], dim=-1)


@pytest.mark.parametrize("spec", [GLM41V, QWEN3VL, CUSTOM_MAP], ids=["glm41v", "qwen3vl", "custom"])
def test_the_rotation_op_keeps_its_declarations(device, spec):
    positions, qkv, cache = _inputs(spec, 5, device)
    q, k, _ = _split(qkv.clone(), spec)
    args = (positions, q.contiguous(), k.contiguous(), cache, spec.head_size, spec.rotary_dim, spec.is_neox_style,
            list(spec.sections), spec.layout, list(spec.freq_rows or ()))
    torch.library.opcheck(torch.ops.rope_harness.rotary_.default, args)
    no_key = (positions, q.contiguous(), None, cache, *args[4:])
    torch.library.opcheck(torch.ops.rope_harness.rotary_.default, no_key)


@pytest.mark.parametrize("spec", [GLM41V, QWEN3VL, CUSTOM_MAP], ids=["glm41v", "qwen3vl", "custom"])
def test_the_rotation_op_gives_the_entrys_bits_in_place(device, spec):
    positions, qkv, cache = _inputs(spec, 7, device)
    q_ref, k_ref, _ = _split(qkv.clone(), spec)
    rotate_triton(spec, positions, q_ref, k_ref, cache)
    rotated = qkv.clone()
    q, k, v = _split(rotated, spec)              # row-strided views into one tensor, as a QKV projection gives
    out_q, out_k = ops.rotary(spec, positions, q, k, cache)
    assert out_q is q and out_k is k
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert torch.equal(v, _split(qkv, spec)[2]), "the value slice was written"
    # A last dim with a stride (the entry rotates a copy there): the op still rotates in place.
    strided = torch.empty(7, 2 * Q_HEADS * spec.head_size, dtype=qkv.dtype, device=device)[:, ::2]
    strided.copy_(_split(qkv, spec)[0])
    ops.rotary(spec, positions, strided, None, cache)
    assert torch.equal(strided, q_ref)


def _preamble(spec):
    """A serving engine's attention preamble: q, k, v from one projection, q and k rotated in
    place, the three written out."""
    def preamble(x, weight, positions, cache):
        qkv = x @ weight
        q, k, v = _split(qkv, spec)
        q, k = ops.rotary(spec, positions, q, k, cache)
        return torch.cat([q, k, v], dim=-1)
    return preamble


def test_compile_traces_the_preamble_through_the_op_in_one_graph(device):
    spec = QWEN3VL
    positions, _, cache = _inputs(spec, 6, device, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 32, generator=g).to(device)
    weight = torch.randn(32, (Q_HEADS + 2 * KV_HEADS) * spec.head_size, generator=g).to(device)
    preamble = _preamble(spec)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(preamble)(x, weight, positions, cache)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    backend = "inductor" if device != "cpu" else "aot_eager"     # no C++ compiler needed on the CPU
    compiled = torch.compile(preamble, fullgraph=True, backend=backend)
    got = compiled(x, weight, positions, cache)
    expected = preamble(x, weight, positions, cache)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # And the rotation is the reference's: the op ran, it was not traced away.
    q_ref, _ = reference.rotate(spec, positions.cpu(), _split(x.cpu() @ weight.cpu(), spec)[0], None, cache.cpu())
    torch.testing.assert_close(got[:, :Q_HEADS * spec.head_size].cpu().double(), q_ref, rtol=1e-4, atol=1e-4)


def test_the_position_step_op_keeps_its_declarations_and_compiles(device):
    from properties.position_step.known_steps import CHUNK_2      # a chunked-prefill step
    from properties.strategies import OUT_SENTINEL
    from rope.devices import torch_device
    from rope.harness.position_step.check import POSITION_ARGUMENTS
    from rope.triton.positions import prepare_positions_triton
    tensors = CHUNK_2.tensors(device)
    args = tuple(tensors[name] if name != "num_dims" else CHUNK_2.num_dims for name in POSITION_ARGUMENTS)
    out = torch.full((CHUNK_2.num_dims, CHUNK_2.num_tokens + CHUNK_2.padding), OUT_SENTINEL, dtype=torch.int64,
                     device=torch_device(device))
    expected = out.clone()
    prepare_positions_triton(*args, expected)
    torch.library.opcheck(torch.ops.rope_harness.prepare_positions_.default, (*args, out.clone()))

    def step(out):
        ops.prepare_positions(*args, out)
        return out + 0
    got = torch.compile(step, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")(out.clone())
    assert torch.equal(got, expected)


@pytest.mark.gpu
def test_the_compiled_preamble_is_captured_in_a_cuda_graph(device):
    if not device.startswith("cuda"):
        pytest.skip("CUDA graphs need a CUDA device")
    spec = GLM41V
    positions, _, cache = _inputs(spec, 16, device, dtype=torch.bfloat16)
    x = torch.randn(16, 64, device=device, dtype=torch.bfloat16)
    weight = torch.randn(64, (Q_HEADS + 2 * KV_HEADS) * spec.head_size, device=device, dtype=torch.bfloat16)
    compiled = torch.compile(_preamble(spec), fullgraph=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):                       # compile and warm up outside the capture
            compiled(x, weight, positions, cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(x, weight, positions, cache)
    for seed in (1, 2):                          # new inputs in the captured buffers, replayed
        g = torch.Generator(device=device).manual_seed(seed)
        x.copy_(torch.randn(x.shape, generator=g, device=device, dtype=x.dtype))
        positions.copy_(torch.randint(0, spec.max_position, positions.shape, generator=g, device=device))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _preamble(spec)(x, weight, positions, cache))
