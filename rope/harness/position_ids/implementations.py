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

from rope.implementation import Implementation
from rope.prompts import FAMILIES, Prompt, check_family
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
