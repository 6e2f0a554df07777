"""Stands in for ``sglang/kernels/jit/utils/compile/paths.py`` (sglang 0.5.23) in the trimmed carry
(lab/offline/sglang_carry.sh).

Only ``KERNEL_PATH``: the folder of the carried ``sglang.kernels.jit`` package, where SGLang keeps
its JIT sources.  SGLang's module refuses to import when those sources are missing, and the carry
leaves them out, so this one just names the folder.
"""

from pathlib import Path

KERNEL_PATH = Path(__file__).resolve().parents[2]
