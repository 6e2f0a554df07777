"""Position-id implementations: the code a model runs to turn a prompt into M-RoPE / XD-RoPE position
ids (transformers' ``get_rope_index``, vLLM's ``get_mrope_input_positions``, SGLang's
``MRotaryEmbedding.get_rope_index``), checked against ``reference.prompt_positions``.

The contract (docs/implementations.md)::

    fn(family, prompt) -> (positions, delta)

``family`` is one of ``reference.FAMILIES``; ``prompt`` a ``reference.Prompt`` (text, image and
video segments, vision grids before the spatial merge, seconds per grid, timestamp tokens, the merge
size).  ``positions`` is int64 ``[num_dims, L]`` for the prompt laid out as the family does
(markup tokens included, ``reference.prompt_positions(family, prompt).roles``), ``delta`` an int.
An adapter turns the description into the engine's native inputs itself (token ids with the
family's special tokens, grids, seconds per grid, masks).  Optional attributes:

* ``families``: the families it implements (default: every family); the others are skipped with
  the reason;
* ``unsupported_reason(family, prompt)``: why the family, or this prompt of it, cannot be run here
  (None when it can; ``prompt`` is None when only the family is asked about);
* ``batch(family, batch)``: where the engine's API is batched, run a :class:`PromptBatch` (several
  prompts padded on one side) in one call and return one ``(positions, delta)`` per prompt;
* ``known_deviations(family, batch)``: for each prompt of the batch, None (the reference applies)
  or a :class:`KnownDeviation`, the exact value a documented, version-pinned upstream departure
  gives, derived from the reference by that departure's rule.  A property then asserts that
  value, so a fix upstream, or a new departure, still fails.

Names resolve to the adapters here (``transformers``, ``vllm``, ``sglang``; a missing package is a
ValueError naming it and how to install it) or to an import path ``package.module:callable``.
"""

from __future__ import annotations

from typing import Callable

import torch

from reference.position_ids import prompt_positions
# The batch and the declaration are the contract's (rope/prompts.py), named here too.
from rope.prompts import FAMILIES, KnownDeviation, Prompt, PromptBatch, check_family, family_num_dims  # noqa: F401
from rope.implementation import Implementation
from rope.registry import resolve

ADAPTERS = {
    "transformers": "rope.backends.transformers.position_ids:position_ids_transformers",
    "vllm": "rope.backends.vllm.position_ids:position_ids_vllm",
    "sglang": "rope.backends.sglang.position_ids:position_ids_sglang",
}
# What a run checks when --rope-position-ids-impl is not given: transformers where it is installed.
DEFAULT_ADAPTERS = ("transformers",)


def get_position_ids_implementation(name: str) -> Callable:
    """A position-id implementation by adapter name (``transformers``, ``vllm``, ``sglang``) or
    import path ``package.module:callable``; every failure is a ValueError naming the target."""
    return resolve(name, kind="position_ids_impl", builtins=ADAPTERS)


def position_ids_implementations() -> dict[str, Callable]:
    """The adapters a run checks by default: those of ``DEFAULT_ADAPTERS`` whose package imports."""
    out = {}
    for name in DEFAULT_ADAPTERS:
        try:
            out[name] = get_position_ids_implementation(name)
        except ValueError:
            continue
    return out


def families(fn: Callable) -> tuple[str, ...]:
    """The families an implementation declares (every family when it declares none)."""
    declared = Implementation.of("", fn, "position_ids").families
    if declared is None:
        return FAMILIES
    unknown = [f for f in declared if f not in FAMILIES]
    if unknown:
        raise ValueError(f"families={declared!r}: unknown families {unknown} (known: {FAMILIES})")
    return declared


def unsupported_reason(name: str, fn: Callable, family: str, prompt: Prompt | None = None) -> str | None:
    """Why ``fn`` does not run ``family`` (or this prompt of it), or None."""
    check_family(family)
    if family not in families(fn):
        return f"unsupported: {name} does not implement {family} (it declares {', '.join(families(fn))})"
    reason = Implementation.of(name, fn, "position_ids").unsupported_reason
    if reason is not None:
        why = reason(family, prompt)
        if why:
            return f"unsupported: {name}: {why}"
    return None


def check_result(family: str, prompt: Prompt, result) -> tuple[torch.Tensor, int]:
    """An implementation's return value as (int64 CPU positions [num_dims, L], int delta).

    Raises ValueError naming what is wrong: not a pair, positions not an integer tensor (or numpy
    array, or nested lists) of the family's shape for the prompt's length, delta not an integer (a
    numpy integer, a 0-d or 1-element integer tensor is read as its value).
    """
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise ValueError(f"result: must be a pair (positions, delta) (got {type(result).__name__}"
                         f"{'' if not isinstance(result, (tuple, list)) else f' of {len(result)}'})")
    positions, delta = result
    if type(positions).__module__ == "numpy" or isinstance(positions, (list, tuple)):
        try:                        # an engine's numpy array (vLLM returns one) or nested lists
            positions = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"positions: cannot be read as a tensor ({exc})") from None
    if not isinstance(positions, torch.Tensor):
        raise ValueError(f"positions: must be a torch.Tensor, numpy array or nested list "
                         f"(got {type(positions).__name__})")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise ValueError(f"positions: must have an integer dtype (got {positions.dtype})")
    length = prompt_positions(family, prompt).length
    want = (family_num_dims(family), length)
    if tuple(positions.shape) != want:
        raise ValueError(f"positions: shape must be {want} (num_dims of {family}, tokens of the prompt) "
                         f"(got {tuple(positions.shape)})")
    if isinstance(delta, torch.Tensor):
        if delta.numel() != 1 or delta.dtype.is_floating_point or delta.dtype == torch.bool:
            raise ValueError(f"delta: must be an int (got a tensor of shape {tuple(delta.shape)}, {delta.dtype})")
        delta = int(delta.reshape(()).item())
    elif hasattr(delta, "__index__") and not isinstance(delta, bool):
        delta = int(delta.__index__())
    else:
        raise ValueError(f"delta: must be an int (got {type(delta).__name__} {delta!r})")
    return positions.detach().to("cpu", torch.int64), delta


class ImplementationFailed(Exception):
    """The implementation raised: the test fails with what it raised, as a mismatch would."""


def _call(fn: Callable, *args):
    """Call under the call deadline (rope.harness.deadline: a hang raises ImplementationHung);
    whatever the implementation raises becomes :class:`ImplementationFailed` naming it."""
    from rope.harness.deadline import call_timeout, deadline
    with deadline(call_timeout(), what=f"the position-id implementation {getattr(fn, '__name__', fn)!r}"):
        try:
            return fn(*args)
        except Exception as exc:    # noqa: BLE001 - an implementation may raise anything
            raise ImplementationFailed(f"{type(exc).__name__}: {exc}") from exc


def run_batch(fn: Callable, family: str, batch: PromptBatch) -> list[tuple[torch.Tensor, int]]:
    """Run every prompt of ``batch``: in one call where ``fn`` has ``batch``, else one by one.
    Each result goes through :func:`check_result`."""
    batched = Implementation.of("", fn, "position_ids").batch
    if batched is not None:
        results = _call(batched, family, batch)
        if not isinstance(results, (list, tuple)) or len(results) != len(batch.prompts):
            raise ValueError(f"batch result: must be one (positions, delta) per prompt ({len(batch.prompts)}) "
                             f"(got {type(results).__name__})")
    else:
        results = [_call(fn, family, prompt) for prompt in batch.prompts]
    return [check_result(family, prompt, r) for prompt, r in zip(batch.prompts, results)]


def expected(fn: Callable, family: str, batch: PromptBatch) -> list[tuple[torch.Tensor, int, KnownDeviation | None]]:
    """Per prompt: the positions and delta ``fn`` must return, and the known deviation they come
    from (None: the reference's own)."""
    refs = [prompt_positions(family, p) for p in batch.prompts]
    declared = Implementation.of("", fn, "position_ids").known_deviations
    deviations = list(declared(family, batch)) if declared is not None else [None] * len(refs)
    if len(deviations) != len(refs):
        raise ValueError(f"known_deviations: must give one entry per prompt ({len(refs)}) (got {len(deviations)})")
    out = []
    for ref, dev in zip(refs, deviations):
        if dev is None:
            out.append((ref.positions, ref.delta, None))
        else:
            out.append((dev.positions, dev.delta, dev))
    return out


__all__ = [
    "ADAPTERS", "DEFAULT_ADAPTERS", "PromptBatch", "KnownDeviation",
    "get_position_ids_implementation", "position_ids_implementations", "families", "unsupported_reason",
    "check_result", "run_batch", "expected", "ImplementationFailed",
]
