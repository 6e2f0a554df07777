"""A user's rotation implementation, written against the harness's contract only:
``fn(spec, positions, query, key, cos_sin_cache) -> (query_out, key_out)``.

``rotate`` is right; ``rotate_always_neox`` has the bug vLLM's Triton M-RoPE kernel shipped
(vllm#42016): it pairs NeoX-style whatever ``spec.is_neox_style`` says, so GPT-J models are wrong.
"""

import torch


def _rotate(spec, positions, x, cache, neox):
    if x is None:
        return None
    tokens, half = x.shape[0], spec.rotary_dim // 2
    rows = positions.reshape(-1, tokens)                       # [num_dims, T] (1-D RoPE: one row)
    axis = torch.tensor(spec.axis_map(), device=x.device)      # the position row of each frequency
    picked = rows[axis, :].T                                   # [T, half]: position of frequency i
    freq = torch.arange(half, device=x.device)
    cos = cache[picked, freq].float()[:, None, :]              # [T, 1, half]
    sin = cache[picked, half + freq].float()[:, None, :]
    heads = x.view(tokens, -1, spec.head_size).float()
    rot = heads[..., :spec.rotary_dim]
    if neox:
        a, b = rot[..., :half], rot[..., half:]
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
    a2, b2 = a * cos - b * sin, b * cos + a * sin
    out = heads.clone()
    if neox:
        out[..., :half], out[..., half:spec.rotary_dim] = a2, b2
    else:
        out[..., 0:spec.rotary_dim:2], out[..., 1:spec.rotary_dim:2] = a2, b2
    return out.to(x.dtype).view_as(x)


def rotate(spec, positions, query, key, cos_sin_cache):
    return (_rotate(spec, positions, query, cos_sin_cache, spec.is_neox_style),
            _rotate(spec, positions, key, cos_sin_cache, spec.is_neox_style))


def rotate_always_neox(spec, positions, query, key, cos_sin_cache):
    return (_rotate(spec, positions, query, cos_sin_cache, True),
            _rotate(spec, positions, key, cos_sin_cache, True))
