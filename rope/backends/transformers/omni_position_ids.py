"""transformers' Qwen2.5-Omni and Qwen3-Omni thinker ``get_rope_index`` driven from a prompt
description: the Omni half of the ``transformers`` position-id adapter (position_ids.py routes the
two families here).

The thinkers take token ids (no ``mm_token_type_ids``): the adapter writes the ids of the released
checkpoints (rope/backends/vocabulary.py), the image and video grids, ``second_per_grids`` (float32, as
the processor returns ``video_second_per_grid``), ``audio_seqlens`` (one feature length per audio,
stand-alone clips and videos' tracks, in token order) and ``use_audio_in_video``.  That flag is one
per call: a batch whose prompts differ runs as one call per flag value, and a prompt that mixes
videos with and without audio cannot be expressed (``unsupported_reason``; VeOmni#493 fixed it in its
own copy by deciding per video).  ``get_rope_index`` runs weight-free, unbound, on a dummy holding
the thinker config and the helpers it calls.  Qwen3-Omni returns float positions: the adapter
requires whole values (the reference only builds prompts whose offsets are whole) and returns int64.
"""

from __future__ import annotations

import functools
import importlib

import torch

from reference.position_ids import prompt_positions
from rope.backends.vocabulary import OMNI_CONFIG_KWARGS, PAD_TOKEN_ID, token_ids
from rope.prompts import Audio, Image, Prompt, PromptBatch, Video

MODELS = {
    "qwen2_5_omni": ("transformers.models.qwen2_5_omni.modeling_qwen2_5_omni",
                     "Qwen2_5OmniPreTrainedModelForConditionalGeneration",
                     "transformers.models.qwen2_5_omni.configuration_qwen2_5_omni", "Qwen2_5OmniThinkerConfig"),
    "qwen3_omni": ("transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe",
                   "Qwen3OmniMoePreTrainedModelForConditionalGeneration",
                   "transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe", "Qwen3OmniMoeThinkerConfig"),
}
HELPERS = ("get_rope_index", "get_llm_pos_ids_for_vision", "get_chunked_index")


def audio_in_video(prompt: Prompt) -> bool | None:
    """The prompt's ``use_audio_in_video``: True when every video has audio, False when none has,
    None when it has no video (either flag works)."""
    flags = {seg.audio_frames is not None for seg in prompt.segments if isinstance(seg, Video)}
    if len(flags) > 1:
        raise ValueError("prompt: mixes videos with and without audio (one use_audio_in_video per call)")
    return flags.pop() if flags else None


def unsupported_reason(family: str, prompt: Prompt | None) -> str | None:
    if prompt is None:
        return None
    try:
        audio_in_video(prompt)
    except ValueError:
        return ("transformers' get_rope_index takes one use_audio_in_video flag per call: a prompt mixing videos "
                "with and without audio cannot be expressed (VeOmni#493 decides per video in its own copy)")
    return None


@functools.lru_cache(maxsize=None)
def _model(family: str, spatial_merge_size: int):
    """(bound get_rope_index, config) on a dummy object: no weights, no download."""
    module, cls, config_module, config_cls = MODELS[family]
    model_cls = getattr(importlib.import_module(module), cls)
    config = getattr(importlib.import_module(config_module), config_cls)(**OMNI_CONFIG_KWARGS[family])
    config.vision_config.spatial_merge_size = spatial_merge_size
    dummy = type(f"Dummy{cls}", (), {name: getattr(model_cls, name) for name in HELPERS})()
    dummy.config = config
    dummy.spatial_merge_size = spatial_merge_size
    return dummy.get_rope_index, config


def _whole(what: str, value: torch.Tensor) -> torch.Tensor:
    """An integer tensor of ``value`` (Qwen3-Omni's float ids), refusing a fraction."""
    if value.is_floating_point():
        if not torch.equal(value, value.round()):
            raise ValueError(f"transformers get_rope_index: {what} has fractional values; the harness compares whole ids")
        value = value.round()
    return value.to(torch.int64)


def _call(family: str, prompts: list[Prompt], pads: list[int], side: str, flag: bool):
    get_rope_index, config = _model(family, prompts[0].spatial_merge_size)
    refs = [prompt_positions(family, p) for p in prompts]
    width = max(r.length + pad for r, pad in zip(refs, pads))
    ids = torch.full((len(refs), width), PAD_TOKEN_ID, dtype=torch.int64)
    mask = torch.zeros((len(refs), width), dtype=torch.int64)
    columns = []
    for b, ref in enumerate(refs):
        start = width - ref.length - pads[b] if side == "left" else pads[b]
        cols = torch.arange(start, start + ref.length)
        ids[b, cols] = torch.tensor(token_ids(family, config, ref.roles))
        mask[b, cols] = 1
        columns.append(cols)
    segments = [s for p in prompts for s in p.segments]
    images = [s.grid_thw for s in segments if isinstance(s, Image)]
    videos = [s for s in segments if isinstance(s, Video)]
    audio = [s.frames if isinstance(s, Audio) else s.audio_frames for s in segments
             if isinstance(s, Audio) or (isinstance(s, Video) and s.audio_frames is not None)]
    position_ids, deltas = get_rope_index(
        input_ids=ids, attention_mask=mask, use_audio_in_video=flag,
        image_grid_thw=torch.tensor(images, dtype=torch.int64) if images else None,
        video_grid_thw=torch.tensor([v.grid_thw for v in videos], dtype=torch.int64) if videos else None,
        second_per_grids=torch.tensor([v.second_per_grid for v in videos], dtype=torch.float32) if videos else None,
        audio_seqlens=torch.tensor(audio, dtype=torch.int64) if audio else None)
    if tuple(position_ids.shape) != (3, len(refs), width):
        raise ValueError(f"transformers {MODELS[family][1]}.get_rope_index: position_ids shape "
                         f"{tuple(position_ids.shape)}, expected {(3, len(refs), width)}")
    deltas = _whole("delta", deltas.reshape(len(refs), -1)[:, 0])
    return [(_whole("position_ids", position_ids[:, b, cols]), int(deltas[b])) for b, cols in enumerate(columns)]


def calls(batch: PromptBatch) -> list[tuple[bool, list[int]]]:
    """(use_audio_in_video, indices of the prompts) of each call a batch runs as."""
    flags = [bool(audio_in_video(p)) for p in batch.prompts]
    return [(flag, [i for i, f in enumerate(flags) if f == flag]) for flag in sorted(set(flags))]


def omni_batch(family: str, batch: PromptBatch) -> list[tuple[torch.Tensor, int]]:
    """Per prompt (positions [3, L_i], delta): one call per ``use_audio_in_video`` value."""
    out: list = [None] * len(batch.prompts)
    for flag, index in calls(batch):
        results = _call(family, [batch.prompts[i] for i in index], [batch.pads[i] for i in index], batch.side, flag)
        for i, result in zip(index, results):
            out[i] = result
    return out


def pad_fill_deltas(family: str, batch: PromptBatch) -> dict[int, int]:
    """{prompt index: the delta transformers returns} where its pad fill enters the delta.

    A call with no image or video grid takes get_rope_index's text branch: positions are the
    mask's cumsum - 1 with pad columns set to 1, and delta = row maximum + 1 - real tokens.  A
    row with a pad column and a one-token prompt (maximum 0) so gets delta 1 instead of 0.
    """
    out = {}
    for _, index in calls(batch):
        prompts = [batch.prompts[i] for i in index]
        if any(isinstance(s, (Image, Video)) for p in prompts for s in p.segments):
            continue
        lengths = [prompt_positions(family, p).length for p in prompts]
        width = max(n + batch.pads[i] for i, n in zip(index, lengths))
        for i, n in zip(index, lengths):
            if width > n and n - 1 < 1:
                out[i] = 1 + 1 - n
    return out
