"""Stub: stands in for vLLM's ``vllm._aiter_ops`` (vllm 0.33.0) in the trimmed carry (.vllm/site).

Our own code, not vLLM's.  vLLM's module (5,000 lines of ROCm AITER wrappers) imports the compiled
``vllm._custom_ops`` and the attention packages.  The carried rotary-embedding base
(``vllm/model_executor/layers/rotary_embedding/base.py``) asks its ``rocm_aiter_ops`` one question:
is AITER's Triton rotary embedding enabled?  vLLM answers only on a ROCm gfx9 GPU with the ``aiter``
package installed, and gives None elsewhere; the carry is for CUDA hosts (and CPU checks), so the
answer here is always that None, and the AITER path, whose op this stub refuses, is never taken.
"""

from __future__ import annotations


def _no_answer(*_args, **_kwargs):
    """AITER is never available in the carry: no answer (None), as vLLM gives off ROCm."""


def _refuse(*_args, **_kwargs):
    raise NotImplementedError("the vLLM carry (.vllm/site) has no ROCm AITER kernels")


class rocm_aiter_ops:  # noqa: N801 - the name the carried modules import
    """Only the queries the carried modules make, all answered "not available"."""

    is_enabled = staticmethod(lambda: False)
    is_triton_rotary_embed_enabled = staticmethod(_no_answer)
    get_triton_rotary_embedding_op = staticmethod(_refuse)
