"""Hypothesis strategies for prompt descriptions (``reference.Prompt``) and batches of them.

Prompts hold several images and videos in any order (one may open the prompt, where every row
starts at 0), long videos whose temporal span outruns the spatial one, seconds per grid below one
and fractional (fps 4, 8, 24, 3, 1.33) as well as whole, Qwen3-VL / GLM timestamp text of 0 to 3
tokens per frame, merge sizes 2 (every released model), 1 and 4; in the Omni families audio clips
and videos with and without their audio track (a prompt may mix both: VeOmni#493), seconds per grid
above 2 as well (Qwen2.5-Omni's chunks then jump), and audio shorter and longer than the video.
Batches pad each prompt on the left or the right.  Everything shrinks towards one short text run,
merge size 2, no padding.
"""

from __future__ import annotations

from hypothesis import strategies as st

from rope.prompts import AUDIO_FAMILIES, FAMILIES, VIDEO_FAMILIES, Audio, Image, Prompt, PromptBatch, Text, Video

# Seconds per temporal grid = temporal_patch_size / fps: fps 2, 4, 1, 8, 24, 3, 1.33.  transformers
# forms ti * (tokens_per_second * spg) in float32, the reference int(ti * spg * 2) in float64; the
# two agree for these values (checked for ti < 200).
SECONDS_PER_GRID = (1.0, 0.5, 2.0, 0.25, 2 / 24, 2 / 3, 1.5)
# Omni: Qwen2.5-Omni scales by 25 (float32 in transformers; these agree with the float64 product
# for ti < 200, and 3 and 4 make one frame jump a 50-wide chunk); Qwen3-Omni by 13, and only
# whole products are ids (the reference refuses the rest).
OMNI_SECONDS_PER_GRID = {"qwen2_5_omni": (*SECONDS_PER_GRID, 3.0, 4.0), "qwen3_omni": (2.0, 1.0, 4.0, 3.0)}
# Audio feature frames (100 per second): Qwen2.5-Omni needs 3 for one token.
AUDIO_FRAMES = (3, 400)
MERGE_SIZES = (2, 1, 4)
LONG_TEXT = 1 << 15         # a leading text run at least this long (prompts' max_leading_text)
# The suite's prompts may open with up to 2^17 text tokens: positions past any 16-bit slot and far
# past where fp16 or bf16 hold integers exactly.  The position step draws positions to 2^20 (its
# cost does not grow with them); here every token costs the reference and the implementation alike.
LONG_PROMPT = 1 << 17


def _check_bound(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r}: must be an int >= {low} (got {value!r})")


def prompts(*, family: str, max_segments: int = 5, max_text: int = 4, max_side: int = 3, max_frames: int = 5,
            spatial_merge_sizes: tuple[int, ...] = MERGE_SIZES, max_leading_text: int = 0):
    """Prompts valid for ``family``: 1..max_segments segments in any order, text runs of
    1..max_text tokens, images / videos of h', w' in 1..max_side merged tokens and 1..max_frames
    frames (a video of 5 frames of 1 x 1 outruns its spatial extent), the merge size from
    ``spatial_merge_sizes`` (the first is the real models' 2).  With ``max_leading_text``, a prompt
    may open with a text run of 2^15 to that many tokens, so the positions after it reach the
    magnitudes long-context models do (2^20: an implementation holding a position in 16 bits, or in
    a float that rounds, shows there)."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: must be one of {FAMILIES} (got {family!r})")
    if not spatial_merge_sizes or not all(isinstance(m, int) and m >= 1 for m in spatial_merge_sizes):
        raise ValueError(f"spatial_merge_sizes={spatial_merge_sizes!r}: must be a non-empty tuple of ints >= 1")
    for name, value, low in (("max_segments", max_segments, 1), ("max_text", max_text, 1),
                             ("max_side", max_side, 1), ("max_frames", max_frames, 1),
                             ("max_leading_text", max_leading_text, 0)):
        _check_bound(name, value, low)

    return _draw_prompt(family, spatial_merge_sizes, max_segments, max_text, max_side, max_frames, max_leading_text)


# The composites are defined once, at import: @st.composite reads its function's source when applied.
@st.composite
def _draw_prompt(draw, family, spatial_merge_sizes, max_segments, max_text, max_side, max_frames, max_leading_text):
    merge = draw(st.sampled_from(spatial_merge_sizes))
    side = st.integers(1, max_side).map(lambda n: n * merge)
    texts = st.builds(Text, st.integers(1, max_text))
    images = st.builds(lambda h, w: Image((1, h, w)), side, side)
    audio = st.integers(*AUDIO_FRAMES)
    videos = st.builds(
        lambda t, h, w, spg, ts, a: Video((t, h, w), second_per_grid=spg, timestamp_tokens=ts, audio_frames=a),
        st.integers(1, max_frames), side, side, st.sampled_from(OMNI_SECONDS_PER_GRID.get(family, SECONDS_PER_GRID)),
        st.integers(0, 3), st.none() | audio if family in AUDIO_FAMILIES else st.none(),
    )
    kinds = [texts, images]
    if family in VIDEO_FAMILIES:
        kinds.append(videos)
    if family in AUDIO_FAMILIES:
        kinds.append(st.builds(Audio, audio))
    segments = draw(st.lists(st.one_of(*kinds), min_size=1, max_size=max_segments))
    # One prompt in four (each long token costs the reference and the implementation alike).
    if max_leading_text >= LONG_TEXT and draw(st.sampled_from((False, False, False, True)), label="long"):
        segments = [Text(draw(st.integers(LONG_TEXT, max_leading_text), label="leading text")), *segments]
    return Prompt(tuple(segments), spatial_merge_size=merge)


def batches(*, family: str, max_batch: int = 3, max_pad: int = 3, **prompt_bounds):
    """1..max_batch prompts sharing one merge size, 0..max_pad pad tokens each, left or right."""
    _check_bound("max_batch", max_batch, 1)
    _check_bound("max_pad", max_pad, 0)

    return _draw_batch(family, max_batch, max_pad, tuple(sorted(prompt_bounds.items())))


@st.composite
def _draw_batch(draw, family, max_batch, max_pad, prompt_bounds):
    merge = draw(st.sampled_from(MERGE_SIZES))                 # one vision config per call
    same_merge = prompts(family=family, spatial_merge_sizes=(merge,), **dict(prompt_bounds))
    batch = draw(st.lists(same_merge, min_size=1, max_size=max_batch))
    pads = tuple(draw(st.integers(0, max_pad)) for _ in batch)
    side = draw(st.sampled_from(("left", "right")))
    return PromptBatch(tuple(batch), pads, side)
