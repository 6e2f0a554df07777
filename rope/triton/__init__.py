"""The project's Triton kernels.  Importing this package throws the interpreter switch first
(rope.devices.configure_triton: TRITON_INTERPRET=1 when there is no GPU), since the switch must
precede every ``@triton.jit``."""

from rope.devices import configure_triton

configure_triton()
