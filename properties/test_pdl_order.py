"""The rotation kernel under programmatic dependent launch reads nothing before the previous kernel is done.

Launched with PDL (rope/triton/pdl.py), a kernel starts while the kernel before it in the stream
still runs, as soon as that kernel lets it (``gdc_launch_dependents``); only ``gdc_wait`` orders
its reads after the other kernel's writes.  A read issued before the wait sees whatever was in
memory then.  Positions, the cache and q/k may all be the previous kernel's outputs, so the rotation
uses nothing read before the wait: by default it reads everything after it, or, at the token counts
where it speculates (``speculate_positions``), guesses the positions before the wait and checks the
guesses against a second read after it, reading cos/sin again where one was wrong.
``positions_before_wait=True`` reads the positions before the wait and trusts them, which is right
only when the previous kernel does not write them.

Here the previous kernel lets its dependents launch at once, spins for a while, and only then
writes the step's positions: the default launch (speculating at 1 token, not at 200), the
speculating launch at both sizes and the public entry must rotate by the new positions; the launch
that trusts positions read before the wait must rotate by the old ones, which shows that the test
sees a read placed before the wait (a kernel whose wait moved down, or whose check of its guesses
were lost, would fail the first test the way that launch does).  Each launch is compiled before the race: a first call's JIT
compile would outlast the spinning kernel.  GPU with PDL only (compute capability 9+).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import reference
from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.harness.tolerance import compare_rotation
from rope.models import load_models
from rope.registry import get_implementation
from rope.triton.pdl import HAS_PDL, pdl_available
from rope.triton.rotary import launch_rotary

if HAS_PDL:
    from rope.triton.pdl import gdc_launch_dependents, gdc_wait

SPEC = load_models()["qwen2.5-vl-72b"].spec
SPINS = 200_000     # about 0.2-0.5 ms of dependent float arithmetic on an H200 before the positions are written


@triton.jit
def _late_positions_kernel(new_ptr, out_ptr, n, spins, one, BLOCK: tl.constexpr):
    """Let the next kernel launch, spin, then copy ``n`` positions from new_ptr to out_ptr.  ``one`` is
    1.0 passed at run time: from a constant start the compiler folds the loop away."""
    gdc_wait()
    gdc_launch_dependents()
    offs = tl.arange(0, BLOCK)
    x = tl.zeros([BLOCK], tl.float32) + one
    for _ in range(spins):
        x = x * 0.5 + 0.5                    # stays 1.0: a dependent chain the store waits for
    mask = offs < n
    values = tl.load(new_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, values + (x - 1.0).to(tl.int64), mask=mask)


def _needs_pdl(device):
    if device != "cuda" or not torch.cuda.is_available() or not pdl_available(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs a CUDA GPU of compute capability 9+ and Triton with launch_pdl")


def _case(device, tokens=1):
    gen = torch.Generator().manual_seed(7)
    dev = torch_device(device)
    old = torch.randint(0, 2048, (3, tokens), generator=gen).to(dev)
    new = (old + 1000).contiguous()          # every row moves: a stale read rotates every channel wrongly
    q = torch.randn(tokens, 8 * 128, generator=gen).to(dev, torch.bfloat16)
    k = torch.randn(tokens, 128, generator=gen).to(dev, torch.bfloat16)
    cache = cos_sin_cache(SPEC, torch.bfloat16, dev)
    return old, new, q, k, cache


def _rotate_after_late_positions(rotate, old, new, q, k, cache):
    """positions = old; a PDL kernel writes new into it late; then ``rotate(positions, q, k)``.
    Returns the rotated (q, k) and the writer's own time in ms (measured alone, before the race)."""
    positions = old.clone()
    qo, ko = q.clone(), k.clone()
    n = positions.numel()
    rotate(positions.clone(), q.clone(), k.clone())                 # compiled (and cached) before the race
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    _late_positions_kernel[(1,)](new, positions.clone(), n, SPINS, 1.0, BLOCK=triton.next_power_of_2(n), launch_pdl=True)
    end.record()
    torch.cuda.synchronize()
    writer_ms = start.elapsed_time(end)
    _late_positions_kernel[(1,)](new, positions, n, SPINS, 1.0, BLOCK=triton.next_power_of_2(n), launch_pdl=True)
    rotate(positions, qo, ko)
    torch.cuda.synchronize()
    assert torch.equal(positions, new), "the late kernel wrote the new positions"
    return qo, ko, writer_ms


def _matches(positions, q, k, cache, qo, ko) -> bool:
    ref_q, ref_k = reference.rotate(SPEC, positions.cpu(), q.cpu(), k.cpu(), cache.cpu())
    return compare_rotation(SPEC, positions.cpu(), q.cpu(), k.cpu(), cache.cpu(), qo.cpu(), ko.cpu(), ref_q, ref_k,
                            "float32").ok


@pytest.mark.parametrize("tokens", [1, 200])
def test_rotation_reads_positions_after_the_previous_kernel(device, tokens):
    _needs_pdl(device)
    old, new, q, k, cache = _case(device, tokens)
    for name, rotate in (("unchecked, pdl", lambda p, a, b: launch_rotary(SPEC, p, a, b, cache, pdl=True)),
                         ("speculating", lambda p, a, b: launch_rotary(SPEC, p, a, b, cache, pdl=True,
                                                                       speculate_positions=True)),
                         ("public entry", lambda p, a, b: get_implementation("triton")(SPEC, p, a, b, cache))):
        qo, ko, _ = _rotate_after_late_positions(rotate, old, new, q, k, cache)
        assert _matches(new, q, k, cache, qo, ko), f"{name}: rotated by positions read before the previous kernel wrote them"


def test_positions_read_before_the_wait_are_the_old_ones(device):
    # The hazard is real and this setup shows it: the launch that reads positions before the wait
    # rotates by what the buffer held when it started.
    _needs_pdl(device)
    old, new, q, k, cache = _case(device)
    qo, ko, writer_ms = _rotate_after_late_positions(
        lambda p, a, b: launch_rotary(SPEC, p, a, b, cache, pdl=True, positions_before_wait=True), old, new, q, k, cache)
    assert not _matches(new, q, k, cache, qo, ko), (
        f"rotated by the new positions: the race was not shown (the writer alone took "
        f"{writer_ms:.3f} ms)")
    assert _matches(old, q, k, cache, qo, ko), "rotated by neither the old nor the new positions"
