"""rope-harness: optimized rotary-embedding implementations and the machinery that checks them."""

from rope import devices as _devices

_devices.configure_triton()  # must precede any @triton.jit (interpreter when there is no GPU)

from rope.cache import cos_sin_cache  # noqa: E402
from rope.registry import (  # noqa: E402
    get_implementation,
    get_positions_implementation,
    implementations,
    positions_implementations,
)
from rope.spec import RopeSpec  # noqa: E402

__all__ = ["RopeSpec", "cos_sin_cache", "get_implementation", "get_positions_implementation", "implementations",
           "positions_implementations"]
