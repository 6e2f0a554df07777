"""Reference model-runner position preparation (SPEC §5, vLLM Model Runner V2 layout).

For batch slot b: r = idx_mapping[b], qs = query_start_loc[b], ql = query_start_loc[b+1] - qs,
nc = num_computed_tokens[r], and the request is in prefill when nc < prefill_lens[r] (decided
per request, not per token).  For i in [0, ql) and row d:

    prefill: out[d, qs + i] = prefill_positions[num_dims * r + d, nc + i]
    decode:  out[d, qs + i] = nc + i + prefill_delta[r]

Written as the plain double loop it is.
"""

from __future__ import annotations

import torch

_INT = (torch.int32, torch.int64)


def _vector(name, t, length=None):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}={type(t).__name__}: must be a torch.Tensor")
    if t.dtype not in _INT:
        raise ValueError(f"{name}.dtype={t.dtype}: must be torch.int32 or torch.int64")
    if t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = f"[{length}]" if length is not None else "1-D"
        raise ValueError(f"{name}.shape={tuple(t.shape)}: must be {want}")


def check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                          num_computed_tokens, num_dims) -> int:
    """Validate a position-preparation call; return the number of tokens of the step."""
    if not isinstance(num_dims, int) or isinstance(num_dims, bool) or not 1 <= num_dims <= 4:
        raise ValueError(f"num_dims={num_dims!r}: must be an int in [1, 4]")
    if not isinstance(prefill_positions, torch.Tensor) or prefill_positions.dtype not in _INT:
        raise ValueError(f"prefill_positions: must be an int32/int64 tensor (got {getattr(prefill_positions, 'dtype', type(prefill_positions))})")
    if prefill_positions.dim() != 2 or prefill_positions.shape[0] % num_dims:
        raise ValueError(f"prefill_positions.shape={tuple(prefill_positions.shape)}: must be "
                         f"[max_reqs * num_dims, max_model_len] with num_dims={num_dims}")
    max_reqs, max_len = prefill_positions.shape[0] // num_dims, prefill_positions.shape[1]
    _vector("prefill_delta", prefill_delta, max_reqs)
    _vector("prefill_lens", prefill_lens, max_reqs)
    _vector("num_computed_tokens", num_computed_tokens, max_reqs)
    _vector("idx_mapping", idx_mapping)
    num_reqs = idx_mapping.shape[0]
    _vector("query_start_loc", query_start_loc, num_reqs + 1)
    devices = {t.device for t in (prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                  prefill_lens, num_computed_tokens)}
    if len(devices) > 1:
        raise ValueError(f"devices: all tensors must be on one device (got {sorted(map(str, devices))})")

    slots = idx_mapping.tolist()
    if any(not 0 <= r < max_reqs for r in slots):
        raise ValueError(f"idx_mapping={slots}: every slot must lie in [0, max_reqs={max_reqs})")
    if len(set(slots)) != len(slots):
        raise ValueError(f"idx_mapping={slots}: must not repeat a slot")
    qsl = query_start_loc.tolist()
    if qsl[0] != 0 or any(b < a for a, b in zip(qsl, qsl[1:])):
        raise ValueError(f"query_start_loc={qsl}: must start at 0 and never decrease")
    lens, computed = prefill_lens.tolist(), num_computed_tokens.tolist()
    for b, r in enumerate(slots):
        ql = qsl[b + 1] - qsl[b]
        if computed[r] < 0 or lens[r] < 0:
            raise ValueError(f"num_computed_tokens[{r}]={computed[r]}, prefill_lens[{r}]={lens[r]}: must be >= 0")
        if computed[r] < lens[r] and computed[r] + ql > max_len:
            raise ValueError(f"num_computed_tokens[{r}]={computed[r]}: prefill reads columns up to "
                             f"{computed[r] + ql - 1}, past max_model_len={max_len}")
    return qsl[-1]


def prepare_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                      num_computed_tokens, num_dims: int) -> torch.Tensor:
    """int64 [num_dims, num_tokens]: the positions of every token of the step."""
    num_tokens = check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                       prefill_lens, num_computed_tokens, num_dims)
    table = prefill_positions.cpu().tolist()
    delta, lens, computed = prefill_delta.tolist(), prefill_lens.tolist(), num_computed_tokens.tolist()
    qsl = query_start_loc.tolist()
    out = torch.empty(num_dims, num_tokens, dtype=torch.int64)
    for b, r in enumerate(idx_mapping.tolist()):
        qs, ql, nc = qsl[b], qsl[b + 1] - qsl[b], computed[r]
        is_prefill = nc < lens[r]
        for i in range(ql):
            for d in range(num_dims):
                out[d, qs + i] = table[num_dims * r + d][nc + i] if is_prefill else nc + i + delta[r]
    return out.to(prefill_positions.device)
