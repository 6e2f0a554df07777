"""transformers' ``get_rope_index`` as a position-id implementation (registry name ``transformers``).

The prompt description is turned into what the model's processor would have produced: ``input_ids``
with the family's special tokens (vision start/end, GLM begin/end of video, timestamp text),
``mm_token_type_ids``, the grids, ``second_per_grid_ts`` and an ``attention_mask`` over a padded
batch; ``<Model>.get_rope_index`` then runs weight-free, as the unbound method on a dummy object
holding a default-constructed config and the helpers it calls (docs/spec.md §8.6).  Pad columns
(attention_mask 0) are outside the description and dropped.

From 5.3.0 ``get_rope_index`` groups tokens by ``mm_token_type_ids``, but up to 5.5.4 its Qwen2-VL /
Qwen2.5-VL video blocks are wrong (transformers#45381, gone in 5.6.0) and up to 5.5.3 images take
the video time scale (#45325): the adapter runs from 5.6.0 (read on 5.6.0 ... 5.24.0).

Where transformers departs from the model's original semantics, ``KNOWN_MISMATCHES`` records the
departure with the releases it holds for, and ``known_deviations`` derives the exact value
transformers is pinned to return from the reference by the documented rule.  Whether a departure
applies is decided from the description (grids, seconds per grid, the batch), never from the
reference's positions, so a wrong reference cannot hide inside a departure's region.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect

import torch
from packaging.version import Version

from reference.position_ids import llm_grid, prompt_positions
from rope.prompts import (IMAGE, OMNI_FAMILIES, QWEN2_5_VL_TOKENS_PER_SECOND, VIDEO, XDROPE_FAMILIES, Image,
                          Prompt, Video, family_num_dims)
from rope.backends import require
from rope.prompts import KnownDeviation, PromptBatch
from rope.backends.vocabulary import PAD_TOKEN_ID, hunyuan_config_kwargs, token_ids

transformers = require("transformers", distribution="transformers", install="pip install '.[oracle]'")
from rope.backends.transformers import omni_position_ids as omni  # noqa: E402 - needs transformers present
TRANSFORMERS_VERSION = Version(transformers.__version__)
MIN_VERSION = Version("5.6.0")
NEWEST_VERSION_READ = Version("5.24.0")


@dataclasses.dataclass(frozen=True)
class Model:
    """Where a family's ``get_rope_index`` lives and how to configure it (tiny, weight-free)."""

    module: str
    model: str
    config_module: str
    config: str
    config_kwargs: dict = dataclasses.field(default_factory=dict)


MODELS = {
    "qwen2_vl": Model("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel",
                      "transformers.models.qwen2_vl.configuration_qwen2_vl", "Qwen2VLConfig"),
    # Qwen2.5-VL checkpoints set vision_config.tokens_per_second = 2 (the config class default is 4).
    "qwen2_5_vl": Model("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLModel",
                        "transformers.models.qwen2_5_vl.configuration_qwen2_5_vl", "Qwen2_5_VLConfig",
                        {"vision_config": {"tokens_per_second": QWEN2_5_VL_TOKENS_PER_SECOND}}),
    "qwen3_vl": Model("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLModel",
                      "transformers.models.qwen3_vl.configuration_qwen3_vl", "Qwen3VLConfig"),
    "glm4v": Model("transformers.models.glm4v.modeling_glm4v", "Glm4vModel",
                   "transformers.models.glm4v.configuration_glm4v", "Glm4vConfig"),
    **{family: Model("transformers.models.hunyuan_vl.modeling_hunyuan_vl", "HunYuanVLModel",
                     "transformers.models.hunyuan_vl.configuration_hunyuan_vl", "HunYuanVLConfig",
                     hunyuan_config_kwargs(family))
       for family in ("hunyuan_ocr", "hunyuan_ocr_3d")},
}
HELPERS = ("get_rope_index", "get_vision_position_ids")


# Every family but ARC-Hunyuan-Video, whose get_xdrope_position_ids lives only in TencentARC's fork.
TRANSFORMERS_FAMILIES = (*MODELS, *OMNI_FAMILIES)


def family_unavailable(family: str) -> str | None:
    """Why the installed transformers cannot run ``family`` (a skip reason), or None."""
    if family in OMNI_FAMILIES:
        try:
            importlib.import_module(omni.MODELS[family][0])
        except ImportError:
            return f"needs transformers' {omni.MODELS[family][1]} (not in transformers {TRANSFORMERS_VERSION})"
        return None
    if TRANSFORMERS_VERSION < MIN_VERSION:
        return (f"needs transformers >= {MIN_VERSION} (get_rope_index with mm_token_type_ids and working video "
                f"blocks); installed {TRANSFORMERS_VERSION}")
    model = MODELS[family]
    try:
        importlib.import_module(model.module)
    except ImportError:
        return f"needs {model.model} (transformers {TRANSFORMERS_VERSION} does not have it; HunYuanVL arrived in 5.13.0)"
    return None


@functools.lru_cache(maxsize=None)
def _model(family: str, spatial_merge_size: int):
    """(bound get_rope_index, config) on a dummy object: no weights, no download."""
    model = MODELS[family]
    model_cls = getattr(importlib.import_module(model.module), model.model)
    config_cls = getattr(importlib.import_module(model.config_module), model.config)
    config = config_cls(**model.config_kwargs)
    config.vision_config.spatial_merge_size = spatial_merge_size
    methods = {name: getattr(model_cls, name) for name in HELPERS if hasattr(model_cls, name)}
    dummy = type(f"Dummy{model.model}", (), methods)()
    dummy.config = config
    return dummy.get_rope_index, config


def _batch(family: str, batch: PromptBatch) -> list[tuple[torch.Tensor, int]]:
    """One ``get_rope_index`` call on the padded batch; per prompt (positions [D, L_i], delta)."""
    if family in OMNI_FAMILIES:
        return omni.omni_batch(family, batch)
    merge = batch.prompts[0].spatial_merge_size
    get_rope_index, config = _model(family, merge)
    refs = [prompt_positions(family, p) for p in batch.prompts]
    width = max(r.length + pad for r, pad in zip(refs, batch.pads))
    ids = torch.full((len(refs), width), PAD_TOKEN_ID, dtype=torch.int64)
    types = torch.zeros((len(refs), width), dtype=torch.int64)
    mask = torch.zeros((len(refs), width), dtype=torch.int64)
    columns = []
    for b, ref in enumerate(refs):
        start = width - ref.length - batch.pads[b] if batch.side == "left" else batch.pads[b]
        cols = torch.arange(start, start + ref.length)
        ids[b, cols] = torch.tensor(token_ids(family, config, ref.roles))
        types[b, cols] = ref.modality
        mask[b, cols] = 1
        columns.append(cols)
    images = [s.grid_thw for p in batch.prompts for s in p.segments if isinstance(s, Image)]
    videos = [s for p in batch.prompts for s in p.segments if isinstance(s, Video)]
    kwargs = {
        "input_ids": ids,
        "mm_token_type_ids": types,
        "image_grid_thw": torch.tensor(images, dtype=torch.int64) if images else None,
        "video_grid_thw": torch.tensor([v.grid_thw for v in videos], dtype=torch.int64) if videos else None,
        "second_per_grid_ts": torch.tensor([v.second_per_grid for v in videos], dtype=torch.float32) if videos else None,
        "attention_mask": mask,
    }
    accepted = inspect.signature(get_rope_index).parameters
    position_ids, deltas = get_rope_index(**{k: v for k, v in kwargs.items() if k in accepted})
    want = (family_num_dims(family), len(refs), width)
    if tuple(position_ids.shape) != want:
        raise ValueError(f"transformers {TRANSFORMERS_VERSION} {MODELS[family].model}.get_rope_index: position_ids "
                         f"shape {tuple(position_ids.shape)}, expected {want}")
    return [(position_ids[:, b, cols], int(deltas.reshape(len(refs), -1)[b, 0].item())) for b, cols in enumerate(columns)]


def position_ids_transformers(family: str, prompt: Prompt):
    """``<Model>.get_rope_index`` of the installed transformers for one prompt (no padding)."""
    return _batch(family, PromptBatch((prompt,)))[0]


# ------------------------------------------------------------------------------- known departures
# Versions were found by unpacking the transformers wheels 4.57.6 and 5.0.0 ... 5.24.0 and diffing
# get_rope_index / get_vision_position_ids of each model.

@dataclasses.dataclass(frozen=True)
class KnownMismatch:
    """A transformers behaviour that departs from the model's original semantics.

    ``since``: first release with it (or the oldest wheel read); ``until``: first release without
    it, None while it is still in the newest release read (NEWEST_VERSION_READ).  ``reason`` may
    name ``{installed}``, the installed release (:attr:`said`).
    """

    key: str
    families: tuple[str, ...]
    since: str
    until: str | None
    reason: str

    @property
    def said(self) -> str:
        """The reason as a report prints it: the installed release named (the run that finds the
        mismatch there is the evidence it is still there)."""
        return self.reason.format(installed=TRANSFORMERS_VERSION)

    def active(self, version: Version | None = None) -> bool:
        version = TRANSFORMERS_VERSION if version is None else version
        if version < Version(self.since):
            return False
        return self.until is None or version < Version(self.until)


KNOWN_MISMATCHES = {
    m.key: m
    for m in (
        KnownMismatch(
            key="cursor_after_video",
            families=("qwen2_vl", "qwen2_5_vl"),
            since="5.3.0",
            until=None,
            reason=(
                "known mismatch: transformers >=5.3.0 (still in the installed {installed}) get_rope_index moves the cursor past a "
                "vision block by max(h', w') instead of to max(block positions) + 1, so the tokens after a video "
                "whose last temporal offset f(t'-1) >= max(h', w') restart inside the video's range "
                "(<= 5.2.0 and vLLM continue at max + 1)"
            ),
        ),
        KnownMismatch(
            key="second_per_grid_truncated",
            families=("qwen2_5_vl",),
            since="4.57.6",
            until="5.18.0",
            reason=(
                "known mismatch: transformers <5.18.0 (read back to 4.57.6) truncates second_per_grid_ts to an "
                "int before scaling (int(...) in 5.3.0-5.17.0, as_tensor(dtype=long) before), so a video with a "
                "fractional second_per_grid gets temporal offsets int(ti * int(spg) * tokens_per_second) "
                "(the truncation of transformers#48669; gone in 5.18.0)"
            ),
        ),
        KnownMismatch(
            key="image_ordinal_across_batch",
            families=("hunyuan_ocr", "hunyuan_ocr_3d"),
            since="5.13.0",
            until=None,
            reason=(
                "known mismatch: transformers >=5.13.0 (still in the installed {installed}) HunYuanVL get_rope_index counts the image "
                "ordinal T across the whole batch instead of per prompt, so in a batch the images of prompt b start "
                "at T = (images in prompts 0..b-1); vLLM and the original count per request"
            ),
        ),
        KnownMismatch(
            key="pad_fill_in_delta",
            families=OMNI_FAMILIES,
            since="4.57.6",
            until=None,
            reason=(
                "known mismatch: transformers >=4.57.6 (still in the installed {installed}) Qwen2.5-Omni / Qwen3-Omni "
                "get_rope_index, in a call with no image or video grid (text and audio only), sets pad columns to 1 "
                "before taking the row maximum, so a one-token prompt in a padded row gets delta 1 instead of 0"
            ),
        ),
    )
}


def active_mismatches(family: str, version: Version | None = None) -> tuple[KnownMismatch, ...]:
    return tuple(m for m in KNOWN_MISMATCHES.values() if family in m.families and m.active(version))


def runs(modality: torch.Tensor):
    """(start, end, modality) of each maximal run of equal modality, left to right."""
    values = modality.tolist()
    start = 0
    for k in range(1, len(values) + 1):
        if k == len(values) or values[k] != values[start]:
            yield start, k, values[start]
            start = k


def pinned_value(family: str, prompt: Prompt, images_before: int = 0, version: Version | None = None):
    """What transformers ``version`` (default: the installed one) returns for ``prompt`` in a batch
    whose earlier prompts hold ``images_before`` images: the reference's positions with each active
    known mismatch applied, the delta recomputed as transformers does (max + 1 - L).

    Returns (positions, delta, keys of the mismatches that changed something).
    """
    ref = prompt_positions(family, prompt)
    active = {m.key for m in active_mismatches(family, version)}
    positions = ref.positions.clone()
    hit: set[str] = set()
    if family in ("qwen2_vl", "qwen2_5_vl") and active & {"cursor_after_video", "second_per_grid_truncated"}:
        videos = iter([seg for seg in prompt.segments if isinstance(seg, Video)])
        shift = 0                                  # how far transformers lags the reference so far
        for i, j, kind in runs(ref.modality):
            positions[:, i:j] -= shift
            if kind != VIDEO:
                continue
            video = next(videos)
            t, h, w = llm_grid(video.grid_thw, prompt.spatial_merge_size)
            if family == "qwen2_5_vl":
                spg = video.second_per_grid
                spg_hf = int(spg) if "second_per_grid_truncated" in active else spg
                true_f = [int(ti * spg * QWEN2_5_VL_TOKENS_PER_SECOND) for ti in range(t)]
                hf_f = [int(ti * spg_hf * QWEN2_5_VL_TOKENS_PER_SECOND) for ti in range(t)]
            else:
                true_f = hf_f = list(range(t))
            if hf_f != true_f:                     # temporal row of this block (t-major order)
                hit.add("second_per_grid_truncated")
                for k in range(i, j):
                    ti = (k - i) // (h * w)
                    positions[0, k] += hf_f[ti] - true_f[ti]
            end_true = max(true_f[-1], h - 1, w - 1) + 1    # next start, relative to the block base
            end_hf = max(hf_f[-1], h - 1, w - 1) + 1
            if "cursor_after_video" in active and max(h, w) != end_hf:
                hit.add("cursor_after_video")
                end_hf = max(h, w)
            shift += end_true - end_hf
    if (family in XDROPE_FAMILIES and "image_ordinal_across_batch" in active and images_before
            and any(isinstance(seg, Image) for seg in prompt.segments)):
        hit.add("image_ordinal_across_batch")
        for i, j, kind in runs(ref.modality):
            if kind == IMAGE:                      # grid = the image span less ViT begin/end tokens
                positions[-1, i + 1:j - 1] += images_before
    # transformers' delta is max + 1 - L over every row, the ordinal's too: XD-RoPE's is 0 (the reference's)
    # until the ordinal carried from earlier prompts passes the prompt's last position.
    xdrope_as_is = family in XDROPE_FAMILIES and "image_ordinal_across_batch" not in hit
    delta = 0 if xdrope_as_is else int(positions.max()) + 1 - ref.length
    return positions, delta, hit


def known_deviations(family: str, batch: PromptBatch) -> list[KnownDeviation | None]:
    """Per prompt, the pinned value where an active known mismatch changes it (else None)."""
    if family in OMNI_FAMILIES:
        mismatch = KNOWN_MISMATCHES["pad_fill_in_delta"]
        changed = omni.pad_fill_deltas(family, batch) if mismatch.active() else {}
        return [KnownDeviation(prompt_positions(family, p).positions, changed[i], (mismatch.key,), mismatch.said)
                if i in changed else None for i, p in enumerate(batch.prompts)]
    out: list[KnownDeviation | None] = []
    images_before = 0
    for prompt in batch.prompts:
        positions, delta, hit = pinned_value(family, prompt, images_before)
        images_before += sum(isinstance(s, Image) for s in prompt.segments)
        if not hit:
            out.append(None)
            continue
        reasons = "; ".join(KNOWN_MISMATCHES[k].said for k in sorted(hit))
        out.append(KnownDeviation(positions, delta, tuple(sorted(hit)), reasons))
    return out


def _unsupported_reason(family: str, prompt: Prompt | None) -> str | None:
    reason = family_unavailable(family)
    if reason is None and family in OMNI_FAMILIES:
        reason = omni.unsupported_reason(family, prompt)
    return reason


position_ids_transformers.families = TRANSFORMERS_FAMILIES
position_ids_transformers.unsupported_reason = _unsupported_reason
position_ids_transformers.batch = _batch
position_ids_transformers.known_deviations = known_deviations
position_ids_transformers.version = str(TRANSFORMERS_VERSION)
