"""rope.interpreter_fixes: kernels with run-time loop bounds run under the interpreter of every
supported Triton (Triton 3.6 with NumPy 2.4+ refused them), and a Triton that converts scalars
itself is left alone."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from rope import interpreter_fixes
from rope.devices import is_interpreter

pytestmark = pytest.mark.stack      # meets the installed torch and Triton: CI runs it on every stack (.ci/run)


@triton.jit
def _strided_copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # The loop's bounds are run-time scalars (a program id, a loaded value): the interpreter turns
    # them into Python ints through the tensor's __index__.
    pid = tl.program_id(0)
    stop = tl.load(x_ptr).to(tl.int32) * 0 + n
    for start in range(pid * BLOCK, stop, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)


@pytest.mark.skipif(not is_interpreter(), reason="Triton's interpreter only (no GPU, TRITON_INTERPRET=1)")
def test_loops_with_run_time_bounds_run_under_the_interpreter():
    x = torch.arange(37, dtype=torch.float32)
    out = torch.zeros_like(x)
    _strided_copy_kernel[(3,)](x, out, x.numel(), BLOCK=4)
    torch.testing.assert_close(out, x + 1.0, rtol=0, atol=0)


def _fake_interpreter(tmp_path, index_line: str):
    """A module shaped like triton.runtime.interpreter whose _patch_lang_tensor sets __index__ as given."""
    path = tmp_path / f"fake_interpreter_{abs(hash(index_line))}.py"
    path.write_text(textwrap.dedent(f"""
        def _patch_lang_tensor(tensor, scope):
            scope.set_attr(tensor, "__bool__", lambda self: True)
            {index_line}
    """))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_old_scalar_conversion_is_replaced(tmp_path):
    old = _fake_interpreter(tmp_path, 'scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))')
    new = _fake_interpreter(tmp_path, 'scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))')
    assert interpreter_fixes.needs_index_fix(old)
    assert not interpreter_fixes.needs_index_fix(new)
    assert not interpreter_fixes.needs_index_fix(object())


def test_the_fixed_conversion_takes_a_one_element_array_of_any_shape():
    np = pytest.importorskip("numpy")

    class Handle:
        def __init__(self, data):
            self.data = data

    class Scalar:
        def __init__(self, data):
            self.handle = Handle(data)

    for data in (np.array(5), np.array([5]), np.array([[5]])):
        assert interpreter_fixes._as_index(Scalar(data)) == 5


@pytest.mark.skipif(not is_interpreter(), reason="installed only where the interpreter runs the kernels")
def test_the_installed_triton_gets_the_fix_exactly_when_it_needs_it():
    from triton.runtime import interpreter
    if interpreter_fixes._INSTALLED[0]:
        assert interpreter._patch_lang_tensor.__name__ == "patch_lang_tensor"
    else:
        assert not interpreter_fixes.needs_index_fix(interpreter)
