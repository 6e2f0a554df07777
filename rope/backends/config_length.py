"""The ``max_position_embeddings`` a model config gives for the length an engine admits
(``spec.max_position``): the inverse of the engines' admitted-length rule, shared by the table
adapters that call an engine's ``get_rope`` the way its decoder models do (rope.backends.vllm.table,
rope.backends.sglang.table)."""

from __future__ import annotations

from rope.spec import RopeSpec

__all__ = ["config_length"]


def config_length(spec: RopeSpec, times_factor: tuple[str, ...]) -> int | None:
    """The config's ``max_position_embeddings`` whose admitted length is ``spec.max_position``, for an
    engine that admits it times the factor for the rope types ``times_factor`` and as it is for the
    others; LongRoPE: the one whose ratio to the original length is the factor (what the engines read
    the factor from).  None where no whole length gives it."""
    s = spec.scaling
    if s is not None and s.rope_type == "longrope":
        length = s.original_max_position * s.factor
    elif s is None or s.rope_type not in times_factor:
        return spec.max_position
    else:
        length = spec.max_position / s.factor
    return int(length) if length == int(length) else None
