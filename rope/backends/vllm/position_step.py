"""vLLM's Model Runner V2 position step (``vllm.v1.worker.gpu.mm.rope``; read on vllm 0.33.0).

vLLM keeps the step's inputs in a ``RopeState``: ``prefill_positions`` (a ``StagedWriteTensor`` whose
``.gpu`` is int32 ``[max_reqs * num_dims, max_model_len]``, row ``num_dims * r + d``), ``prefill_delta``
(a ``UvaBackedTensor`` whose ``.gpu`` is int32 ``[max_reqs]``) and ``positions`` (int64
``[num_dims, max_num_tokens + 1]``).  ``RopeState.prepare_positions(idx_mapping, query_start_loc,
prefill_lens, num_computed_tokens)`` launches ``_prepare_rope_positions_kernel`` (one program per
request; prefill while ``num_computed < prefill_len``, decided per request; prefill reads
``prefill_positions[num_dims * r + d, nc + i]``, decode writes ``nc + i + delta[r]``) and writes
``positions[:, :num_tokens]``.  That is the harness's contract argument for argument, so the adapter
calls the public wrapper on a ``RopeState`` that holds the caller's buffers, built without
``__init__`` (which allocates UVA/pinned staging buffers and a ``max_num_tokens`` output): it sets the
five attributes the wrapper reads (``num_dims``, ``max_model_len``, ``positions``,
``prefill_positions.gpu``, ``prefill_delta.gpu``) and nothing else.

Conversions: the wrapper passes the table's strides as ``num_dims * max_model_len`` and
``max_model_len`` (it owns a contiguous table) and the kernel indexes the 1-D vectors and the
columns of ``positions`` with unit stride, so non-contiguous inputs are copied and a non-contiguous
``out`` is written through a contiguous scratch tensor.  Dtypes are passed as given (vLLM's runner
passes int32; the kernel loads either width).
"""

from __future__ import annotations

import types

import torch

from rope.spec import check_position_inputs
from rope.backends import require
from rope.backends.vllm.rotation import INSTALL  # noqa: F401 - its import also keeps real Triton on a GPU-less host
from rope.devices import device_name, triton_runs_on
from rope.runner_positions import check_out

_mm_rope = require("vllm.v1.worker.gpu.mm.rope", distribution="vllm", install=INSTALL)
_triton_utils = require("vllm.triton_utils", distribution="vllm", install=INSTALL)


def _rope_state(prefill_positions, prefill_delta, num_dims: int, out):
    """A RopeState over the caller's buffers: only the attributes ``prepare_positions`` reads."""
    state = object.__new__(_mm_rope.RopeState)
    state.num_dims = num_dims
    state.max_model_len = prefill_positions.shape[1]
    state.positions = out
    state.prefill_positions = types.SimpleNamespace(gpu=prefill_positions)
    state.prefill_delta = types.SimpleNamespace(gpu=prefill_delta)
    return state


def prepare_positions_vllm(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                           num_computed_tokens, num_dims, out) -> None:
    """Write out[:, :num_tokens] with ``RopeState.prepare_positions`` (vLLM's Triton kernel)."""
    num_tokens = check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                       prefill_lens, num_computed_tokens, num_dims, check_values=True)
    check_out(out, num_dims, num_tokens, prefill_positions.device)
    why = _unsupported(device_name(out.device))
    if why:
        raise ValueError(f"out.device={out.device}: {why}")
    target = out if out.stride(1) == 1 else torch.empty_like(out, memory_format=torch.contiguous_format)
    state = _rope_state(prefill_positions.contiguous(), prefill_delta.contiguous(), num_dims, target)
    state.prepare_positions(idx_mapping.contiguous(), query_start_loc.contiguous(), prefill_lens.contiguous(),
                            num_computed_tokens.contiguous())
    if target is not out:
        out[:, :num_tokens] = target[:, :num_tokens]


def _unsupported(device: str) -> str | None:
    if not getattr(_triton_utils, "HAS_TRITON", False):
        return "vLLM found no usable Triton (its placeholder cannot launch the kernel)"
    if not triton_runs_on(device):
        return f"Triton kernels do not run on {device} here (no GPU, TRITON_INTERPRET unset)"
    return None


prepare_positions_vllm.supports = lambda device: _unsupported(device) is None
