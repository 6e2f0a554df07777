"""rope/triton/launcher.py: a launch through the compiled kernel's own launcher launches what
Triton's ``kernel[grid](...)`` would, with the same arguments, and Triton's path is taken wherever
the shortcut could not be exact."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rope.triton import launcher

triton_specialization = pytest.importorskip("triton._C.libtriton").native_specialize_impl
from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


def _triton_specializes(arg):
    """What Triton's binder specializes ``arg`` on (its type string and attributes)."""
    return triton_specialization(BaseBackend, arg, False, True, True)


EDGE_INTS = (0, 1, 2, 15, 16, 17, 32, 2**31 - 16, 2**31 - 1, 2**31, 2**32, 2**63 - 16, 2**63, -1, -16, -2**31, -2**31 - 16)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(EDGE_INTS), st.integers(-2**40, 2**40)), min_size=2, max_size=2))
def test_an_integers_key_is_finer_than_tritons_specialization(pair):
    a, b = pair
    if launcher._argument_key((a,)) == launcher._argument_key((b,)):
        assert _triton_specializes(a) == _triton_specializes(b)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from((torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)),
       st.integers(0, 40), st.sampled_from((torch.float32, torch.bfloat16, torch.int64)), st.integers(0, 40))
def test_a_tensors_key_is_finer_than_tritons_specialization(dtype_a, offset_a, dtype_b, offset_b):
    # Views at element offsets move the address off and onto 16-byte boundaries.
    a = torch.zeros(64, dtype=dtype_a)[offset_a:]
    b = torch.zeros(64, dtype=dtype_b)[offset_b:]
    if launcher._argument_key((a,)) == launcher._argument_key((b,)):
        assert _triton_specializes(a) == _triton_specializes(b)
    # ... and the key does tell apart what Triton tells apart (alignment, dtype).
    if _triton_specializes(a) != _triton_specializes(b):
        assert launcher._argument_key((a,)) != launcher._argument_key((b,))


def test_anything_but_ints_and_tensors_has_no_key():
    assert launcher._argument_key((torch.zeros(2), 3, None)) is None
    assert launcher._argument_key((torch.zeros(2), 2.5)) is None


# ---------------------------------------------------------------- the launch, Triton's side faked
def _kernel(x_ptr, n, BLOCK, FLAG):           # the parameters of a kernel: two runtime, two constexpr
    pass


class _Compiled:
    """Stands in for Triton's CompiledKernel: its launcher records what it is given."""

    def __init__(self, launches):
        self.function, self.packed_metadata = "function-handle", "metadata"
        self.run = lambda *a: launches.append(("launcher", a))


class _BaseSpecialization:
    """A backend that specializes as Triton's base backend (CUDA's) does."""
    get_int_specialization = staticmethod(BaseBackend.get_int_specialization)
    get_tensor_specialization = staticmethod(BaseBackend.get_tensor_specialization)


class _FakeJIT(JITFunction):
    """A JITFunction whose Triton path records its launches and returns the fake compiled kernel
    (no GPU here); its device cache holds Triton's base backend for device 0."""

    def __init__(self, launches):
        super().__init__(_kernel)
        self.launches = launches
        self.device_caches = {0: ({}, {}, None, _BaseSpecialization(), None)}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches.append(("triton", grid, args, kwargs))
            return _Compiled(self.launches)
        return run


@pytest.fixture
def fake_driver(monkeypatch):
    monkeypatch.setattr(launcher, "_driver_functions", lambda: (lambda: 0, lambda device: "stream"))
    monkeypatch.setattr(launcher, "_ENABLED", True)


def test_a_kept_launch_passes_the_arguments_and_constexprs_in_parameter_order(fake_driver):
    launches = []
    kernel = _FakeJIT(launches)
    x = torch.zeros(16)
    constexprs = {"FLAG": True, "BLOCK": 64, "num_warps": 4}
    launcher.launch(kernel, (2, 1, 1), (x, 5), constexprs, "plan")
    assert launches[-1][0] == "triton" and launcher.kept(kernel) == 1
    launcher.launch(kernel, (3, 1, 1), (x, 5), constexprs, "plan")
    assert launches[-1] == ("launcher", (3, 1, 1, "stream", "function-handle", "metadata", None, None, None, x, 5, 64, True))


def test_what_triton_would_specialize_otherwise_takes_tritons_path(fake_driver):
    launches = []
    kernel = _FakeJIT(launches)
    x = torch.zeros(64)
    constexprs = {"BLOCK": 64, "FLAG": False}
    launcher.launch(kernel, (1, 1, 1), (x, 5), constexprs, "plan")
    for args, plan in (((x[1:], 5), "plan"),       # the address off its 16-byte boundary
                       ((x, 16), "plan"),          # an int divisible by 16
                       ((x, 1), "plan"),           # an int of 1 (a constexpr to Triton)
                       ((x.double(), 5), "plan"),  # another dtype
                       ((x, 5), "other plan")):    # other constexprs or options
        launcher.launch(kernel, (1, 1, 1), args, constexprs, plan)
        assert launches[-1][0] == "triton", (args, plan)
    launcher.launch(kernel, (1, 1, 1), (x, 5), constexprs, "plan")
    assert launches[-1][0] == "launcher"


def test_tritons_path_where_the_shortcut_cannot_be_exact(fake_driver, monkeypatch):
    launches = []
    kernel = _FakeJIT(launches)
    x = torch.zeros(16)
    # A constexpr left to Triton to bind: never kept.
    launcher.launch(kernel, (1, 1, 1), (x, 5), {"BLOCK": 64}, "partial")
    launcher.launch(kernel, (1, 1, 1), (x, 5), {"BLOCK": 64}, "partial")
    assert [entry[0] for entry in launches] == ["triton", "triton"]
    # A launch hook registered (a profiler): Triton's path, which calls it.
    launcher.launch(kernel, (1, 1, 1), (x, 5), {"BLOCK": 64, "FLAG": True}, "full")
    monkeypatch.setattr(launcher, "_hooks_set", lambda: True)
    launcher.launch(kernel, (1, 1, 1), (x, 5), {"BLOCK": 64, "FLAG": True}, "full")
    assert launches[-1][0] == "triton"
    # A backend that specializes on more than divisibility (AMD's buffer-op ranges): never kept.
    class Ranges(_BaseSpecialization):
        @staticmethod
        def get_tensor_specialization(arg, **kwargs):
            return "S"
    other = _FakeJIT([])
    other.device_caches = {0: ({}, {}, None, Ranges(), None)}
    launcher.launch(other, (1, 1, 1), (x, 5), {"BLOCK": 64, "FLAG": True}, "full")
    assert launcher.kept(other) == 0


def test_a_kernel_that_is_not_a_jit_function_is_launched_as_it_is(fake_driver):
    # Tests and lab probes record launches by replacing the kernel object.
    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append((grid, args, kwargs))
    launcher.launch(Recorder(), (1, 1, 1), (1, 2), {"A": 3}, "plan")
    launcher.launch(Recorder(), (1, 1, 1), (1, 2), {"A": 3}, "plan")
    assert len(seen) == 2


# ---------------------------------------------------------------- on a GPU: the real launcher
def test_the_kept_launch_runs_the_kernel_triton_picks_and_the_same_bits():
    if not torch.cuda.is_available():
        pytest.skip("the compiled kernel's launcher needs a GPU (the interpreter launches through Triton's path)")
    from rope import RopeSpec, cos_sin_cache
    from rope.triton.rotary import launch_rotary, launch_signature
    from rope.triton.rotary_kernel import rotary_kernel
    from rope.triton.rotary_plan import default_plan, kernel_arguments
    spec = RopeSpec(head_size=128, rotary_dim=128, sections=(16, 24, 24), max_position=4096)
    cache = cos_sin_cache(spec, torch.bfloat16, "cuda")
    gen = torch.Generator().manual_seed(0)
    launcher.forget(rotary_kernel)
    for tokens, offset in ((1, 0), (7, 8), (64, 0), (300, 8), (4096, 0), (5, 0)):
        positions = torch.randint(0, 4096, (3, tokens), generator=gen).cuda()
        # An offset of 8 bf16 columns leaves q's rows 16-byte aligned, 8 more would not: both occur.
        q = torch.randn(tokens, 8 * 128 + offset, generator=gen).to(torch.bfloat16).cuda()[:, offset:]
        k = torch.randn(tokens, 2 * 128, generator=gen).to(torch.bfloat16).cuda()
        expected = [t.clone() for t in (q, k)]
        launcher._ENABLED = False
        try:
            launch_rotary(spec, positions, *expected, cache)            # Triton's own path
        finally:
            launcher._ENABLED = True
        for _ in range(2):        # the first through Triton's path (kept), the second through the launcher
            got = [t.clone() for t in (q, k)]
            launch_rotary(spec, positions, *got, cache)
            torch.cuda.synchronize()
            assert all(torch.equal(a, b) for a, b in zip(got, expected)), (tokens, offset)
        # The kept entry is the compiled kernel Triton's binder picks for these arguments.
        signature = launch_signature(spec, positions, got[0], got[1], cache)
        grid, constexprs = default_plan(*signature)
        args = kernel_arguments(signature, positions, got[0], got[1], cache, None, constexprs["MAP_TABLE"])
        compiled = rotary_kernel.__dict__[launcher._ATTRIBUTE]
        entry = compiled.entries[(signature, torch.cuda.current_device(), launcher._argument_key(args))]
        picked = rotary_kernel.run(*args, grid=grid, warmup=True, **constexprs)
        assert entry[1] == picked.function and entry[3] == tuple(
            constexprs[p.name] for p in rotary_kernel.params[len(args):])
    assert launcher.kept(rotary_kernel) >= 6
