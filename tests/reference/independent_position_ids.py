"""A second, independent implementation of the documented position-id rules (docs/spec.md §4, the
module docstring of reference/position_ids.py), written from the documentation alone.

The reference writes the prompt token by token; this builds each segment as a whole with torch
(``arange`` runs for text, ``meshgrid`` blocks for vision) and carries one number between segments,
``next_start``, the value the next token starts from.  XD-RoPE starts every row from ``arange(L)``
and overwrites the image grid spans.  ``tests/reference/test_independent_position_ids.py`` checks that
the two agree.
"""

from __future__ import annotations

import torch

from rope.prompts import FAMILIES, XDROPE_FAMILIES, Image, Prompt, Text, Video

_LONG = torch.int64
CURSORS = ("max", "max_hw")


def independent_positions(family: str, prompt: Prompt, *, cursor: str = "max") -> tuple[torch.Tensor, int, tuple[str, ...]]:
    """(positions int64 [num_dims, L], delta, roles) for ``prompt`` in ``family``.

    ``cursor="max_hw"`` is a deliberately wrong variant (transformers 5.3+'s Qwen2(.5)-VL rule):
    after a vision block the next token starts at ``base + max(h', w')`` instead of
    ``max(block) + 1``; it exists only to show that the property test can fail.
    """
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: must be one of {FAMILIES} (got {family!r})")
    if cursor not in CURSORS:
        raise ValueError(f"cursor={cursor!r}: must be one of {CURSORS} (got {cursor!r})")
    if family in XDROPE_FAMILIES:
        return _xdrope(family, prompt)
    return _mrope(family, prompt, cursor)


def _merged(grid_thw, m: int) -> tuple[int, int, int]:
    # The language model sees t' = t, h' = h / m, w' = w / m tokens per grid.
    t, h, w = grid_thw
    return t, h // m, w // m


def _mrope(family: str, prompt: Prompt, cursor: str):
    pieces: list[torch.Tensor] = []      # [3, n] per run of tokens, in prompt order
    roles: list[str] = []
    next_start = 0                        # the first token of the prompt gets 0

    def text(count: int, role: str) -> None:
        # Text (markup included): every row equal, each token max(previous) + 1.  Inside a run the
        # previous maximum is the previous token, so a run is next_start, next_start + 1, ...
        nonlocal next_start
        if count == 0:
            return
        pieces.append((next_start + torch.arange(count, dtype=_LONG)).expand(3, count))
        roles.extend([role] * count)
        next_start += count

    def block(t_offsets: torch.Tensor, h: int, w: int, role: str) -> None:
        # Vision block: base = max(previous) + 1 = next_start; token (ti, hi, wi) gets
        # (base + f(ti), base + hi, base + wi), t-major, then h, then w.
        nonlocal next_start
        base = next_start
        tt, hh, ww = torch.meshgrid(t_offsets, torch.arange(h, dtype=_LONG), torch.arange(w, dtype=_LONG), indexing="ij")
        rows = base + torch.stack((tt, hh, ww)).reshape(3, -1)
        pieces.append(rows)
        roles.extend([role] * rows.shape[1])
        # Text resumes at max(block) + 1 (the block spans fewer positions than it has tokens).
        next_start = int(rows.max()) + 1 if cursor == "max" else base + max(h, w)

    one_frame = torch.zeros(1, dtype=_LONG)   # f = 0: images, and the per-frame blocks of Qwen3-VL / GLM
    for seg in prompt.segments:
        if isinstance(seg, Text):
            text(seg.length, "text")
            continue
        t, h, w = _merged(seg.grid_thw, prompt.spatial_merge_size)
        if isinstance(seg, Image):
            # Every M-RoPE family: vision_start, image * h'w' (one block, f = 0), vision_end.
            text(1, "vision_start")
            block(one_frame, h, w, "image")
            text(1, "vision_end")
        elif family in ("qwen2_vl", "qwen2_5_vl"):
            # One block for the whole video.  Qwen2-VL: f(ti) = ti.  Qwen2.5-VL:
            # f(ti) = int(ti * second_per_grid * 2), a float64 product truncated toward zero.
            if family == "qwen2_vl":
                offsets = torch.arange(t, dtype=_LONG)
            else:
                offsets = torch.trunc(torch.arange(t, dtype=torch.float64) * seg.second_per_grid * 2).to(_LONG)
            text(1, "vision_start")
            block(offsets, h, w, "video")
            text(1, "vision_end")
        elif family == "qwen3_vl":
            # Per frame: its timestamp text, vision_start, a (1, h', w') block, vision_end.
            for _ in range(t):
                text(seg.timestamp_tokens, "timestamp")
                text(1, "vision_start")
                block(one_frame, h, w, "video")
                text(1, "vision_end")
        else:  # glm4v
            # video_start, per frame (vision_start, a (1, h', w') block, vision_end, timestamp), video_end.
            text(1, "video_start")
            for _ in range(t):
                text(1, "vision_start")
                block(one_frame, h, w, "video")
                text(1, "vision_end")
                text(seg.timestamp_tokens, "timestamp")
            text(1, "video_end")

    positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=_LONG)
    # delta = max(prefill positions) + 1 - L (the maximum of no positions taken as -1).
    top = int(positions.max()) if positions.numel() else -1
    return positions.contiguous(), top + 1 - positions.shape[1], tuple(roles)


def _xdrope(family: str, prompt: Prompt):
    roles: list[str] = []
    grids: list[tuple[int, int, int]] = []    # (index of the first grid token, h', w') per image
    for seg in prompt.segments:
        if isinstance(seg, Text):
            roles.extend(["text"] * seg.length)
        elif isinstance(seg, Video):
            raise ValueError(f"family={family!r}: HunyuanOCR prompts have no videos (got {seg!r})")
        else:
            # vision_start, image * (h'(w' + 1) + 2), vision_end: ViT begin, h' rows of w' patches
            # plus a row-end token, ViT end.  The grid starts after vision_start and ViT begin.
            _, h, w = _merged(seg.grid_thw, prompt.spatial_merge_size)
            grids.append((len(roles) + 2, h, w))
            roles.extend(["vision_start"] + ["image"] * (h * (w + 1) + 2) + ["vision_end"])

    # Rows P, W, H, T (hunyuan_ocr) or W, H, T (hunyuan_ocr_3d); every row starts as the index n.
    num_dims = 4 if family == "hunyuan_ocr" else 3
    w_row, h_row, t_row = (1, 2, 3) if num_dims == 4 else (0, 1, 2)
    length = len(roles)
    positions = torch.arange(length, dtype=_LONG).repeat(num_dims, 1)
    for k, (start, h, w) in enumerate(grids):
        # The k-th image's h'(w'+1) grid tokens: W = column 0..w' (row end = w'), H = row, T = k;
        # P keeps n.
        span = slice(start, start + h * (w + 1))
        positions[w_row, span] = torch.arange(w + 1, dtype=_LONG).repeat(h)
        positions[h_row, span] = torch.arange(h, dtype=_LONG).repeat_interleave(w + 1)
        positions[t_row, span] = k
    return positions, 0, tuple(roles)   # delta is 0 for XD-RoPE
