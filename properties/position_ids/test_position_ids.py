"""Position-id implementations against ``reference.prompt_positions`` (docs/spec.md §4).

Every test takes ``position_ids_impl_name``: the implementations named by
``--rope-position-ids-impl`` (transformers, vllm, sglang, or ``package.module:callable``), by default
transformers where it is installed.  Each prompt goes through the implementation (batched where
its API is, padded left or right) and each result must equal the reference, or, where the
implementation declares a documented upstream departure that applies (``known_deviations``), the
exact value that departure is pinned to give.

1. ``test_known_bug_prompts_match``: a fixed prompt for every position-id bug this field has
   shipped, and for the models' grid limits; the fastest way to catch a regression.
2. ``test_position_ids_match_reference``: drawn batches per family (properties/prompt_strategies.py).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from properties.prompt_strategies import batches
from rope.prompts import FAMILIES, Audio, Image, Prompt, Text, Video
from rope.harness.position_ids import PromptBatch, get_position_ids_implementation, unsupported_reason
from rope.harness.position_ids.cases import assert_matches


def _one(*segments, merge: int = 2) -> PromptBatch:
    return PromptBatch((Prompt(tuple(segments), spatial_merge_size=merge),))


ONE_IMAGE = Prompt((Text(1), Image((1, 2, 4))))
# (id, family, batch): the upstream report each prompt reproduces, where one exists.
KNOWN_BUG_PROMPTS = [
    # Seconds per grid below one (fps 4 and 8) cut to an int: every frame at T = base.
    ("transformers#48669-fps4", "qwen2_5_vl", _one(Video((2, 4, 4), second_per_grid=0.5), Text(1))),
    ("lmms-eval#1393-fps8", "qwen2_5_vl", _one(Text(2), Video((4, 4, 4), second_per_grid=0.25), Text(1))),
    ("fractional-1.5s", "qwen2_5_vl", _one(Video((3, 2, 2), second_per_grid=1.5), Text(1))),
    # Merge size and temporal patch size conflated (vllm#37439): only a merge size other than 2 shows it.
    ("vllm#37439-merge1", "qwen2_vl", _one(Text(1), Image((1, 2, 4)), Text(1), merge=1)),
    ("vllm#37439-merge4", "qwen3_vl", _one(Text(1), Video((2, 8, 4), timestamp_tokens=2), Text(1), merge=4)),
    # Qwen3-VL / GLM videos are one grid per frame with text between frames.
    ("transformers#44474-qwen3-frames", "qwen3_vl", _one(Text(1), Video((3, 4, 4), timestamp_tokens=2), Text(1))),
    ("glm4v-frame-groups", "glm4v", _one(Text(1), Video((3, 4, 4), timestamp_tokens=1), Text(2))),
    # GLM video tokens taken for text.
    ("vllm#33039-glm-video-as-text", "glm4v", _one(Text(1), Video((2, 4, 4)), Text(1))),
    # Text after a video whose temporal span outruns its spatial one.
    ("transformers-5.3-text-after-long-video", "qwen2_5_vl",
     _one(Text(1), Video((4, 4, 4), second_per_grid=2.0), Text(3))),
    ("qwen2_vl-text-after-long-video", "qwen2_vl", _one(Video((3, 2, 2)), Text(1))),
    # HunYuanVL's image ordinal per prompt, not per batch (3 and 4 rows).
    ("hunyuan-ordinal-per-prompt", "hunyuan_ocr", PromptBatch((ONE_IMAGE, ONE_IMAGE))),
    ("hunyuan3d-ordinal-per-prompt", "hunyuan_ocr_3d", PromptBatch((ONE_IMAGE, Prompt((Image((1, 4, 2)), Text(1)))))),
    # The delta is one constant of the whole prompt, not of its first prefill chunk (vllm#10403).
    ("vllm#10403-delta-whole-prompt", "qwen2_vl", _one(Text(4), Image((1, 8, 8)), Text(2))),
    # A position 0 is a position (rtp-llm#1213): an image opening the prompt, an XD-RoPE grid.
    ("rtp-llm#1213-image-first", "hunyuan_ocr", _one(Image((1, 4, 4)), Text(1))),
    ("image-first-mrope", "qwen2_vl", _one(Image((1, 4, 6)), Text(1))),
    ("video-first-qwen3", "qwen3_vl", _one(Video((2, 2, 2), timestamp_tokens=0))),
    # Negative deltas by construction (LightLLM#1147): a wide image.
    ("LightLLM#1147-negative-delta", "qwen2_vl", _one(Image((1, 8, 16)))),
    # Past 2048 positions: half precision holds integers exactly only that far.
    ("positions-past-2048", "qwen2_vl", _one(Text(4093), Image((1, 4, 4)), Text(2))),
    # Several images and videos in any order, left-padded batch.
    ("mixed-batch-left-padded", "qwen2_5_vl", PromptBatch(
        (Prompt((Image((1, 4, 2)), Text(1), Video((3, 2, 4), second_per_grid=0.5), Image((1, 2, 2)))),
         Prompt((Text(3), Video((2, 2, 2), second_per_grid=2.0)))), pads=(0, 4), side="left")),
    # Grids at the models' limits: Qwen2-VL's max_pixels 12845056 at patch 14 = 65,536 patches
    # (256 x 256 before the merge); a Qwen3-VL video of 24 frames.
    ("qwen2_vl-max-pixels", "qwen2_vl", _one(Text(1), Image((1, 256, 256)), Text(1))),
    ("qwen3_vl-long-video", "qwen3_vl", _one(Video((24, 16, 16), timestamp_tokens=3), Text(2))),
    # Qwen2.5-Omni with audio in video: the shared start / end tokens applied to an image as well, and
    # the audio bos / eos counted twice (vllm#16878).
    ("vllm#16878-image-beside-audio-in-video", "qwen2_5_omni",
     _one(Text(1), Image((1, 4, 4)), Text(1), Video((2, 4, 4), audio_frames=100), Text(1))),
    ("vllm#16878-bos-eos-once", "qwen2_5_omni", _one(Text(1), Video((2, 4, 4), audio_frames=100), Text(1))),
    # Audio takes text positions on every row, not T alone (mstar#196).
    ("mstar#196-audio-rows", "qwen3_omni", _one(Text(2), Audio(200), Text(1))),
    # The video's own seconds per grid, not the default the engine fell back to (fps 4 and 2).
    ("vllm#23056-spg-not-found", "qwen2_5_omni", _one(Video((3, 4, 4), second_per_grid=0.5), Text(1))),
    ("vllm-omni#5398-spg-not-found", "qwen3_omni", _one(Text(1), Video((3, 4, 4), second_per_grid=1.0), Text(1))),
    # Videos with and without audio in one prompt, the one without first (VeOmni#493).
    ("VeOmni#493-mixed-audio-videos", "qwen3_omni",
     _one(Video((2, 4, 4), second_per_grid=2.0), Text(1), Video((2, 4, 4), second_per_grid=2.0, audio_frames=200),
          Text(1))),
    # spg 4: a frame jumps two 50-wide chunks (transformers' one-chunk-per-token cut); a video taller
    # than its audio is long (the end tokens follow the last run, below the block's maximum).
    ("omni-chunk-jump", "qwen2_5_omni", _one(Video((3, 2, 2), second_per_grid=4.0, audio_frames=300), Text(1))),
    ("omni-last-run-qwen2_5", "qwen2_5_omni", _one(Text(1), Video((1, 40, 2), audio_frames=30), Text(1))),
    ("omni-last-run-qwen3", "qwen3_omni", _one(Text(1), Video((1, 40, 2), audio_frames=30), Text(1))),
    # ARC-Hunyuan-Video: every frame an image, T counting images and frames together.
    ("arc-frames-ordinal", "arc_hunyuan_video", _one(Text(1), Image((1, 4, 4)), Video((3, 4, 4)), Text(1))),
]


def _implementation(name: str, family: str):
    fn = get_position_ids_implementation(name)
    reason = unsupported_reason(name, fn, family)
    if reason:
        pytest.skip(reason)
    return fn


def _runnable(name: str, fn, family: str, batch: PromptBatch) -> PromptBatch | None:
    """The batch less the prompts ``fn`` says it cannot express (transformers' one
    use_audio_in_video flag per call), or None when none is left."""
    keep = [i for i, p in enumerate(batch.prompts) if not unsupported_reason(name, fn, family, p)]
    if not keep:
        return None
    return PromptBatch(tuple(batch.prompts[i] for i in keep), tuple(batch.pads[i] for i in keep), batch.side)


@pytest.mark.fixed_cases
@pytest.mark.parametrize("family, batch", [pytest.param(f, b, id=i) for i, f, b in KNOWN_BUG_PROMPTS])
def test_known_bug_prompts_match(position_ids_impl_name, family, batch):
    fn = _implementation(position_ids_impl_name, family)
    runnable = _runnable(position_ids_impl_name, fn, family, batch)
    if runnable is None:
        pytest.skip(unsupported_reason(position_ids_impl_name, fn, family, batch.prompts[0]))
    assert_matches(position_ids_impl_name, fn, family, runnable)


# A prompt may open with up to 2^17 text tokens: positions past any 16-bit slot and far past where
# fp16 or bf16 hold integers exactly.  The position step draws positions to 2^20 (its cost does not
# grow with them); here every token costs the reference and the implementation alike.
LONG_PROMPT = 1 << 17


@pytest.mark.parametrize("family", FAMILIES)
@settings(deadline=None)
@given(data=st.data())
def test_position_ids_match_reference(position_ids_impl_name, family, data):
    fn = _implementation(position_ids_impl_name, family)
    batch = _runnable(position_ids_impl_name, fn, family,
                      data.draw(batches(family=family, max_leading_text=LONG_PROMPT), label="batch"))
    assume(batch is not None)
    for key in assert_matches(position_ids_impl_name, fn, family, batch):
        event(f"known deviation: {key}")
