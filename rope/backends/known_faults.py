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
    docs/runs/flashinfer-probe-h200-2026-11-29.log, docs/upstream-flashinfer-rope-shapes.md): a CUDA
    misaligned-address fault unless rotary_dim is a multiple of 16 (NeoX) or 8 (GPT-J)."""
    if spec.rotary_dim % (16 if spec.is_neox_style else 8):
        return (f"CUDA misaligned-address fault when rotary_dim is not a multiple of "
                f"{16 if spec.is_neox_style else 8} ({'NeoX' if spec.is_neox_style else 'GPT-J'}; rotary_dim "
                f"{spec.rotary_dim}); reproduce with tools/flashinfer_probe.py")
    return None


# Shapes on which FlashInfer 0.7.4 returns wrong values without faulting (same probe).  Not faults:
# the properties still draw them and fail there (the finding); test_backends pins them as strict
# expected mismatches and keeps its bounded property off them.
FLASHINFER_WRONG_SHAPES = (
    # (head_size, rotary_dim, is_neox_style): max |diff| against a float32 rotation in the probe
    (16, 16, True),      # 4.99e30
    (80, 80, True),      # 1.53e38
    (112, 112, True),    # 2.3e33
    (8, 8, False),       # 3.77
)


def flashinfer_wrong(spec: RopeSpec) -> bool:
    return (spec.head_size, spec.rotary_dim, spec.is_neox_style) in FLASHINFER_WRONG_SHAPES
