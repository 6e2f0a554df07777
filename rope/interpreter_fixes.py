"""Corrections to Triton's interpreter that the kernels need on the releases engines pin.

Under ``TRITON_INTERPRET=1`` every scalar of a kernel (``tl.program_id``, a loaded scalar, their
arithmetic) is a one-element NumPy array, and Triton converts it to a Python int wherever Python
needs one, chiefly the bounds of a ``for ... in range(start, stop, step)`` loop.  Triton 3.6 does
that with ``int(array)``, which NumPy 2.4 and later refuse for an array of one dimension ("only
0-dimensional arrays can be converted to Python scalars"); Triton 3.8 and later squeeze the array
first.  So on Triton 3.6 with a current NumPy any kernel whose loop bounds are run-time values (the
position step's request loop) fails under the interpreter, while compiled for a GPU it is fine.

:func:`index_scalars_of_any_shape` gives the interpreter's tensors the later releases' conversion
when Triton's own is the old one, and changes nothing otherwise.  ``rope.devices.configure_triton``
installs it whenever it turns the interpreter on, before any kernel runs.
"""

from __future__ import annotations

import inspect

_INSTALLED = [False]
# Triton 3.6's conversion as its source reads with the whitespace removed.
_OLD_INDEX = '"__index__",lambdaself:int(self.handle.data))'


def _as_index(self) -> int:
    return int(self.handle.data.reshape(()))


def needs_index_fix(interpreter) -> bool:
    """Whether this interpreter converts scalars with ``int(array)`` (Triton 3.6's form)."""
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None:
        return False
    try:
        source = inspect.getsource(patch)
    except (OSError, TypeError):
        return False
    return _OLD_INDEX in "".join(source.split())


def index_scalars_of_any_shape() -> bool:
    """Install the scalar conversion of Triton 3.8+ in an interpreter that lacks it (idempotent).
    True when this Triton needed it and now has it."""
    if _INSTALLED[0]:
        return True
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    if not needs_index_fix(interpreter):
        return False
    patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", _as_index)     # restored with the rest when the grid ends

    interpreter._patch_lang_tensor = patch_lang_tensor
    _INSTALLED[0] = True
    return True
