"""Stands in for ``sglang/srt/platforms/__init__.py`` (sglang 0.5.23) in the trimmed carry
(lab/offline/sglang_carry.sh).

In SGLang, ``current_platform`` is an ``SRTPlatform`` object (msgspec structs, platform plugins
found through entry points).  The carried code asks it two things: is it an out-of-tree plugin
platform (never, here: no plugins are carried), and does it run Triton kernels
(``capabilities.supports_triton``, behind ``support_triton``).  This object answers those two only:
Triton runs when torch has a GPU and SGLang's CPU engine is not switched on
(SGLANG_USE_CPU_ENGINE=1).  Any other attribute is missing on purpose.
"""

import os
from types import SimpleNamespace

import torch


class _CarryPlatform:
    def is_out_of_tree(self) -> bool:
        return False

    @property
    def capabilities(self) -> SimpleNamespace:
        cpu_engine = os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"
        return SimpleNamespace(supports_triton=torch.cuda.is_available() and not cpu_engine)

    def __repr__(self) -> str:
        return "<current_platform of the trimmed SGLang carry>"


current_platform = _CarryPlatform()
