"""What a family's processor writes for each role of ``reference.prompt_positions(...).roles``:
the token id sources, shared by the adapters that build an engine's inputs from a prompt
description (transformers, vLLM), and the text config of the HunyuanOCR variants.

A source is a config attribute (read from the family's default transformers config, so the ids are
the checkpoints') or a literal id.  Text and timestamp tokens are any ordinary ids.
"""

from __future__ import annotations

TEXT_TOKEN_ID, TIMESTAMP_TOKEN_ID, PAD_TOKEN_ID = 1000, 27, 0

_QWEN = (("vision_start", "vision_start_token_id"), ("vision_end", "vision_end_token_id"),
         ("image", "image_token_id"), ("video", "video_token_id"))
# GLM writes video frames with the image token; the modality (mm_token_type_ids) still says video.
_GLM = (("vision_start", "image_start_token_id"), ("vision_end", "image_end_token_id"),
        ("video_start", "video_start_token_id"), ("video_end", "video_end_token_id"),
        ("image", "image_token_id"), ("video", "image_token_id"))
# HunyuanOCR: <image_start>/<image_end> ids live in the tokenizer, not the config: any distinct ids do.
_HUNYUAN = (("vision_start", 120118), ("vision_end", 120119), ("image", "image_token_id"))

# Omni thinkers: every id from the config (omni_config_kwargs sets the ones the config class lacks).
_OMNI = (*_QWEN, ("audio_start", "audio_start_token_id"), ("audio_end", "audio_end_token_id"),
         ("audio", "audio_token_id"))

TOKEN_SOURCES = {"qwen2_vl": _QWEN, "qwen2_5_vl": _QWEN, "qwen3_vl": _QWEN, "glm4v": _GLM,
                 "hunyuan_ocr": _HUNYUAN, "hunyuan_ocr_3d": _HUNYUAN,
                 "qwen2_5_omni": _OMNI, "qwen3_omni": _OMNI}
# HunyuanOCR: head_dim 128, xdrope_section [16]*4 (P, W, H, T); the 3-row variant [16, 24, 24].
HUNYUAN_SECTIONS = {"hunyuan_ocr": (16, 16, 16, 16), "hunyuan_ocr_3d": (16, 24, 24)}


def hunyuan_config_kwargs(family: str) -> dict:
    """HunYuanVLConfig keyword arguments for a HunyuanOCR variant (rows from its sections)."""
    return {"text_config": {"head_dim": 128, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(HUNYUAN_SECTIONS[family])}}}


# The released checkpoints' thinker configs: Qwen2.5-Omni-7B and Qwen3-Omni-30B-A3B carry the vision
# start / end ids their config classes do not declare; Qwen3-Omni's audio ids and its
# position_id_per_seconds (13) differ from the class defaults (151647 / 151646, 25).
_VISION_IDS = {"vision_start_token_id": 151652, "vision_end_token_id": 151653}
OMNI_CONFIG_KWARGS = {
    "qwen2_5_omni": dict(_VISION_IDS),
    "qwen3_omni": {**_VISION_IDS, "audio_start_token_id": 151669, "audio_end_token_id": 151670,
                   "audio_token_id": 151675, "position_id_per_seconds": 13},
}


def token_ids(family: str, config, roles) -> list[int]:
    """The token id of each role in the family's vocabulary (``config``: its transformers config)."""
    ids = {"text": TEXT_TOKEN_ID, "timestamp": TIMESTAMP_TOKEN_ID}
    for role, source in TOKEN_SOURCES[family]:
        ids[role] = source if isinstance(source, int) else getattr(config, source)
    return [ids[r] for r in roles]
