"""Reference model-runner position preparation (docs/spec.md §5, vLLM Model Runner V2 layout).

For batch slot b: r = idx_mapping[b], qs = query_start_loc[b], ql = query_start_loc[b+1] - qs,
nc = num_computed_tokens[r], and the request is in prefill when nc < prefill_lens[r] (decided
per request, not per token).  For i in [0, ql) and row d:

    prefill: out[d, qs + i] = prefill_positions[num_dims * r + d, nc + i]
    decode:  out[d, qs + i] = nc + i + prefill_delta[r]

Written as the plain double loop it is.
"""

from __future__ import annotations

import torch

from rope.spec import check_position_inputs

def prepare_positions(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                      num_computed_tokens, num_dims: int) -> torch.Tensor:
    """int64 [num_dims, num_tokens]: the positions of every token of the step."""
    num_tokens = check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                       prefill_lens, num_computed_tokens, num_dims, check_values=True)
    table = prefill_positions.cpu().tolist()
    delta, lens, computed = prefill_delta.tolist(), prefill_lens.tolist(), num_computed_tokens.tolist()
    qsl = query_start_loc.tolist()
    out = [[0] * num_tokens for _ in range(num_dims)]      # Python lists: a tensor element store costs 1 us
    for b, r in enumerate(idx_mapping.tolist()):
        qs, ql, nc = qsl[b], qsl[b + 1] - qsl[b], computed[r]
        is_prefill = nc < lens[r]
        for i in range(ql):
            for d in range(num_dims):
                out[d][qs + i] = table[num_dims * r + d][nc + i] if is_prefill else nc + i + delta[r]
    return torch.tensor(out, dtype=torch.int64).reshape(num_dims, num_tokens).to(prefill_positions.device)
