"""The position ids' case: a batch of prompt descriptions (rope.prompts.PromptBatch: the contract's
own type, handed to the implementation as it is), its record form in a case file (JSON and back,
every field validated: a case file is data from a stranger), and the bounds a replay may be asked to
build.  The Hypothesis strategies that draw prompts live in the suite (properties.prompt_strategies)."""

from __future__ import annotations

import math

from rope.harness.case_files import is_int
from rope.prompts import Audio, Image, Prompt, PromptBatch, Text, Video

__all__ = ["MAX_PROMPTS", "MAX_PROMPT_TOKENS", "PromptBatch", "batch_to_dict", "prompt_from_dict", "prompt_to_dict",
           "prompt_tokens"]

# Bounds on what a case file may ask a replay to build: prompts, segments, grid sides, frames.
MAX_PROMPTS = 64
MAX_SEGMENTS = 256
MAX_TEXT = 1 << 16
MAX_SIDE = 1 << 10
MAX_FRAMES = 1 << 10
MAX_PROMPT_TOKENS = 1 << 20
MAX_AUDIO_FRAMES = 1 << 16


def prompt_to_dict(prompt: Prompt) -> dict:
    segments = []
    for seg in prompt.segments:
        if isinstance(seg, Text):
            segments.append({"text": seg.length})
        elif isinstance(seg, Image):
            segments.append({"image": list(seg.grid_thw)})
        elif isinstance(seg, Audio):
            segments.append({"audio": seg.frames})
        else:
            video = {"video": list(seg.grid_thw), "second_per_grid": seg.second_per_grid,
                     "timestamp_tokens": seg.timestamp_tokens}
            if seg.audio_frames is not None:
                video["audio_frames"] = seg.audio_frames
            segments.append(video)
    return {"spatial_merge_size": prompt.spatial_merge_size, "segments": segments}


def batch_to_dict(batch: PromptBatch) -> dict:
    return {"prompts": [prompt_to_dict(p) for p in batch.prompts], "pads": list(batch.pads), "side": batch.side}


def _audio_frames(where: str, frames) -> int:
    if not is_int(frames) or not 1 <= frames <= MAX_AUDIO_FRAMES:
        raise ValueError(f"{where}={frames!r}: must be an int in [1, {MAX_AUDIO_FRAMES}]")
    return frames


def _segment(where: str, raw) -> Text | Image | Video | Audio:
    if not isinstance(raw, dict) or len(set(raw) & {"text", "image", "video", "audio"}) != 1:
        raise ValueError(f"{where}: must be an object with exactly one of 'text', 'image', 'video', 'audio'")
    if "audio" in raw:
        if set(raw) != {"audio"}:
            raise ValueError(f"{where}: unknown fields {sorted(set(raw) - {'audio'})}")
        return Audio(_audio_frames(f"{where}.audio", raw["audio"]))
    if "text" in raw:
        if set(raw) != {"text"} or not is_int(raw["text"]) or not 0 <= raw["text"] <= MAX_TEXT:
            raise ValueError(f"{where}.text={raw.get('text')!r}: must be an int in [0, {MAX_TEXT}] and alone")
        return Text(raw["text"])
    key = "image" if "image" in raw else "video"
    grid = raw[key]
    if not isinstance(grid, list) or len(grid) != 3 or not all(is_int(v) for v in grid):
        raise ValueError(f"{where}.{key}={grid!r}: must be a list [t, h, w] of ints")
    t, h, w = grid
    if not (1 <= t <= MAX_FRAMES and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
        raise ValueError(f"{where}.{key}={grid!r}: t must be in [1, {MAX_FRAMES}], h and w in [1, {MAX_SIDE}]")
    if key == "image":
        if set(raw) != {"image"}:
            raise ValueError(f"{where}: unknown fields {sorted(set(raw) - {'image'})}")
        return Image(tuple(grid))
    extra = set(raw) - {"video", "second_per_grid", "timestamp_tokens", "audio_frames"}
    if extra:
        raise ValueError(f"{where}: unknown fields {sorted(extra)}")
    spg, ts = raw.get("second_per_grid", 1.0), raw.get("timestamp_tokens", 1)
    if isinstance(spg, bool) or not isinstance(spg, (int, float)) or not math.isfinite(spg) or not 0 < spg <= 1e6:
        raise ValueError(f"{where}.second_per_grid={spg!r}: must be a finite number in (0, 1e6]")
    if not is_int(ts) or not 0 <= ts <= 64:
        raise ValueError(f"{where}.timestamp_tokens={ts!r}: must be an int in [0, 64]")
    audio = raw.get("audio_frames")
    if audio is not None:
        _audio_frames(f"{where}.audio_frames", audio)
    return Video(tuple(grid), second_per_grid=float(spg), timestamp_tokens=ts, audio_frames=audio)


def prompt_from_dict(where: str, raw) -> Prompt:
    if not isinstance(raw, dict) or set(raw) != {"spatial_merge_size", "segments"}:
        raise ValueError(f"{where}: must be an object with 'spatial_merge_size' and 'segments'")
    merge, segments = raw["spatial_merge_size"], raw["segments"]
    if not is_int(merge) or not 1 <= merge <= 16:
        raise ValueError(f"{where}.spatial_merge_size={merge!r}: must be an int in [1, 16]")
    if not isinstance(segments, list) or not 1 <= len(segments) <= MAX_SEGMENTS:
        raise ValueError(f"{where}.segments: must be a list of 1 to {MAX_SEGMENTS} segments")
    try:
        return Prompt(tuple(_segment(f"{where}.segments[{i}]", s) for i, s in enumerate(segments)), merge)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def prompt_tokens(prompt: Prompt) -> int:
    """An upper bound of the prompt's tokens in any family's layout (checked before laying it out)."""
    total = 0
    for seg in prompt.segments:
        if isinstance(seg, Text):
            total += seg.length
        elif isinstance(seg, Audio):
            total += seg.frames + 2
        else:
            t, h, w = seg.grid_thw
            total += t * (h * w + h + 4 + getattr(seg, "timestamp_tokens", 0)) \
                + (getattr(seg, "audio_frames", None) or 0) + 2
    return total


