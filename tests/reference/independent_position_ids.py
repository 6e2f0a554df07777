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

from rope.prompts import AUDIO_FAMILIES, FAMILIES, OMNI_FAMILIES, VIDEO_FAMILIES, XDROPE_FAMILIES, Audio, Image, Prompt, Text, Video

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
    for seg in prompt.segments:
        if isinstance(seg, Video) and family not in VIDEO_FAMILIES:
            raise ValueError(f"family={family!r}: HunyuanOCR prompts have no videos (got {seg!r})")
        has_audio = isinstance(seg, Audio) or (isinstance(seg, Video) and seg.audio_frames is not None)
        if has_audio and family not in AUDIO_FAMILIES:
            raise ValueError(f"family={family!r}: only the Omni families take audio (got {seg!r})")
    if family in XDROPE_FAMILIES:
        return _xdrope(family, prompt)
    if family in OMNI_FAMILIES:
        return _omni(family, prompt)
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
        else:
            # vision_start, image * (h'(w' + 1) + 2), vision_end: ViT begin, h' rows of w' patches
            # plus a row-end token, ViT end.  The grid starts after vision_start and ViT begin.
            # ARC-Hunyuan-Video: a video's frames are t' such images in a row.
            t, h, w = _merged(seg.grid_thw, prompt.spatial_merge_size)
            for _ in range(t if isinstance(seg, Video) else 1):
                grids.append((len(roles) + 2, h, w))
                roles.extend(["vision_start"] + ["image"] * (h * (w + 1) + 2) + ["vision_end"])

    # Rows P, W, H, T (hunyuan_ocr) or W, H, T (hunyuan_ocr_3d); every row starts as the index n.
    num_dims = 3 if family == "hunyuan_ocr_3d" else 4     # hunyuan_ocr_3d alone drops P
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


# ------------------------------------------------------------------------------------------ Omni
def _audio_count(family: str, frames: int) -> int:
    # Qwen2.5-Omni: conv (kernel 3, stride 2, pad 1) then a 2-wide pool (stride 2).
    if family == "qwen2_5_omni":
        conv = (frames - 1) // 2 + 1
        return (conv - 2) // 2 + 1
    # Qwen3-Omni: 13 tokens per full window of 100 frames; the rest through three stride-2 steps.
    full, rest = divmod(frames, 100)
    x = (rest - 1) // 2 + 1
    x = (x - 1) // 2 + 1
    return (x - 1) // 2 + 1 + 13 * full


def _omni(family: str, prompt: Prompt):
    pps = 25 if family == "qwen2_5_omni" else 13
    pieces: list[torch.Tensor] = []
    roles: list[str] = []
    next_start = 0

    def put(rows: torch.Tensor, names) -> None:
        pieces.append(rows)
        roles.extend(names)

    def text(count: int, role: str) -> None:
        nonlocal next_start
        if count:
            put((next_start + torch.arange(count, dtype=_LONG)).expand(3, count), [role] * count)
            next_start += count

    def offsets(video: Video) -> torch.Tensor:
        raw = torch.arange(video.grid_thw[0], dtype=torch.float64) * video.second_per_grid * pps
        if family == "qwen3_omni" and not torch.equal(raw, torch.trunc(raw)):
            raise ValueError(f"second_per_grid={video.second_per_grid}: fractional Qwen3-Omni offsets")
        return torch.trunc(raw).to(_LONG)

    def vision(video_offsets: torch.Tensor, h: int, w: int, base: int) -> torch.Tensor:
        tt, hh, ww = torch.meshgrid(video_offsets, torch.arange(h, dtype=_LONG), torch.arange(w, dtype=_LONG),
                                    indexing="ij")
        return base + torch.stack((tt, hh, ww)).reshape(3, -1)

    for seg in prompt.segments:
        if isinstance(seg, Text):
            text(seg.length, "text")
            continue
        if isinstance(seg, Audio):
            n = _audio_count(family, seg.frames)
            if n < 1:
                raise ValueError(f"frames={seg.frames}: no audio tokens")
            text(1, "audio_start")
            text(n, "audio")
            text(1, "audio_end")
            continue
        t, h, w = _merged(seg.grid_thw, prompt.spatial_merge_size)
        if isinstance(seg, Image) or seg.audio_frames is None:
            text(1, "vision_start")
            block = vision(torch.zeros(1, dtype=_LONG) if isinstance(seg, Image) else offsets(seg), h, w, next_start)
            put(block, ["image" if isinstance(seg, Image) else "video"] * block.shape[1])
            next_start = int(block.max()) + 1
            text(1, "vision_end")
            continue
        n = _audio_count(family, seg.audio_frames)
        if n < 1:
            raise ValueError(f"audio_frames={seg.audio_frames}: no audio tokens")
        shared = family == "qwen2_5_omni"
        if shared:                                   # <|vision_bos|><|audio_bos|> at one position
            put(torch.full((3, 2), next_start, dtype=_LONG), ["vision_start", "audio_start"])
            next_start += 1
        else:
            text(1, "vision_start")
            text(1, "audio_start")
        st = next_start
        video = vision(offsets(seg), h, w, st)
        audio = (st + torch.arange(n, dtype=_LONG)).expand(3, n)
        if shared:
            # Chunk numbers: video c_i = min(f_i // 50, c_{i-1} + 1) (at most one new chunk per
            # token), audio i // 50; the order is (chunk, video before audio).
            chunk, c = [], 0
            for f in (video[0] - st).tolist():
                c = min(f // 50, c + 1) if chunk else 0
                chunk.append(c)
            key_v = torch.tensor(chunk, dtype=_LONG) * 2
            key_a = torch.arange(n, dtype=_LONG) // 50 * 2 + 1
        else:
            # Merge on the temporal value, video first on a tie: a stable sort by (T, stream).
            key_v, key_a = video[0] * 2, audio[0] * 2 + 1
        keys = torch.cat((key_v, key_a))
        order = torch.sort(keys, stable=True).indices
        rows = torch.cat((video, audio), dim=1)[:, order]
        stream = torch.cat((torch.zeros(video.shape[1], dtype=_LONG), torch.ones(n, dtype=_LONG)))[order]
        names = ["video" if s == 0 else "audio" for s in stream.tolist()]
        put(rows, names)
        # The last run: qwen2_5_omni the tokens of the largest key; qwen3_omni the final stretch
        # of one stream (the tail left when the other stream ran out).
        if shared:
            last = rows[:, keys[order] == keys[order][-1]]
        else:
            other = (stream != stream[-1]).nonzero()
            last = rows[:, int(other[-1]) + 1:]
        next_start = int(last.max()) + 1
        if shared:
            put(torch.full((3, 2), next_start, dtype=_LONG), ["audio_end", "vision_end"])
            next_start += 1
        else:
            text(1, "audio_end")
            text(1, "vision_end")
    positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=_LONG)
    top = int(positions.max()) if positions.numel() else -1
    return positions.contiguous(), top + 1 - positions.shape[1], tuple(roles)
