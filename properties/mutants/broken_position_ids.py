"""Position-id implementations with one shipped bug each (``fn(family, prompt) -> (positions, delta)``).

Each mutant is the reference's layout with one rule written the way an engine once wrote it; the
position-id properties (properties/position_ids/test_position_ids.py) must reject every one of them.  Selected
with ``--rope-position-ids-impl properties.mutants.broken_position_ids:<name>``.
"""

from __future__ import annotations

import dataclasses

import torch

from reference.position_ids import prompt_positions
from rope.harness.position_ids.diagnosis import OMNI_DEFAULT_SECOND_PER_GRID
from rope.prompts import (IMAGE, OMNI_FAMILIES, QWEN2_5_VL_TOKENS_PER_SECOND, VISION_FAMILIES, XDROPE_FAMILIES, Audio,
                          Image, Prompt, Text, Video)

VL_MROPE = tuple(f for f in VISION_FAMILIES if f not in XDROPE_FAMILIES)


def _mrope(family: str, prompt: Prompt, *, t_offsets=None, split_frames: bool = True, video_as_text: bool = False,
           resume=None, merge=None):
    """M-RoPE ids of ``prompt`` laid out as ``family`` does, with hooks for one wrong rule each:
    ``t_offsets(video, t)`` the temporal offsets of a one-block video; ``split_frames`` False lays
    a Qwen3-VL / GLM video out as one block over all its frames; ``video_as_text`` gives video
    tokens text positions; ``resume(base, offsets, h, w)`` the next start after a video block;
    ``merge`` the size h and w are divided by."""
    rows: list[list[int]] = []
    largest = -1

    def put(t, h, w):
        nonlocal largest
        rows.append([t, h, w])
        largest = max(largest, t, h, w)

    def text(n):
        for _ in range(n):
            p = largest + 1
            put(p, p, p)

    m = merge or prompt.spatial_merge_size
    for seg in prompt.segments:
        if isinstance(seg, Text):
            text(seg.length)
            continue
        t, h, w = seg.grid_thw[0], seg.grid_thw[1] // m, seg.grid_thw[2] // m
        if isinstance(seg, Image):
            text(1)
            base = largest + 1
            for hi in range(h):
                for wi in range(w):
                    put(base, base + hi, base + wi)
            text(1)
            continue
        if video_as_text:
            frames_tokens = t * h * w
            if family in ("qwen2_vl", "qwen2_5_vl"):
                text(1 + frames_tokens + 1)
            elif family == "qwen3_vl":
                text(t * (seg.timestamp_tokens + 2) + frames_tokens)
            else:
                text(2 + t * (2 + seg.timestamp_tokens) + frames_tokens)
            continue
        if family in ("qwen2_vl", "qwen2_5_vl"):
            offsets = t_offsets(seg, t) if t_offsets else (
                [int(ti * seg.second_per_grid * QWEN2_5_VL_TOKENS_PER_SECOND) for ti in range(t)]
                if family == "qwen2_5_vl" else list(range(t)))
            text(1)
            base = largest + 1
            for f in offsets:
                for hi in range(h):
                    for wi in range(w):
                        put(base + f, base + hi, base + wi)
            if resume is not None:
                largest = resume(base, offsets, h, w) - 1
            text(1)
            continue
        # qwen3_vl: (timestamps, vs, frame, ve) per frame; glm4v: bov (vs, frame, ve, timestamps)* eov
        if family == "glm4v":
            text(1)
        first_base = None
        for ti in range(t):
            if family == "qwen3_vl":
                text(seg.timestamp_tokens)
            text(1)
            base = largest + 1
            if first_base is None:
                first_base = base
            tb, sb = (base, base) if split_frames else (first_base + ti, first_base)
            for hi in range(h):
                for wi in range(w):
                    put(tb, sb + hi, sb + wi)
            text(1)
            if family == "glm4v":
                text(seg.timestamp_tokens)
        if family == "glm4v":
            text(1)
    positions = torch.tensor(rows, dtype=torch.int64).T.contiguous()
    return positions, int(positions.max()) + 1 - positions.shape[1]


def reference_ids(family: str, prompt: Prompt):
    """The reference's own ids: the unmutated parent every mutant here is confirmed against."""
    ref = prompt_positions(family, prompt)
    return ref.positions.clone(), ref.delta


_ref = reference_ids


def temporal_scale_truncated(family: str, prompt: Prompt):
    """Qwen2.5-VL seconds per grid cut to an int before scaling: every frame of a video sampled
    faster than one grid per second lands on T = base (transformers#48669, lmms-eval#1393)."""
    if family != "qwen2_5_vl":
        return _ref(family, prompt)
    return _mrope(family, prompt, t_offsets=lambda v, t: [int(ti * int(v.second_per_grid) * QWEN2_5_VL_TOKENS_PER_SECOND)
                                                        for ti in range(t)])


def merge_size_from_temporal_patch(family: str, prompt: Prompt):
    """The spatial merge taken from the temporal patch size (2): two sizes conflated, as in
    vllm#37439, invisible while both are 2 as in every default config."""
    if family not in VL_MROPE:
        return _ref(family, prompt)
    return _mrope(family, prompt, merge=2)


def frames_not_split(family: str, prompt: Prompt):
    """A Qwen3-VL / GLM video laid out as one (t, h', w') block: every frame reuses the first
    frame's spatial base and T counts frames, the timestamp text between frames ignored (the
    Qwen2-VL rule reused for Qwen3-VL, transformers#44474)."""
    if family not in ("qwen3_vl", "glm4v"):
        return _ref(family, prompt)
    return _mrope(family, prompt, split_frames=False)


def video_as_text(family: str, prompt: Prompt):
    """Video tokens classified as text: a GLM video checked for the image token id after it was
    replaced by the video token id (vllm#33039)."""
    if family != "glm4v":
        return _ref(family, prompt)
    return _mrope(family, prompt, video_as_text=True)


def text_after_video_restart(family: str, prompt: Prompt):
    """After a video the cursor moves by max(h', w') instead of to max(block) + 1, so text after a
    long video restarts inside its temporal range (transformers >= 5.3 get_rope_index)."""
    if family not in ("qwen2_vl", "qwen2_5_vl"):
        return _ref(family, prompt)
    return _mrope(family, prompt, resume=lambda base, offsets, h, w: base + max(h, w))


def delta_from_first_chunk(family: str, prompt: Prompt):
    """The decode delta computed from the first prefill chunk (16 tokens) instead of the whole
    prompt (vllm#10403: recomputed per chunk; it is a constant of the full prompt)."""
    positions, delta = _ref(family, prompt)
    if family in XDROPE_FAMILIES or positions.shape[1] <= 16:
        return positions, delta
    return positions, int(positions[:, :16].max()) + 1 - 16


def negative_delta_clamped(family: str, prompt: Prompt):
    """A negative delta returned as 0 (an unsigned or clamped field; negative deltas arise by
    construction whenever a vision block is wider than tall, LightLLM#1147)."""
    positions, delta = _ref(family, prompt)
    return positions, max(delta, 0)


def positions_in_fp16(family: str, prompt: Prompt):
    """Positions carried through a half-precision tensor (built with the activations' dtype): exact
    to 2048, rounded to a multiple of 2, 4, ... past it, so the ids of a long prompt collide."""
    positions, delta = _ref(family, prompt)
    return positions.to(torch.float16).to(torch.int64), delta


def zero_taken_as_missing(family: str, prompt: Prompt):
    """0 taken for 'no position': zeros after the first token are filled with the token index
    (rtp-llm#1213); an XD-RoPE image's first row and column, an image at the very start."""
    positions, delta = _ref(family, prompt)
    index = torch.arange(positions.shape[1]).expand_as(positions)
    hole = (positions == 0) & (index > 0)
    return torch.where(hole, index, positions), delta


def _xd_batch(family: str, batch):
    """One call over the batch, counting the image ordinal across it (HunYuanVL in transformers
    >= 5.13): the images of prompt b start at T = images in prompts 0..b-1."""
    out, before = [], 0
    for prompt in batch.prompts:
        positions, delta = _ref(family, prompt)
        if family in XDROPE_FAMILIES and before:
            ref = prompt_positions(family, prompt)
            start = 0
            values = ref.modality.tolist()
            for k in range(1, len(values) + 1):           # each image's grid = its run less ViT begin/end
                if k == len(values) or values[k] != values[start]:
                    if values[start] == IMAGE:
                        positions[-1, start + 1:k - 1] += before
                    start = k
        before += sum(isinstance(s, Image) for s in prompt.segments)
        out.append((positions, delta))
    return out


def ordinal_across_batch(family: str, prompt: Prompt):
    """HunYuanVL's image ordinal counted across the batch instead of per prompt (transformers
    >= 5.13): right for one prompt, wrong for every later prompt of a batch with images."""
    return _ref(family, prompt)


ordinal_across_batch.batch = _xd_batch

# ------------------------------------------------------------------------------------------ Omni
def _shifted(family: str, prompt: Prompt, step) -> tuple[torch.Tensor, int]:
    """The reference's ids with ``step(roles, k)`` added to token k and every token after it."""
    ref = prompt_positions(family, prompt)
    positions, shift = ref.positions.clone(), 0
    for k in range(ref.length):
        shift += step(ref.roles, k)
        positions[:, k] += shift
    return positions, int(positions.max()) + 1 - ref.length


def _has_audio_in_video(prompt: Prompt) -> bool:
    return any(isinstance(s, Video) and s.audio_frames is not None for s in prompt.segments)


def audio_bos_eos_counted_twice(family: str, prompt: Prompt):
    """Qwen2.5-Omni's two start tokens of a video with audio given two positions, and its two end
    tokens too, instead of one each: the audio bos / eos handled twice (vllm#16878; Qwen3-Omni's
    rule, where they are consecutive, applied to Qwen2.5-Omni)."""
    if family != "qwen2_5_omni":
        return _ref(family, prompt)
    return _shifted(family, prompt, lambda roles, k: int(k > 0 and (roles[k - 1], roles[k]) in (
        ("vision_start", "audio_start"), ("audio_end", "vision_end"))))


def image_end_shifted_with_audio_in_video(family: str, prompt: Prompt):
    """In a Qwen2.5-Omni prompt that uses audio in video, an image's end token taken for a video's
    and shifted back by one like the shared end tokens, with everything after it (vllm#16878:
    the -1 applied without checking that the vision end belongs to a video)."""
    if family != "qwen2_5_omni" or not _has_audio_in_video(prompt):
        return _ref(family, prompt)
    return _shifted(family, prompt, lambda roles, k: -int(k > 0 and roles[k] == "vision_end" and roles[k - 1] == "image"))


def audio_advances_only_t(family: str, prompt: Prompt):
    """A stand-alone audio's tokens advance the temporal row only, H and W held at the first audio
    position (mstar#196: the model gives audio text positions on every row)."""
    ref = prompt_positions(family, prompt)
    if family not in OMNI_FAMILIES:
        return ref.positions.clone(), ref.delta
    positions, start = ref.positions.clone(), None
    for k, role in enumerate(ref.roles):
        if role == "audio" and ref.roles[k - 1] == "audio_start":
            start = int(positions[0, k])                 # a clip (a video's audio follows video tokens)
        elif role != "audio":
            start = None
        if start is not None:
            positions[1:, k] = start
    return positions, ref.delta


def second_per_grid_default(family: str, prompt: Prompt):
    """Omni videos laid out with the default seconds per grid (1.0 Qwen2.5-Omni, 2.0 Qwen3-Omni)
    whatever the video's own: the processor's ``video_second_per_grid`` looked up under another
    key and never found (vllm#23056, vllm-omni#5398)."""
    if family not in OMNI_FAMILIES:
        return _ref(family, prompt)
    segments = tuple(dataclasses.replace(s, second_per_grid=OMNI_DEFAULT_SECOND_PER_GRID[family])
                     if isinstance(s, Video) else s for s in prompt.segments)
    return _ref(family, Prompt(segments, prompt.spatial_merge_size))


def audio_in_video_flag_from_first_video(family: str, prompt: Prompt):
    """One use_audio_in_video for the whole prompt, taken from its first video: when that video has
    no audio, a later video's audio track is laid out as a clip of its own after the video, not
    interleaved with it (VeOmni#493: videos with and without audio in one batch)."""
    videos = [s for s in prompt.segments if isinstance(s, Video)]
    if family not in OMNI_FAMILIES or not videos or videos[0].audio_frames is not None:
        return _ref(family, prompt)
    segments = []
    for s in prompt.segments:
        if isinstance(s, Video) and s.audio_frames is not None:
            segments += [dataclasses.replace(s, audio_frames=None), Audio(s.audio_frames)]
        else:
            segments.append(s)
    return _ref(family, Prompt(tuple(segments), prompt.spatial_merge_size))


BROKEN_POSITION_IDS = {fn.__name__: fn for fn in (
    temporal_scale_truncated, merge_size_from_temporal_patch, frames_not_split, video_as_text,
    text_after_video_restart, delta_from_first_chunk, negative_delta_clamped, positions_in_fp16, zero_taken_as_missing,
    ordinal_across_batch, audio_bos_eos_counted_twice, image_end_shifted_with_audio_in_video,
    audio_advances_only_t, second_per_grid_default, audio_in_video_flag_from_first_video)}
