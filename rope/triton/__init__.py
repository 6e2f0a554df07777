"""The project's Triton kernels.  Importing this package throws the interpreter switch first
(rope.devices.configure_triton: TRITON_INTERPRET=1 when there is no GPU), since the switch must
precede every ``@triton.jit``."""

from rope.devices import configure_triton

configure_triton()

# The package's modules: the rotation kernel (rotary_kernel), its launch plan (rotary_plan) and its
# entry points (rotary); the position step (positions); both as torch custom ops (ops); what they
# share (checked, grid, launcher, pdl, targets); the fused ops' kernels (fused_qk_norm_rope, rope_kv_cache)
# and their shared tiles (fused_tiles), the unfused sequences they replace (unfused).  Each states its own
# public names in __all__.
__all__ = ["checked", "fused_qk_norm_rope", "fused_tiles", "grid", "launcher", "ops", "pdl", "positions",
           "rope_kv_cache", "rotary", "rotary_kernel", "rotary_plan", "targets", "unfused"]
