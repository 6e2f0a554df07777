"""Known faults of external implementations: shapes on which the external code crashes the process
or its device context (a CUDA fault poisons every later CUDA call of the process), measured on real
hardware.  An adapter declares its predicate (``declare(..., fault=...)``); the registry reports a
faulting combination the way it reports an unsupported one, with "known fault" in the reason, so the
properties draw around it (the rejections are listed in the run report) instead of taking the
worker down with the first fault.  Each entry names where it was measured; the reproducer runs the
shapes in fresh processes.  Kept apart from the adapters so the predicates import (and are tested)
without the external package.
"""

from __future__ import annotations

import torch

from rope.spec import RopeSpec


def flashinfer_fault(spec: RopeSpec, dtype: torch.dtype, device: str) -> str | None:
    """FlashInfer 0.7.4 ``apply_rope_with_cos_sin_cache`` on an H200 (bf16; tools/flashinfer_probe.py,
    docs/runs/flashinfer-probe-h200-2026-11-29.log, docs/upstream-flashinfer-rope-shapes.md)."""
    if spec.rotary_dim % (16 if spec.is_neox_style else 8):
        return (f"CUDA misaligned-address fault when rotary_dim is not a multiple of "
                f"{16 if spec.is_neox_style else 8} ({'NeoX' if spec.is_neox_style else 'GPT-J'}; rotary_dim "
                f"{spec.rotary_dim}); reproduce with tools/flashinfer_probe.py")
    if spec.is_neox_style and spec.rotary_dim == spec.head_size and spec.head_size in (16, 80, 112):
        return (f"garbage output (up to 1e38) for whole-head NeoX at head {spec.head_size}; a kernel reading "
                f"the wrong elements may also read out of bounds; reproduce with tools/flashinfer_probe.py")
    if not spec.is_neox_style and spec.head_size == 8:
        return "wrong output for GPT-J at head 8 (after a NeoX fault at the same head); reproduce with tools/flashinfer_probe.py"
    return None
