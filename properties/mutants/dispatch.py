"""Broken rope ops: the platform-dispatch bugs of the catalogue (docs/spec.md §7.4, §7.6, §7.7), each a
small variant of an op in rope.dispatch.  properties/dispatch/test_dispatch.py must reject every one.

``BROKEN_OPS`` maps a name to (the op class it stands in for, the broken class).
"""

from __future__ import annotations

from rope.dispatch import MRotaryEmbeddingOp, RotaryEmbeddingOp, XDRotaryEmbeddingOp
from rope.native import apply_rotation, select_cos_sin


class MRopeWithoutXpuCpuOverrides(MRotaryEmbeddingOp):
    """M-RoPE before vllm#24724 / #27800: no forward_xpu / forward_cpu of its own, so XPU and CPU in
    eager mode inherit the 1-D op's kernel path and crash on [3, T] positions."""

    forward_xpu = RotaryEmbeddingOp.forward_xpu
    forward_cpu = RotaryEmbeddingOp.forward_cpu


class XDRopeWithoutXpuOverride(XDRotaryEmbeddingOp):
    """XD-RoPE before vllm#52174: XPU in eager mode inherits the 1-D kernel path and crashes on
    [3|4, T] positions (HunyuanOCR --enforce-eager on XPU)."""

    forward_xpu = RotaryEmbeddingOp.forward_xpu


class MRopeCachedCosSin(MRotaryEmbeddingOp):
    """vllm-ascend#4668: cos/sin gathered on the first call and kept on the op, so later calls
    rotate by the first call's positions (every path that runs forward_native)."""

    _cos_sin = None

    def forward_native(self, positions, query, key=None):
        if self._cos_sin is None:
            self._cos_sin = select_cos_sin(self.spec, positions, self._cache_for(query).to(query.dtype))
        cos, sin = self._cos_sin
        return (apply_rotation(self.spec, query, cos, sin),
                apply_rotation(self.spec, key, cos, sin) if key is not None else None)


class MRopeAcceptsBatchDim(MRotaryEmbeddingOp):
    """sglang#15983: positions [3, 1, T] (an ``expand(3, -1, -1)`` of [1, 1, T]) flattened to
    [3, T] and accepted instead of rejected; a kernel that assumes [3, T] then reads any other
    layout of that batch dim as garbage."""

    def forward(self, positions, query, key=None):
        if positions.dim() == 3:
            positions = positions.reshape(positions.shape[0], -1)
        return super().forward(positions, query, key)


BROKEN_OPS = {
    "mrope_without_xpu_cpu_overrides": (MRotaryEmbeddingOp, MRopeWithoutXpuCpuOverrides),
    "xdrope_without_xpu_override": (XDRotaryEmbeddingOp, XDRopeWithoutXpuOverride),
    "mrope_cached_cos_sin": (MRotaryEmbeddingOp, MRopeCachedCosSin),
    "mrope_accepts_batch_dim": (MRotaryEmbeddingOp, MRopeAcceptsBatchDim),
}
