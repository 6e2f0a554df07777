"""The position ids' fixed cases: a prompt for every position-id bug this field has shipped, and for the
models' grid limits (a case module: properties/position_ids/test_position_ids.py and the project's
tests use them)."""

from __future__ import annotations

from rope.prompts import Audio, Image, Prompt, PromptBatch, Text, Video


def one_prompt(*segments, merge: int = 2) -> PromptBatch:
    return PromptBatch((Prompt(tuple(segments), spatial_merge_size=merge),))


ONE_IMAGE = Prompt((Text(1), Image((1, 2, 4))))
# (id, family, batch): the upstream report each prompt reproduces, where one exists.
KNOWN_BUG_PROMPTS = [
    # Seconds per grid below one (fps 4 and 8) cut to an int: every frame at T = base.
    ("transformers#48669-fps4", "qwen2_5_vl", one_prompt(Video((2, 4, 4), second_per_grid=0.5), Text(1))),
    ("lmms-eval#1393-fps8", "qwen2_5_vl", one_prompt(Text(2), Video((4, 4, 4), second_per_grid=0.25), Text(1))),
    ("fractional-1.5s", "qwen2_5_vl", one_prompt(Video((3, 2, 2), second_per_grid=1.5), Text(1))),
    # Merge size and temporal patch size conflated (vllm#37439): only a merge size other than 2 shows it.
    ("vllm#37439-merge1", "qwen2_vl", one_prompt(Text(1), Image((1, 2, 4)), Text(1), merge=1)),
    ("vllm#37439-merge4", "qwen3_vl", one_prompt(Text(1), Video((2, 8, 4), timestamp_tokens=2), Text(1), merge=4)),
    # Qwen3-VL / GLM videos are one grid per frame with text between frames.
    ("transformers#44474-qwen3-frames", "qwen3_vl", one_prompt(Text(1), Video((3, 4, 4), timestamp_tokens=2), Text(1))),
    ("glm4v-frame-groups", "glm4v", one_prompt(Text(1), Video((3, 4, 4), timestamp_tokens=1), Text(2))),
    # GLM video tokens taken for text.
    ("vllm#33039-glm-video-as-text", "glm4v", one_prompt(Text(1), Video((2, 4, 4)), Text(1))),
    # Text after a video whose temporal span outruns its spatial one.
    ("transformers-5.3-text-after-long-video", "qwen2_5_vl",
     one_prompt(Text(1), Video((4, 4, 4), second_per_grid=2.0), Text(3))),
    ("qwen2_vl-text-after-long-video", "qwen2_vl", one_prompt(Video((3, 2, 2)), Text(1))),
    # HunYuanVL's image ordinal per prompt, not per batch (3 and 4 rows).
    ("hunyuan-ordinal-per-prompt", "hunyuan_ocr", PromptBatch((ONE_IMAGE, ONE_IMAGE))),
    ("hunyuan3d-ordinal-per-prompt", "hunyuan_ocr_3d", PromptBatch((ONE_IMAGE, Prompt((Image((1, 4, 2)), Text(1)))))),
    # A lone image after six in the prompt before it: an ordinal carried across the batch past the prompt's
    # last position changes a delta computed as max + 1 - L.
    ("hunyuan-ordinal-past-the-prompt", "hunyuan_ocr", PromptBatch((
        Prompt(tuple(Image((1, 2, 2)) for _ in range(6))), Prompt((Image((1, 2, 2)),))))),
    # The delta is one constant of the whole prompt, not of its first prefill chunk (vllm#10403).
    ("vllm#10403-delta-whole-prompt", "qwen2_vl", one_prompt(Text(4), Image((1, 8, 8)), Text(2))),
    # A position 0 is a position (rtp-llm#1213): an image opening the prompt, an XD-RoPE grid.
    ("rtp-llm#1213-image-first", "hunyuan_ocr", one_prompt(Image((1, 4, 4)), Text(1))),
    ("image-first-mrope", "qwen2_vl", one_prompt(Image((1, 4, 6)), Text(1))),
    ("video-first-qwen3", "qwen3_vl", one_prompt(Video((2, 2, 2), timestamp_tokens=0))),
    # Negative deltas by construction (LightLLM#1147): a wide image.
    ("LightLLM#1147-negative-delta", "qwen2_vl", one_prompt(Image((1, 8, 16)))),
    # Past 2048 positions: half precision holds integers exactly only that far.
    ("positions-past-2048", "qwen2_vl", one_prompt(Text(4093), Image((1, 4, 4)), Text(2))),
    # Several images and videos in any order, left-padded batch.
    ("mixed-batch-left-padded", "qwen2_5_vl", PromptBatch(
        (Prompt((Image((1, 4, 2)), Text(1), Video((3, 2, 4), second_per_grid=0.5), Image((1, 2, 2)))),
         Prompt((Text(3), Video((2, 2, 2), second_per_grid=2.0)))), pads=(0, 4), side="left")),
    # Grids at the models' limits: Qwen2-VL's max_pixels 12845056 at patch 14 = 65,536 patches
    # (256 x 256 before the merge); a Qwen3-VL video of 24 frames.
    ("qwen2_vl-max-pixels", "qwen2_vl", one_prompt(Text(1), Image((1, 256, 256)), Text(1))),
    ("qwen3_vl-long-video", "qwen3_vl", one_prompt(Video((24, 16, 16), timestamp_tokens=3), Text(2))),
    # Qwen2.5-Omni with audio in video: the shared start / end tokens applied to an image as well, and
    # the audio bos / eos counted twice (vllm#16878).
    ("vllm#16878-image-beside-audio-in-video", "qwen2_5_omni",
     one_prompt(Text(1), Image((1, 4, 4)), Text(1), Video((2, 4, 4), audio_frames=100), Text(1))),
    ("vllm#16878-bos-eos-once", "qwen2_5_omni", one_prompt(Text(1), Video((2, 4, 4), audio_frames=100), Text(1))),
    # Audio takes text positions on every row, not T alone (mstar#196).
    ("mstar#196-audio-rows", "qwen3_omni", one_prompt(Text(2), Audio(200), Text(1))),
    # The video's own seconds per grid, not the default the engine fell back to (fps 4 and 2).
    ("vllm#23056-spg-not-found", "qwen2_5_omni", one_prompt(Video((3, 4, 4), second_per_grid=0.5), Text(1))),
    ("vllm-omni#5398-spg-not-found", "qwen3_omni", one_prompt(Text(1), Video((3, 4, 4), second_per_grid=1.0), Text(1))),
    # Videos with and without audio in one prompt, the one without first (VeOmni#493).
    ("VeOmni#493-mixed-audio-videos", "qwen3_omni",
     one_prompt(Video((2, 4, 4), second_per_grid=2.0), Text(1), Video((2, 4, 4), second_per_grid=2.0, audio_frames=200),
          Text(1))),
    # spg 4: a frame jumps two 50-wide chunks (transformers' one-chunk-per-token cut); a video taller
    # than its audio is long (the end tokens follow the last run, below the block's maximum).
    ("omni-chunk-jump", "qwen2_5_omni", one_prompt(Video((3, 2, 2), second_per_grid=4.0, audio_frames=300), Text(1))),
    ("omni-last-run-qwen2_5", "qwen2_5_omni", one_prompt(Text(1), Video((1, 40, 2), audio_frames=30), Text(1))),
    ("omni-last-run-qwen3", "qwen3_omni", one_prompt(Text(1), Video((1, 40, 2), audio_frames=30), Text(1))),
    # ARC-Hunyuan-Video: every frame an image, T counting images and frames together.
    ("arc-frames-ordinal", "arc_hunyuan_video", one_prompt(Text(1), Image((1, 4, 4)), Video((3, 4, 4)), Text(1))),
]
