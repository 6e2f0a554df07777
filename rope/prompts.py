"""The prompt description a position-id implementation is handed (docs/spec.md §4): an ordered tuple
of segments, each a text run (``Text``), an image (``Image``), a video (``Video``, with its own audio
track in the Omni families) or an audio clip (``Audio``), with the vision grids in patches before the
spatial merge, and the model families the harness knows.  Part of the
contract, like the spec: the reference computes positions from it (reference/position_ids.py), the
adapters hand it to the engines' code, the strategies draw it.  Every field is checked on
construction: bad input is a ValueError naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Vision-language families (text, images, videos) first; the Omni families add audio.
VISION_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "hunyuan_ocr", "hunyuan_ocr_3d")
OMNI_FAMILIES = ("qwen2_5_omni", "qwen3_omni")
FAMILIES = (*VISION_FAMILIES, *OMNI_FAMILIES, "arc_hunyuan_video")
# XD-RoPE: every row starts as the token index and only grid tokens depart from it.
XDROPE_FAMILIES = ("hunyuan_ocr", "hunyuan_ocr_3d", "arc_hunyuan_video")
# Families whose prompts may hold videos (HunyuanOCR takes images only) and audio.
VIDEO_FAMILIES = tuple(f for f in FAMILIES if f not in ("hunyuan_ocr", "hunyuan_ocr_3d"))
AUDIO_FAMILIES = OMNI_FAMILIES
_NUM_DIMS = {"hunyuan_ocr": 4, "arc_hunyuan_video": 4}

# Modality codes: text, image and video are transformers' mm_token_type_ids; audio (the Omni models
# find it by token id) is the harness's own 3.
TEXT, IMAGE, VIDEO, AUDIO = 0, 1, 2, 3
ROLES = ("text", "timestamp", "vision_start", "vision_end", "video_start", "video_end", "image", "video",
         "audio_start", "audio_end", "audio")

# Qwen2.5-VL vision_config.tokens_per_second in the released checkpoints (the config class default
# differs; the checkpoints set 2).  Temporal offsets are spaced by absolute time.
QWEN2_5_VL_TOKENS_PER_SECOND = 2


def is_int(value) -> bool:
    """An int that is not a bool (the contract's integer fields)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_grid(field: str, grid_thw) -> tuple[int, int, int]:
    try:
        grid = tuple(grid_thw)
    except TypeError:
        raise ValueError(f"{field}={grid_thw!r}: must be a sequence (t, h, w) of ints (got {type(grid_thw).__name__})") from None
    if len(grid) != 3:
        raise ValueError(f"{field}={grid!r}: must have 3 entries (t, h, w) (got {len(grid)})")
    for name, value in zip("thw", grid):
        if not is_int(value):
            raise ValueError(f"{field}={grid!r}: every entry must be an int (got {name}={value!r})")
        if value < 1:
            raise ValueError(f"{field}={grid!r}: every entry must be >= 1 (got {name}={value})")
    return grid


# ---------------------------------------------------------------------------------- description
@dataclass(frozen=True)
class Text:
    """A run of ``length`` ordinary text tokens (>= 0)."""

    length: int

    def __post_init__(self) -> None:
        if not is_int(self.length):
            raise ValueError(f"length={self.length!r}: must be an int (got {type(self.length).__name__})")
        if self.length < 0:
            raise ValueError(f"length={self.length}: must be >= 0 (got {self.length})")


@dataclass(frozen=True)
class Image:
    """One image; ``grid_thw`` = (1, h, w) patches before the spatial merge."""

    grid_thw: tuple[int, int, int]

    def __post_init__(self) -> None:
        grid = _check_grid("grid_thw", self.grid_thw)
        if grid[0] != 1:
            raise ValueError(f"grid_thw={grid!r}: an image has t = 1 (got t={grid[0]})")
        object.__setattr__(self, "grid_thw", grid)


@dataclass(frozen=True)
class Video:
    """One video; ``grid_thw`` = (t, h, w) grids before the spatial merge.

    ``second_per_grid`` (seconds per temporal grid, = temporal_patch_size / fps) scales the
    temporal row for qwen2_5_vl only.  ``timestamp_tokens`` is the length of the time text each
    frame carries in qwen3_vl and glm4v (the tokenizer decides it; positions only need the count).
    Families that have neither ignore them.  In the Omni families ``second_per_grid`` scales the
    temporal row by ``position_id_per_seconds`` (25 or 13) and ``audio_frames`` is the video's own
    audio track, interleaved with its frames by time (``use_audio_in_video``): its feature length,
    as for ``Audio.frames``; None, a video without audio.  Other families refuse audio.
    """

    grid_thw: tuple[int, int, int]
    second_per_grid: float = 1.0
    timestamp_tokens: int = 1
    audio_frames: int | None = None

    def __repr__(self) -> str:         # a video without audio reads as it did before audio existed
        audio = "" if self.audio_frames is None else f", audio_frames={self.audio_frames!r}"
        return (f"Video(grid_thw={self.grid_thw!r}, second_per_grid={self.second_per_grid!r}, "
                f"timestamp_tokens={self.timestamp_tokens!r}{audio})")

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid_thw", _check_grid("grid_thw", self.grid_thw))
        spg = self.second_per_grid
        if isinstance(spg, bool) or not isinstance(spg, (int, float)):
            raise ValueError(f"second_per_grid={spg!r}: must be a number (got {type(spg).__name__})")
        if not math.isfinite(spg) or spg <= 0:
            raise ValueError(f"second_per_grid={spg!r}: must be finite and > 0 (got {spg!r})")
        if not is_int(self.timestamp_tokens) or self.timestamp_tokens < 0:
            raise ValueError(f"timestamp_tokens={self.timestamp_tokens!r}: must be an int >= 0 (got {self.timestamp_tokens!r})")
        if self.audio_frames is not None:
            _check_audio_frames("audio_frames", self.audio_frames)


MAX_AUDIO_FRAMES = 1 << 20


def _check_audio_frames(field: str, frames) -> None:
    if not is_int(frames) or not 1 <= frames <= MAX_AUDIO_FRAMES:
        raise ValueError(f"{field}={frames!r}: must be an int in [1, {MAX_AUDIO_FRAMES}] (got {frames!r})")


@dataclass(frozen=True)
class Audio:
    """One audio clip (Omni families): ``frames`` is its feature length, the mel frames the audio
    encoder takes (transformers' ``feature_attention_mask.sum(-1)``, 100 per second); each family
    turns it into its token count (``reference.audio_tokens``)."""

    frames: int

    def __post_init__(self) -> None:
        _check_audio_frames("frames", self.frames)


SEGMENT_TYPES = (Text, Image, Video, Audio)


@dataclass(frozen=True)
class Prompt:
    """An ordered tuple of segments and the vision tower's ``spatial_merge_size`` (2 in every model here)."""

    segments: tuple[Text | Image | Video | Audio, ...]
    spatial_merge_size: int = 2

    def __post_init__(self) -> None:
        try:
            segments = tuple(self.segments)
        except TypeError:
            raise ValueError(f"segments={self.segments!r}: must be a sequence of Text, Image, Video (got {type(self.segments).__name__})") from None
        object.__setattr__(self, "segments", segments)
        m = self.spatial_merge_size
        if not is_int(m) or m < 1:
            raise ValueError(f"spatial_merge_size={m!r}: must be an int >= 1 (got {m!r})")
        for i, seg in enumerate(segments):
            if not isinstance(seg, SEGMENT_TYPES):
                raise ValueError(f"segments[{i}]={seg!r}: must be a Text, Image, Video or Audio "
                                 f"(got {type(seg).__name__})")
            if isinstance(seg, (Text, Audio)):
                continue
            _, h, w = seg.grid_thw
            if h % m or w % m:
                raise ValueError(
                    f"segments[{i}].grid_thw={seg.grid_thw!r}: h and w must be multiples of "
                    f"spatial_merge_size={m} (h % {m} = {h % m}, w % {m} = {w % m})"
                )


def check_family(family) -> str:
    """Return ``family`` if it is one of ``FAMILIES``, else raise ValueError."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: must be one of {FAMILIES} (got {family!r})")
    return family


def family_num_dims(family: str) -> int:
    """Position rows of a family: 3 (M-RoPE, and hunyuan_ocr_3d W, H, T) or 4 (hunyuan_ocr and
    arc_hunyuan_video P, W, H, T)."""
    return _NUM_DIMS.get(check_family(family), 3)


def check_segments(family: str, prompt: "Prompt") -> None:
    """ValueError naming the first segment ``family`` cannot take: a video in HunyuanOCR, audio
    (an ``Audio`` segment, a video's ``audio_frames``) outside the Omni families."""
    for i, seg in enumerate(prompt.segments):
        if isinstance(seg, Video) and family not in VIDEO_FAMILIES:
            raise ValueError(f"segments[{i}]={seg!r}: {family} takes no video (got a Video)")
        if family in AUDIO_FAMILIES:
            continue
        if isinstance(seg, Audio):
            raise ValueError(f"segments[{i}]={seg!r}: {family} takes no audio (only {', '.join(AUDIO_FAMILIES)} do)")
        if isinstance(seg, Video) and seg.audio_frames is not None:
            raise ValueError(f"segments[{i}].audio_frames={seg.audio_frames!r}: {family} takes no audio in a video "
                             f"(only {', '.join(AUDIO_FAMILIES)} do)")


# ---------------------------------------------------------------------------------- batches
SIDES = ("left", "right")
MAX_PAD = 1 << 12


@dataclass(frozen=True)
class PromptBatch:
    """Prompts of one batched call, each padded with ``pads[i]`` tokens on ``side``.

    An API that takes one prompt at a time runs them one by one; one that is batched gets them
    together, padded to the longest (``attention_mask`` 0 on the pads).  The prompts share one
    ``spatial_merge_size`` (one vision config per call).
    """

    prompts: tuple[Prompt, ...]
    pads: tuple[int, ...] = ()
    side: str = "left"

    def __post_init__(self) -> None:
        prompts = tuple(self.prompts)
        if not prompts or not all(isinstance(p, Prompt) for p in prompts):
            raise ValueError(f"prompts={self.prompts!r}: must be a non-empty sequence of Prompt")
        pads = tuple(self.pads) if self.pads else (0,) * len(prompts)
        if len(pads) != len(prompts):
            raise ValueError(f"pads={pads!r}: must have one entry per prompt ({len(prompts)})")
        if not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= MAX_PAD for p in pads):
            raise ValueError(f"pads={pads!r}: every pad must be an int in [0, {MAX_PAD}]")
        if self.side not in SIDES:
            raise ValueError(f"side={self.side!r}: must be one of {SIDES}")
        merges = {p.spatial_merge_size for p in prompts}
        if len(merges) != 1:
            raise ValueError(f"prompts: must share one spatial_merge_size (got {sorted(merges)})")
        object.__setattr__(self, "prompts", prompts)
        object.__setattr__(self, "pads", pads)


@dataclass(frozen=True)
class KnownDeviation:
    """The value an implementation is pinned to return where a documented upstream departure applies.

    ``keys`` name the departures that changed something (e.g. ``cursor_after_video``); ``reason``
    is the sentence a report shows.
    """

    positions: torch.Tensor
    delta: int
    keys: tuple[str, ...]
    reason: str
