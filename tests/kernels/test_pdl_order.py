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

Here the previous kernel lets its dependents launch at once, then holds until the test releases
it (a flag in page-locked host memory that the kernel polls over the bus, set by the host after the
rotation is queued), and only then writes the step's positions.  Whether the rotation is then
resident and has issued its early reads depends on the GPU's other work, so the verdict does not:
the default launch (speculating at 1 token, not at 200), the speculating launch at both sizes and
the public entry must rotate by the new positions whatever the timing; the launch that trusts
positions read before the wait must rotate by the old ones, which shows that the test sees a read
placed before the wait (a kernel whose wait moved down, or whose check of its guesses were lost,
would fail the first test the way that launch does).  Where the rotation did not start before the
release in any of a few attempts, each holding the writer longer, that control skips and says so:
it never fails for a busy GPU.  Each launch is compiled before the race.  GPU with PDL only
(compute capability 9+).
"""

from __future__ import annotations

import time

import pytest
import torch
import triton
import triton.language as tl

import reference
from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.harness.rotation.bound import compare_rotation
from rope.models import load_models
from rope.registry import get_implementation
from rope.triton.pdl import HAS_PDL
from rope.triton.targets import pdl_available
from rope.triton.rotary import launch_rotary

if HAS_PDL:
    from rope.triton.pdl import gdc_launch_dependents, gdc_wait

SPEC = load_models()["qwen2.5-vl-72b"].spec
MAX_POLLS = 1 << 24    # a writer never released (the test died between launch and release) still ends
HOLDS_S = (0.002, 0.02, 0.2)   # how long the host holds the writer after queuing the rotation, per attempt


@triton.jit
def _released_positions_kernel(new_ptr, out_ptr, flag_ptr, n, max_polls, BLOCK: tl.constexpr):
    """Let the next kernel launch, poll ``*flag_ptr`` (host memory) until the host sets it, then
    copy ``n`` positions from new_ptr to out_ptr.  A writer that gave up after ``max_polls`` polls
    writes nothing, so a lost release shows as positions never written, not as a wrong race."""
    gdc_wait()
    gdc_launch_dependents()
    released = tl.load(flag_ptr, volatile=True)
    polls = 0
    while (released == 0) & (polls < max_polls):
        released = tl.load(flag_ptr, volatile=True)
        polls += 1
    offs = tl.arange(0, BLOCK)
    mask = (offs < n) & (released != 0)
    tl.store(out_ptr + offs, tl.load(new_ptr + offs, mask=mask, other=0), mask=mask)


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


def _rotate_after_late_positions(rotate, old, new, q, k, cache, hold_s=HOLDS_S[0]):
    """positions = old; a PDL kernel writes new into it once released; ``rotate(positions, q, k)`` is
    queued behind it, and the host releases the writer ``hold_s`` seconds later.  Returns the rotated (q, k)."""
    positions = old.clone()
    qo, ko = q.clone(), k.clone()
    n = positions.numel()
    flag = torch.ones(1, dtype=torch.int32, pin_memory=True)
    block = triton.next_power_of_2(n)
    # Compiled (and cached) before the race: a first call's JIT compile would run while the writer holds.
    _released_positions_kernel[(1,)](new, positions.clone(), flag, n, MAX_POLLS, BLOCK=block, launch_pdl=True)
    rotate(positions.clone(), q.clone(), k.clone())
    torch.cuda.synchronize()
    flag.zero_()
    try:
        _released_positions_kernel[(1,)](new, positions, flag, n, MAX_POLLS, BLOCK=block, launch_pdl=True)
        rotate(positions, qo, ko)
        time.sleep(hold_s)
    finally:
        flag.fill_(1)                       # the release: a failed launch above never leaves the GPU spinning
        torch.cuda.synchronize()
    assert torch.equal(positions, new), "the writer wrote the new positions once released"
    return qo, ko


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
        qo, ko = _rotate_after_late_positions(rotate, old, new, q, k, cache)
        assert _matches(new, q, k, cache, qo, ko), f"{name}: rotated by positions read before the previous kernel wrote them"


def test_positions_read_before_the_wait_are_the_old_ones(device):
    # The hazard is real and this setup shows it: the launch that reads positions before the wait
    # rotates by what the buffer held when it started, provided it started before the release.
    _needs_pdl(device)
    old, new, q, k, cache = _case(device)
    early = lambda p, a, b: launch_rotary(SPEC, p, a, b, cache, pdl=True, positions_before_wait=True)  # noqa: E731
    for hold_s in HOLDS_S:
        qo, ko = _rotate_after_late_positions(early, old, new, q, k, cache, hold_s)
        if _matches(old, q, k, cache, qo, ko):
            return                          # the early read saw the old positions: the race was staged
        assert _matches(new, q, k, cache, qo, ko), "rotated by neither the old nor the new positions"
    pytest.skip(f"the race was not staged: in {len(HOLDS_S)} attempts (the writer held up to {HOLDS_S[-1]} s) "
                "the rotation started only after the writer finished, so this GPU showed no early read")
