"""rope.harness.interpreter: Triton's interpreter without re-patching triton.language per helper
call and without the overflow checks it discards gives the same bits, patches once per grid, and
leaves a Triton it does not know alone; every grid runs in one chunk of CPython's frame stack, at
any stack depth."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from rope.devices import is_interpreter
from rope.harness import interpreter as speed
from rope.harness.rotation.cases import RotationCase, build_rotation_inputs
from rope.registry import get_implementation
from rope.spec import RopeSpec

pytestmark = pytest.mark.skipif(not is_interpreter(), reason="Triton's interpreter only (no GPU, TRITON_INTERPRET=1)")


@triton.jit
def _scaled(x, BLOCK: tl.constexpr):
    return x * 2.0 + tl.arange(0, BLOCK).to(tl.float32)


@triton.jit
def _helpers_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # A helper of this module (_scaled: its globals hold tl) and one of triton.language.standard
    # (tl.cdiv: its globals hold tl.core, which the grid's own patch leaves alone).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.maximum(_scaled(x, BLOCK), 0.0) + tl.cdiv(n, BLOCK)
    tl.store(out_ptr + offs, y, mask=mask)


def _reinstall() -> None:
    """Both speed-ups back, as the plugin installs them."""
    speed.skip_repeated_patching()
    speed.skip_discarded_overflow_checks()


@triton.jit
def _int_arithmetic_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, x * 3 - offs + n, mask=mask)


def _with_and_without(run):
    """run() with the faster helper call and with Triton's own; the faster one is left installed
    as the plugin installed it."""
    installed = speed.skip_repeated_patching()
    unchecked = speed.skip_discarded_overflow_checks()
    fast = run()
    speed.restore_patching()
    try:
        slow = run()
    finally:
        if installed:
            speed.skip_repeated_patching()
        if unchecked:
            speed.skip_discarded_overflow_checks()
    return installed and unchecked, fast, slow


def _launched_with_and_without(kernel, x, seen: list):
    """``kernel(x, out, n, BLOCK=64)`` over ``x`` with the speed-ups and with Triton's own calls:
    (installed, out with, out without, what ``seen`` collected during each launch)."""
    counts = []

    def run():
        seen.clear()
        out = torch.empty_like(x)
        kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        counts.append(list(seen))
        return out

    installed, fast, slow = _with_and_without(run)
    return installed, fast, slow, counts


def test_rotation_gives_the_same_bits_with_and_without_the_repeated_patching():
    spec = RopeSpec(64, 64, True, (8, 12, 12), "interleaved", max_position=512)
    case = RotationCase(spec, 37, 5, 2, "bfloat16", "grid", True, 3)
    impl = get_implementation("triton")

    def run():
        x = build_rotation_inputs(case, "cpu")
        q, k = impl(spec, x.positions, x.query, x.key, x.cache)
        return q.clone(), k.clone()

    installed, fast, slow = _with_and_without(run)
    assert installed, "the faster helper call was not installed for this Triton"
    assert torch.equal(fast[0].view(torch.int16), slow[0].view(torch.int16))
    assert torch.equal(fast[1].view(torch.int16), slow[1].view(torch.int16))


def test_helpers_of_other_modules_are_patched_and_results_agree(monkeypatch):
    from triton.runtime import interpreter
    calls = []
    real = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: calls.append(fn.__name__) or real(fn))
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    installed, fast, slow, counts = _launched_with_and_without(_helpers_kernel, x, calls)
    assert installed
    assert torch.equal(fast, slow)
    assert torch.equal(fast, torch.clamp(x * 2.0 + torch.arange(1000).remainder(64).float(), min=0.0) + 16)
    # The faster call patches the grid, then triton.language.core once, at tl.cdiv's first call;
    # Triton's own patches again at every helper call of each of the 16 programs.
    assert counts[0] == ["_helpers_kernel", "cdiv"], counts[0]
    assert len(counts[1]) >= 1 + 2 * 16, counts[1]


def test_an_unknown_triton_is_left_alone(monkeypatch):
    from triton.runtime import interpreter
    installed = speed._APPLIED[0]
    speed.restore_patching()
    try:
        def changed(self, *args, **kwargs):
            return self.rewrite()(*args, **kwargs)
        monkeypatch.setattr(interpreter.InterpretedFunction, "__call__", changed)
        triton_grid_call = interpreter.GridExecutor.__call__
        assert speed.skip_repeated_patching() is False
        assert interpreter.InterpretedFunction.__call__ is changed
        # The grid still runs in one stack chunk (a wrapper that needs nothing of Triton's code) ...
        assert interpreter.GridExecutor.__call__ is not triton_grid_call
        speed.restore_patching()
        assert interpreter.GridExecutor.__call__ is triton_grid_call     # ... and comes off again.
    finally:
        monkeypatch.undo()
        if installed:
            _reinstall()


def _worst_page_faults(launch) -> int:
    """The most minor page faults one launch() takes, called from each of 160 stack depths (a
    16 KiB chunk of CPython's frame stack holds about 130 frames of ``at``).  Counted for this
    thread alone where the system can (Linux's RUSAGE_THREAD): the process's other threads (xdist's
    messages, a library's monitor thread, pytest-timeout's timer) fault pages whenever they run."""
    resource = pytest.importorskip("resource")
    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        pytest.skip("no per-thread page-fault count here (RUSAGE_THREAD is Linux's)")

    def at(depth):
        if depth:
            return at(depth - 1)
        before = resource.getrusage(who).ru_minflt
        launch()
        return resource.getrusage(who).ru_minflt - before

    launch()
    return max(at(depth) for depth in range(160))


def _fewest_page_faults(launch, sweeps: int = 3) -> int:
    """:func:`_worst_page_faults` of the best of up to ``sweeps`` sweeps (stopping at one under the
    bound): a chunk mapped per call faults in every sweep, while pages the host reclaimed under
    memory pressure (a VM's proactive reclaim, other runs beside this one: once 14,678 faults where
    the sweeps alone take a handful) fault in once and are back for the next sweep."""
    fewest = _worst_page_faults(launch)
    for _ in range(sweeps - 1):
        if fewest < 50:
            break
        fewest = min(fewest, _worst_page_faults(launch))
    return fewest


def test_a_grid_runs_in_one_stack_chunk_at_every_depth():
    x = torch.randn(256, generator=torch.Generator().manual_seed(0))

    def launch():
        _helpers_kernel[(4,)](x, torch.empty_like(x), 256, BLOCK=64)

    installed = speed._APPLIED[0]
    speed.restore_patching()
    try:
        plain = _worst_page_faults(launch)
        if plain < 500:
            pytest.skip(f"this Python maps no frame-stack chunk per call (at most {plain} page faults a launch)")
        # Triton's own calls at the depth where each of them maps, faults in and unmaps a chunk:
        # thousands of faults; from one chunk, a handful.
        assert _fewest_page_faults(lambda: speed.in_one_stack_chunk(launch)) < 50
        speed.skip_repeated_patching()
        assert _fewest_page_faults(launch) < 50, "the installed grid call does not run in one stack chunk"
    finally:
        speed.restore_patching()
        if installed:
            _reinstall()


def test_the_discarded_overflow_checks_are_not_built_and_results_agree(monkeypatch):
    from triton.runtime import interpreter
    asserts = []
    real = interpreter.interpreter_semantic.device_assert     # the class's stays, for the source check
    monkeypatch.setattr(interpreter.interpreter_semantic, "device_assert",
                        lambda *a, **k: asserts.append(1) or real(*a, **k), raising=False)
    x = torch.randint(-1000, 1000, (300,), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    installed, fast, slow, seen = _launched_with_and_without(_int_arithmetic_kernel, x, asserts)
    counts = [len(s) for s in seen]
    assert installed
    assert torch.equal(fast, slow)
    assert torch.equal(fast, x * 3 - torch.arange(300, dtype=torch.int32) + 300)
    # Without debug the interpreter builds an overflow check per integer +, - and * (of the offsets
    # too) and device_assert drops it; skipped, none is built.
    assert counts[0] == 0, counts[0]
    assert counts[1] >= 5 * 3, counts[1]


def test_overflow_checks_stay_under_debug(monkeypatch):
    import dataclasses

    from triton.runtime import interpreter
    speed.restore_patching()
    try:
        debug = dataclasses.replace(interpreter.interpreter_builder.options, debug=True)
        monkeypatch.setattr(interpreter.interpreter_builder, "options", debug)
        assert speed.skip_discarded_overflow_checks() is False
        assert interpreter.interpreter_builder.options is debug
        monkeypatch.undo()
        # A Triton whose device_assert asserts whatever the options: left alone as well.
        monkeypatch.setattr(speed, "_ASSERT_ONLY_UNDER_DEBUG", "no such line")
        options = interpreter.interpreter_builder.options
        assert speed.skip_discarded_overflow_checks() is False
        assert interpreter.interpreter_builder.options is options
    finally:
        monkeypatch.undo()
        _reinstall()
