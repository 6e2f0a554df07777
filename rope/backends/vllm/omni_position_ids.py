"""vLLM's Qwen2.5-Omni and Qwen3-Omni thinkers' ``get_mrope_input_positions`` driven from a prompt
description: the Omni half of the ``vllm`` position-id adapter (position_ids.py routes the two
families here; read on vllm 0.33.0).

The method never reads token ids: only the prompt's length and, per item, its placeholder offset
and processed fields.  The adapter hands over what vLLM's multimodal processor produces (run
offline on both models to confirm it): an image or a plain video is ``image_grid_thw`` /
``video_grid_thw`` (int64), ``second_per_grid_ts`` (float32; the processor copies the HF
processor's ``video_second_per_grid`` there) and ``use_audio_in_video`` (one bool shared by every
video of the request), at the offset of its first placeholder token; a stand-alone audio clip is
``audio_feature_lengths`` (its feature frames) at its first audio token; a video with its audio
is two items, the video and the audio, over one range that starts at ``<|audio_bos|>`` and ends at
``<|audio_eos|>``.  The processor refuses a request that mixes stand-alone audio with audio in
video, and the flag is one per request: such prompts are ``unsupported_reason``.

Known departures (``known_deviations``, docs/findings.md): Qwen2.5-Omni's interleaved positions are
written from that range's offset, the ``<|audio_bos|>`` token, one token early, and the four markup
tokens around the block (and its last placeholder) are text, where the model shares one position
between both start tokens and between both end tokens: every token after such a block sits 2
further on; its interleave groups frames by their true chunk where transformers' cuts at most once
per token (they differ above 2 seconds per grid); and in both families the tokens after a video
with audio continue past the whole block's maximum, where transformers continues past its last
run's.
"""

from __future__ import annotations

import functools
import importlib

import torch

from reference.position_ids import audio_tokens, llm_grid, prompt_positions
from rope.backends import require
from rope.backends.vocabulary import OMNI_CONFIG_KWARGS
from rope.prompts import Audio, Image, KnownDeviation, Prompt, PromptBatch, Text, Video

_INSTALL = ("pip install vllm; on a CPU box scripts/vllm_cpu_env.sh (its own venv): see "
            "docs/implementations.md, \"Serving engines' own code as implementations\"")
_inputs = require("vllm.multimodal.inputs", distribution="vllm", install=_INSTALL)

MODELS = {
    "qwen2_5_omni": ("qwen2_5_omni_thinker", "Qwen2_5OmniThinkerForConditionalGeneration",
                     "transformers.models.qwen2_5_omni.configuration_qwen2_5_omni", "Qwen2_5OmniThinkerConfig"),
    "qwen3_omni": ("qwen3_omni_moe_thinker", "Qwen3OmniMoeThinkerForConditionalGeneration",
                   "transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe", "Qwen3OmniMoeThinkerConfig"),
}
AUDIO_IN_VIDEO_SHIFT = "audio_in_video_markup_as_text"
AFTER_BLOCK_MAX = "after_audio_in_video_block_max"
INTERLEAVE_BY_TIME = "interleave_by_true_chunk"
CHUNK = 50                                           # Qwen2.5-Omni: 25 units a second x 2 s
REASONS = {
    INTERLEAVE_BY_TIME: (
        "known mismatch: vLLM's Qwen2.5-Omni groups a video's frames by their true 2-second chunk (offset // 50, "
        "empty chunks skipped) and follows each group with the next 50 audio tokens, where transformers' "
        "get_chunked_index cuts at most once per token and pairs the j-th video chunk with the j-th 50 audio "
        "tokens: the orders differ once a frame step passes 50 (seconds per grid above 2) (read on vllm 0.33.0)"),
    AUDIO_IN_VIDEO_SHIFT: (
        "known mismatch: vLLM's Qwen2.5-Omni get_mrope_input_positions writes a video-with-audio block's interleaved "
        "positions from its placeholder offset, the <|audio_bos|> token (one token early), and gives <|vision_bos|>, "
        "<|audio_bos|>, the block's last placeholder, <|audio_eos|> and <|vision_eos|> text positions, where the "
        "model shares one position between both start tokens and between both end tokens: everything after the "
        "block sits 2 further on (read on vllm 0.33.0)"),
    AFTER_BLOCK_MAX: (
        "known mismatch: vLLM's Omni get_mrope_input_positions continues after a video-with-audio block one past "
        "the whole block's maximum; transformers' (the reference) one past the maximum of the block's last run, "
        "lower when the video's spatial rows outrun the audio of that run (read on vllm 0.33.0)"),
}


def family_unavailable(family: str) -> str | None:
    try:
        importlib.import_module(f"vllm.model_executor.models.{MODELS[family][0]}")
    except ImportError as exc:
        return f"this vLLM has no {MODELS[family][1]} ({exc})"
    return None


def unsupported_reason(family: str, prompt: Prompt | None) -> str | None:
    if prompt is None:
        return None
    videos = [s for s in prompt.segments if isinstance(s, Video)]
    flags = {v.audio_frames is not None for v in videos}
    if len(flags) > 1:
        return "vLLM takes one use_audio_in_video per request: a prompt mixing videos with and without audio"
    if flags == {True} and any(isinstance(s, Audio) for s in prompt.segments):
        return "vLLM's processor refuses stand-alone audio beside audio in video (one audio item per video)"
    return None


@functools.lru_cache(maxsize=None)
def _model(family: str, spatial_merge_size: int):
    module, cls, config_module, config_cls = MODELS[family]
    model = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), cls)
    config = getattr(importlib.import_module(config_module), config_cls)(**OMNI_CONFIG_KWARGS[family])
    config.vision_config.spatial_merge_size = spatial_merge_size
    stub = object.__new__(model)               # an nn.Module never initialised: plain attributes
    stub.__dict__["config"] = config
    return stub


def _elem(modality: str, key: str, value: torch.Tensor, shared: bool = False):
    """One item's field, cut as the thinker's field config cuts the processor's output."""
    if shared:
        return _inputs.MultiModalFieldConfig.shared(modality, 1, keep_on_cpu=True).build_elems(key, value)[0]
    return _inputs.MultiModalFieldConfig.batched(modality, keep_on_cpu=True).build_elems(key, value.unsqueeze(0))[0]


def _feature(modality: str, data: dict, offset: int, length: int, n: int, is_embed=None):
    return _inputs.MultiModalFeatureSpec(
        data=_inputs.MultiModalKwargsItem(data), modality=modality, identifier=f"{modality}-{n}",
        mm_position=_inputs.PlaceholderRange(offset=offset, length=length, is_embed=is_embed))


def omni_features(family: str, prompt: Prompt, modality: list[int]) -> list:
    """The features vLLM's processor hands over for ``prompt`` (module docstring), in prompt order."""
    in_video = any(isinstance(s, Video) and s.audio_frames is not None for s in prompt.segments)
    kinds = torch.tensor(modality)
    features, start = [], 0
    for n, seg in enumerate(prompt.segments):
        if isinstance(seg, Text):
            start += seg.length
            continue
        if isinstance(seg, Audio):
            count = audio_tokens(family, seg.frames)
            data = {"audio_feature_lengths": _elem("audio", "audio_feature_lengths", torch.tensor(seg.frames))}
            features.append(_feature("audio", data, start + 1, count, n))
            start += count + 2
            continue
        t, h, w = llm_grid(seg.grid_thw, prompt.spatial_merge_size)
        if isinstance(seg, Image):
            data = {"image_grid_thw": _elem("image", "image_grid_thw", torch.tensor(seg.grid_thw))}
            features.append(_feature("image", data, start + 1, h * w, n))
            start += h * w + 2
            continue
        data = {"video_grid_thw": _elem("video", "video_grid_thw", torch.tensor(seg.grid_thw)),
                "second_per_grid_ts": _elem("video", "second_per_grid_ts",
                                            torch.tensor(seg.second_per_grid, dtype=torch.float32)),
                "use_audio_in_video": _elem("video", "use_audio_in_video", torch.tensor(in_video), shared=True)}
        if seg.audio_frames is None:
            features.append(_feature("video", data, start + 1, t * h * w, n))
            start += t * h * w + 2
            continue
        count = audio_tokens(family, seg.audio_frames)
        length = t * h * w + count + 2                   # <|audio_bos|> ... <|audio_eos|>
        span = kinds[start + 1:start + 1 + length]
        audio = {"audio_feature_lengths": _elem("audio", "audio_feature_lengths", torch.tensor(seg.audio_frames))}
        features.append(_feature("video", data, start + 1, length, n, is_embed=span == 2))
        features.append(_feature("audio", audio, start + 1, length, n, is_embed=span == 3))
        start += length + 2
    return features


def omni_positions(family: str, prompt: Prompt):
    ref = prompt_positions(family, prompt)
    stub = _model(family, prompt.spatial_merge_size)
    positions, delta = stub.get_mrope_input_positions([0] * ref.length,
                                                      omni_features(family, prompt, ref.modality.tolist()))
    return torch.as_tensor(positions).to(torch.int64), int(delta)


def _vllm_interleave(stream: torch.Tensor, roles, st: int) -> torch.Tensor:
    """A Qwen2.5-Omni video-with-audio block's values in vLLM's order: the frames grouped by their
    true 50-unit chunk (offset // 50), empty chunks skipped; after each group the next (up to) 50
    audio tokens; then the audio left over."""
    video = [i for i, r in enumerate(roles) if r == "video"]
    audio = [i for i, r in enumerate(roles) if r == "audio"]
    groups: dict[int, list[int]] = {}
    for i in video:                                  # t-major: a chunk's tokens stay in order
        groups.setdefault((int(stream[0, i]) - st) // CHUNK, []).append(i)
    order, used = [], 0
    for chunk in sorted(groups):
        order += groups[chunk]
        order += audio[used:used + CHUNK]
        used = min(len(audio), used + CHUNK)
    order += audio[used:]
    return stream[:, order]


def pinned_value(family: str, prompt: Prompt) -> tuple[torch.Tensor, int, tuple[str, ...]] | None:
    """vLLM 0.33.0's ids where a video with audio makes it depart from the reference, and the keys
    of the departures; None where it does not depart.

    Replays the reference's token sequence by vLLM's rules: text takes the previous piece's maximum
    + 1 on every row; a vision block keeps the reference's shape, moved to start there; a video
    with audio keeps its interleaved values, and the next token continues one past the *whole*
    block's maximum (the reference: past its last run's).  Qwen2.5-Omni: the interleaved values
    (same start, one past <|vision_bos|>) are written from the <|audio_bos|> token on, and the
    tokens from the block's last placeholder to <|vision_eos|> are text.  Qwen3-Omni: the markup
    tokens are text around the interleaved values, as in the reference.
    """
    if not any(isinstance(s, Video) and s.audio_frames is not None for s in prompt.segments):
        return None
    ref = prompt_positions(family, prompt)
    roles, pos = ref.roles, ref.positions
    out = torch.empty_like(pos)
    top, k, keys = -1, 0, set()
    while k < ref.length:
        role = roles[k]
        if role == "audio_start" and roles[k - 1] == "vision_start":
            end = roles.index("audio_end", k)
            stream = pos[:, k + 1:end]
            if family == "qwen2_5_omni":             # one token early; the last placeholder on is text
                base = int(pos[0, k - 1]) + 1
                ordered = _vllm_interleave(stream, roles[k + 1:end], base)
                if not torch.equal(ordered, stream):
                    keys.add(INTERLEAVE_BY_TIME)
                out[:, k:end - 1] = ordered - base + top + 1
                keys.add(AUDIO_IN_VIDEO_SHIFT)
                resume = end - 1
            else:
                top += 1
                out[:, k] = top
                base = int(pos[0, k]) + 1
                out[:, k + 1:end] = stream - base + top + 1
                resume = end
            block_top = int(stream.max()) - base + top + 1
            if int(pos[0, end]) != int(stream.max()) + 1:
                keys.add(AFTER_BLOCK_MAX)            # the reference resumed below the block's maximum
            top = max(top, block_top)
            for j in range(resume, end + 2):             # text: (2.5: the last placeholder), both end tokens
                top += 1
                out[:, j] = top
            k = end + 2
            continue
        if role in ("image", "video"):
            end = k
            while end < ref.length and roles[end] == role:
                end += 1
            base = int(pos[0, k - 1]) + 1
            out[:, k:end] = pos[:, k:end] - base + top + 1
            top = int(out[:, k:end].max())
            k = end
            continue
        top += 1
        out[:, k] = top
        k += 1
    if not keys:
        return None
    return out, int(out.max()) + 1 - ref.length, tuple(sorted(keys))


def known_deviations(family: str, batch: PromptBatch) -> list[KnownDeviation | None]:
    if family not in MODELS:
        return [None] * len(batch.prompts)
    out = []
    for prompt in batch.prompts:
        pinned = pinned_value(family, prompt)
        out.append(None if pinned is None else KnownDeviation(
            pinned[0], pinned[1], pinned[2], "; ".join(REASONS[key] for key in pinned[2])))
    return out
