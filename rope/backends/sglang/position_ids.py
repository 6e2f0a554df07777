"""SGLang's M-RoPE position ids as a position-id implementation (registry name ``sglang``).

Drives the static methods SGLang's multimodal processors call (read on sglang 0.5.23,
``sglang/srt/layers/rotary_embedding/mrope.py`` and ``mrope_rope_index.py``):

* qwen2_vl, qwen2_5_vl, qwen3_vl -> ``MRotaryEmbedding.get_rope_index(spatial_merge_size,
  image_token_id, video_token_id, vision_start_token_id, model_type, tokens_per_second, input_ids,
  image_grid_thw, video_grid_thw, second_per_grid_ts)`` with ``model_type`` the family name.  It
  takes ``input_ids [B, L]`` but no attention mask (a pad would count as text), and SGLang's
  processors call it with one unpadded request; so the adapter runs the prompts of a batch one at
  a time, each as ``[1, L_i]``.
* glm4v -> ``MRotaryEmbedding.get_rope_index_glm4v(input_ids, hf_config, image_grid_thw,
  video_grid_thw, attention_mask)``: masked, so a batch goes in as one padded call.

SGLang 0.5.23 has no HunyuanOCR model or processor and no XD-RoPE position ids: the two
XD-RoPE families are not declared.

The prompt description becomes what the model's HF processor produces: ``input_ids`` with the
checkpoints' special token ids (``reference.prompt_positions(...).roles``), the grids before the
merge, and for Qwen2.5-VL ``second_per_grid_ts`` as the float32 tensor the processor returns
(SGLang then forms ``ti * spg * tokens_per_second`` in float32; tokens_per_second = 2 as in the
released checkpoints).  Qwen3-VL / GLM per-frame timestamps are ordinary text tokens.

Known departures (``known_deviations``, decided from the batch description): in a padded batch GLM's
delta is taken against the padded row (the prompt's delta less its row's pad columns), and in a
text-only batch the pad columns' fill value 1 enters the row maximum; positions are unaffected.
"""

from __future__ import annotations

import importlib.metadata
import os
import types

import torch

from reference.position_ids import prompt_positions
from rope.prompts import QWEN2_5_VL_TOKENS_PER_SECOND, Image, Prompt, Text, Video
from rope.backends import require
from rope.prompts import KnownDeviation, PromptBatch
from rope.backends.vocabulary import PAD_TOKEN_ID, TEXT_TOKEN_ID, TIMESTAMP_TOKEN_ID

# SGLang's own switch for a GPU-less host (as rope/backends/sglang/rotation.py): without it the rotary
# package reaches for CUDA ops at import.
if not torch.cuda.is_available():
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
_mrope = require("sglang.srt.layers.rotary_embedding.mrope", distribution="sglang",
                 install="pip install sglang; on a CPU box scripts/sglang_cpu_site.sh (PYTHONPATH=SITE): see "
                         "docs/implementations.md, \"Serving engines' own code as implementations\"")
MRotaryEmbedding = _mrope.MRotaryEmbedding
try:
    SGLANG_VERSION = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:      # a source checkout on the path
    SGLANG_VERSION = "unknown"
NEWEST_VERSION_READ = "0.5.23"

MROPE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v")

# The released checkpoints' config ids (= transformers' default configs).  Qwen2-VL, Qwen2.5-VL and
# Qwen3-VL share one vocabulary.
QWEN_IDS = {"vision_start": 151652, "vision_end": 151653, "image": 151655, "video": 151656}
# GLM-4.1V: <|begin_of_image|> 151339, <|end_of_image|> 151340, <|begin_of_video|> 151341,
# <|end_of_video|> 151342, <|image|> 151343.  Video frames are written with the image token; SGLang
# tells them from images by the enclosing begin/end of video (video_token_id 151344 is never used).
GLM_IMAGE_TOKEN_ID, GLM_VIDEO_START_TOKEN_ID, GLM_VIDEO_END_TOKEN_ID = 151343, 151341, 151342
GLM_IDS = {"vision_start": 151339, "vision_end": 151340, "video_start": GLM_VIDEO_START_TOKEN_ID,
           "video_end": GLM_VIDEO_END_TOKEN_ID, "image": GLM_IMAGE_TOKEN_ID, "video": GLM_IMAGE_TOKEN_ID}


def token_ids(family: str, roles) -> list[int]:
    """The token id of each role (``reference.ROLES``) in the family's vocabulary."""
    ids = {"text": TEXT_TOKEN_ID, "timestamp": TIMESTAMP_TOKEN_ID, **(GLM_IDS if family == "glm4v" else QWEN_IDS)}
    return [ids[r] for r in roles]


def _grids(prompts, kind) -> torch.Tensor | None:
    grids = [s.grid_thw for p in prompts for s in p.segments if isinstance(s, kind)]
    return torch.tensor(grids, dtype=torch.int64) if grids else None


def _qwen(family: str, prompt: Prompt) -> tuple[torch.Tensor, int]:
    """``MRotaryEmbedding.get_rope_index`` on one unpadded prompt ``[1, L]``."""
    ref = prompt_positions(family, prompt)
    videos = [s for s in prompt.segments if isinstance(s, Video)]
    # Only the Qwen2.5-VL processor emits second_per_grid_ts (a float32 tensor, one per video).
    spg = (torch.tensor([v.second_per_grid for v in videos], dtype=torch.float32)
           if family == "qwen2_5_vl" and videos else None)
    positions, deltas = MRotaryEmbedding.get_rope_index(
        spatial_merge_size=prompt.spatial_merge_size,
        image_token_id=QWEN_IDS["image"],
        video_token_id=QWEN_IDS["video"],
        vision_start_token_id=QWEN_IDS["vision_start"],
        model_type=family,                      # SGLang's model_type strings are the family names
        tokens_per_second=QWEN2_5_VL_TOKENS_PER_SECOND if family == "qwen2_5_vl" else None,
        input_ids=torch.tensor([token_ids(family, ref.roles)], dtype=torch.int64),
        image_grid_thw=_grids((prompt,), Image),
        video_grid_thw=_grids((prompt,), Video),
        second_per_grid_ts=spg,
    )
    return positions[:, 0, :], int(deltas.reshape(-1)[0].item())


def _glm_layout(batch: PromptBatch):
    """(input_ids, attention_mask, columns of each prompt) of ``batch`` padded on its side."""
    refs = [prompt_positions("glm4v", p) for p in batch.prompts]
    width = max(r.length + pad for r, pad in zip(refs, batch.pads))
    ids = torch.full((len(refs), width), PAD_TOKEN_ID, dtype=torch.int64)
    mask = torch.zeros((len(refs), width), dtype=torch.int64)
    columns = []
    for b, ref in enumerate(refs):
        start = width - ref.length - batch.pads[b] if batch.side == "left" else batch.pads[b]
        cols = torch.arange(start, start + ref.length)
        ids[b, cols] = torch.tensor(token_ids("glm4v", ref.roles))
        mask[b, cols] = 1
        columns.append(cols)
    return ids, mask, columns


def _glm(batch: PromptBatch) -> list[tuple[torch.Tensor, int]]:
    """``MRotaryEmbedding.get_rope_index_glm4v`` on the padded batch in one call."""
    ids, mask, columns = _glm_layout(batch)
    # The attributes get_rope_index_glm4v reads from the HF config, nothing else.
    hf_config = types.SimpleNamespace(
        image_token_id=GLM_IMAGE_TOKEN_ID, video_start_token_id=GLM_VIDEO_START_TOKEN_ID,
        video_end_token_id=GLM_VIDEO_END_TOKEN_ID,
        vision_config=types.SimpleNamespace(spatial_merge_size=batch.prompts[0].spatial_merge_size))
    positions, deltas = MRotaryEmbedding.get_rope_index_glm4v(
        input_ids=ids, hf_config=hf_config, image_grid_thw=_grids(batch.prompts, Image),
        video_grid_thw=_grids(batch.prompts, Video), attention_mask=mask)
    deltas = deltas.reshape(len(columns), -1)
    # Pad columns (mask 0) are outside the description and dropped.
    return [(positions[:, b, cols], int(deltas[b, 0].item())) for b, cols in enumerate(columns)]


def _batch(family: str, batch: PromptBatch) -> list[tuple[torch.Tensor, int]]:
    if family == "glm4v":
        return _glm(batch)
    return [_qwen(family, p) for p in batch.prompts]    # no mask: one request at a time, as SGLang does


def position_ids_sglang(family: str, prompt: Prompt):
    """SGLang's position ids for one prompt (no padding)."""
    return _batch(family, PromptBatch((prompt,)))[0]


# ------------------------------------------------------------------------------- known departures
# Both are in get_rope_index_glm4v's delta only (positions agree), and only in a padded batch, a path
# SGLang's own GLM processor never takes (one request, attention_mask all ones).  transformers 5.24's
# Glm4v get_rope_index takes the masked length instead (len(current_input_ids)), as the contract does;
# the padded-row delta is transformers 4.x's convention, consistent only where decode positions count
# the row's pad columns.
KNOWN_DEVIATIONS = {
    "glm_delta_padded_row": (
        "known deviation: sglang 0.5.23 get_rope_index_glm4v (mrope_rope_index.py) computes the delta against the "
        "padded row (llm_positions.max() + 1 - len(total_input_ids[i]), and max + 1 - attention_mask.shape[-1] for a "
        "text-only batch), not the masked prompt, so a prompt with p pad columns in its row gets delta - p"
    ),
    "glm_delta_pad_fill": (
        "known deviation: sglang 0.5.23 get_rope_index_glm4v, text-only batch: pad columns are filled with "
        "position 1 (masked_fill_(attention_mask == 0, 1)) before the row maximum is taken, so a one-token prompt in "
        "a padded row counts max = 1, not 0 (delta one higher)"
    ),
}


def glm_pinned_delta(ref_delta: int, length: int, width: int, vision_in_batch: bool) -> tuple[int, tuple[str, ...]]:
    """The delta get_rope_index_glm4v returns for a prompt of ``length`` tokens in a row of ``width``
    columns (the rest pads), and the departures that changed it."""
    pad = width - length
    if pad == 0:
        return ref_delta, ()
    if vision_in_batch:                          # per-row branch: masked positions, padded length
        return ref_delta - pad, ("glm_delta_padded_row",)
    # Text-only branch: positions 0 .. length-1 plus pad columns at 1, maximum over the whole row.
    row_max = max(length - 1, 1)
    keys = ("glm_delta_pad_fill", "glm_delta_padded_row") if row_max != length - 1 else ("glm_delta_padded_row",)
    return row_max + 1 - width, keys


def known_deviations(family: str, batch: PromptBatch) -> list[KnownDeviation | None]:
    """GLM in a padded batch: the reference's positions with the delta get_rope_index_glm4v gives."""
    if family != "glm4v":
        return [None] * len(batch.prompts)
    refs = [prompt_positions(family, p) for p in batch.prompts]
    width = max(r.length + pad for r, pad in zip(refs, batch.pads))     # the layout, not the positions
    vision_in_batch = any(not isinstance(s, Text) for p in batch.prompts for s in p.segments)
    out: list[KnownDeviation | None] = []
    for ref in refs:
        delta, keys = glm_pinned_delta(ref.delta, ref.length, width, vision_in_batch)
        out.append(KnownDeviation(ref.positions, delta, keys, "; ".join(KNOWN_DEVIATIONS[k] for k in keys))
                   if keys else None)
    return out


position_ids_sglang.families = MROPE_FAMILIES
position_ids_sglang.batch = _batch
position_ids_sglang.known_deviations = known_deviations
position_ids_sglang.version = SGLANG_VERSION
