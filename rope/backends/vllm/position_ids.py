"""vLLM's own M-RoPE / XD-RoPE position ids as a position-id implementation (registry name ``vllm``;
read on vllm 0.33.0).

vLLM computes a request's prefill positions once, from its prompt token ids and one
``MultiModalFeatureSpec`` per image / video (the item's processed fields and its placeholder range
``mm_position`` in the prompt), through the model class's ``get_mrope_input_positions(input_tokens,
mm_features)``.  The adapter drives that method per family:

* qwen2_vl, qwen2_5_vl: ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration``
  (``iter_mm_grid_thw``: one block per item at ``mm_position.offset``; the video time scale is
  ``second_per_grid_ts * vision_config.tokens_per_second``);
* qwen3_vl: ``Qwen3VLForConditionalGeneration`` (one ``video_grid_thw`` per video; vLLM finds each
  frame itself from the vision start/end tokens after the video's offset);
* glm4v: ``Glm4vForConditionalGeneration`` of ``glm4_1v.py`` (GLM-4.1V; frames are the embed runs
  of the video's ``is_embed`` mask);
* hunyuan_ocr, hunyuan_ocr_3d: vLLM 0.33.0 has no HunYuanVL model of its own (no
  ``get_xdrope_input_positions``): its registry serves ``HunYuanVLForConditionalGeneration`` with
  the Transformers modeling backend, whose ``MultiModalMixin.get_mrope_input_positions`` builds
  ``mm_token_type_ids`` from the placeholder ranges and calls transformers'
  ``HunYuanVLModel.get_rope_index`` (transformers >= 5.13.0 in vLLM's environment).

Nothing is instantiated: the method runs on ``object.__new__(<vLLM class>)`` holding only ``config``
(a default transformers config with the family's merge size; Qwen2.5-VL checkpoints set
``tokens_per_second = 2``) and, for the Transformers backend, ``model``: a dummy with
``HunYuanVLModel.get_rope_index`` (as the transformers adapter builds it).  The prompt becomes what
vLLM's multimodal processor hands over: token ids from ``reference.prompt_positions(...).roles``,
and per item its grid (int64), Qwen2.5-VL's ``second_per_grid_ts`` (float32, as the HF processor
returns it) and the placeholder range that the processor's prompt replacement covers.  vLLM takes
one request at a time: no ``batch``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os

import torch

from reference.position_ids import prompt_positions
from rope.prompts import (IMAGE, QWEN2_5_VL_TOKENS_PER_SECOND, TEXT, VIDEO, XDROPE_FAMILIES, Image,
                          Prompt, Video)
from rope.backends import require
from rope.backends.vocabulary import hunyuan_config_kwargs, token_ids

# Same rule as rope/backends/vllm/rotation.py: on a GPU-less host say so before vLLM is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
_INSTALL = ("pip install vllm; on a CPU box scripts/vllm_cpu_env.sh (its own venv): see "
            "docs/implementations.md, \"Serving engines' own code as implementations\"")
vllm = require("vllm", distribution="vllm", install=_INSTALL)
_inputs = require("vllm.multimodal.inputs", distribution="vllm", install=_INSTALL)
for _module in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4_1v", "transformers"):
    require(f"vllm.model_executor.models.{_module}", distribution="vllm", install=_INSTALL)
VLLM_VERSION = getattr(vllm, "__version__", "?")
from rope.backends.vllm import omni_position_ids as omni  # noqa: E402 - after vLLM is found


@dataclasses.dataclass(frozen=True)
class Model:
    """The vLLM class whose ``get_mrope_input_positions`` a family runs, and its (tiny) config."""

    module: str                                # under vllm.model_executor.models
    cls: str
    config_module: str                         # transformers
    config: str
    config_kwargs: dict = dataclasses.field(default_factory=dict)
    hf_model: tuple | None = None              # Transformers backend: (module, class) of the HF model


_HUNYUAN_HF = ("transformers.models.hunyuan_vl.modeling_hunyuan_vl", "HunYuanVLModel")

MODELS = {
    "qwen2_vl": Model("qwen2_vl", "Qwen2VLForConditionalGeneration",
                      "transformers.models.qwen2_vl.configuration_qwen2_vl", "Qwen2VLConfig"),
    "qwen2_5_vl": Model("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration",
                        "transformers.models.qwen2_5_vl.configuration_qwen2_5_vl", "Qwen2_5_VLConfig",
                        {"vision_config": {"tokens_per_second": QWEN2_5_VL_TOKENS_PER_SECOND}}),
    "qwen3_vl": Model("qwen3_vl", "Qwen3VLForConditionalGeneration",
                      "transformers.models.qwen3_vl.configuration_qwen3_vl", "Qwen3VLConfig"),
    # vLLM's GLM processor writes video frames with the image token (its `frame_embed_token_id`).
    "glm4v": Model("glm4_1v", "Glm4vForConditionalGeneration",
                   "transformers.models.glm4v.configuration_glm4v", "Glm4vConfig"),
    **{family: Model("transformers", "TransformersMultiModalForCausalLM",
                     "transformers.models.hunyuan_vl.configuration_hunyuan_vl", "HunYuanVLConfig",
                     hunyuan_config_kwargs(family), _HUNYUAN_HF)
       for family in ("hunyuan_ocr", "hunyuan_ocr_3d")},
}
HF_ARCHITECTURE = "HunYuanVLForConditionalGeneration"


def family_unavailable(family: str) -> str | None:
    """Why the installed vLLM (and the transformers beside it) cannot run ``family``, or None."""
    model = MODELS[family]
    if model.hf_model is None:
        return None
    registry = require("vllm.model_executor.models.registry", distribution="vllm", install=_INSTALL)
    if HF_ARCHITECTURE not in registry.ModelRegistry.get_supported_archs():
        return f"vllm {VLLM_VERSION} does not serve {HF_ARCHITECTURE}"
    try:
        importlib.import_module(model.hf_model[0])
    except ImportError:
        import transformers
        return (f"vllm {VLLM_VERSION} serves {HF_ARCHITECTURE} with its Transformers backend, which needs "
                f"transformers' {model.hf_model[1]} (>= 5.13.0; installed {transformers.__version__})")
    return None


@functools.lru_cache(maxsize=None)
def _model(family: str, spatial_merge_size: int):
    """(vLLM model object without __init__, config): holds what get_mrope_input_positions reads."""
    model = MODELS[family]
    cls = getattr(importlib.import_module(f"vllm.model_executor.models.{model.module}"), model.cls)
    config = getattr(importlib.import_module(model.config_module), model.config)(**model.config_kwargs)
    config.vision_config.spatial_merge_size = spatial_merge_size
    stub = object.__new__(cls)                 # an nn.Module never initialised: set plain attributes
    stub.__dict__["config"] = config
    if model.hf_model is not None:             # Transformers backend: self.model is the HF model
        hf_cls = getattr(importlib.import_module(model.hf_model[0]), model.hf_model[1])
        methods = {n: getattr(hf_cls, n) for n in ("get_rope_index", "get_vision_position_ids") if hasattr(hf_cls, n)}
        hf = type(f"Dummy{model.hf_model[1]}", (), methods)()
        hf.config = config
        stub.__dict__["model"] = hf
    return stub, config


def _runs(modality: list[int]):
    """(start, end) of each maximal run of vision tokens (modality != TEXT), left to right."""
    start = None
    for k, m in enumerate(modality + [TEXT]):
        if m != TEXT and start is None:
            start = k
        elif start is not None and (m == TEXT or m != modality[start]):
            yield start, k
            start = k if m != TEXT else None


def _field(modality: str, key: str, value: torch.Tensor):
    """One item's field, as vLLM's batched field config cuts it from the processor's output."""
    config = _inputs.MultiModalFieldConfig.batched(modality, keep_on_cpu=True)
    return config.build_elems(key, value.unsqueeze(0))[0]


def mm_features(family: str, prompt: Prompt, roles, modality: list[int]) -> list:
    """One ``MultiModalFeatureSpec`` per image / video, in prompt order.

    The placeholder range is what vLLM's prompt replacement writes for the item:
    Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM images and Qwen2(.5)-VL videos: the placeholder tokens
    alone; Qwen3-VL videos: every frame's ``timestamp, vision_start, video * h'w', vision_end``
    (``is_embed`` on the video tokens); GLM videos: ``video_start`` ... ``video_end`` (frames with
    their begin/end of image and timestamps; ``is_embed`` on the frame tokens); HunYuanVL images:
    the h'(w'+1)+2 image tokens, all embeds (the Transformers backend's ``select_token_id``).
    """
    runs = iter(_runs(modality))
    kinds = torch.tensor(modality)
    features = []
    for n, seg in enumerate(s for s in prompt.segments if isinstance(s, (Image, Video))):
        kind = "image" if isinstance(seg, Image) else "video"
        start, end = next(runs)
        is_embed = None
        if kind == "video" and family in ("qwen3_vl", "glm4v"):     # one run per frame
            for _ in range(seg.grid_thw[0] - 1):
                _, end = next(runs)
            if family == "qwen3_vl":
                start, end = start - 1 - seg.timestamp_tokens, end + 1
                assert roles[end - 1] == "vision_end", roles[start:end]
            else:
                start, end = start - 2, end + 1 + seg.timestamp_tokens + 1
                assert roles[start] == "video_start" and roles[end - 1] == "video_end", roles[start:end]
            is_embed = kinds[start:end] == VIDEO
        elif family in XDROPE_FAMILIES:
            is_embed = torch.ones(end - start, dtype=torch.bool)
        assert all(m == (IMAGE if kind == "image" else VIDEO) for m in modality[start:end] if m != TEXT)
        data = {f"{kind}_grid_thw": _field(kind, f"{kind}_grid_thw", torch.tensor(seg.grid_thw, dtype=torch.int64))}
        if kind == "video" and family == "qwen2_5_vl":                # only its HF processor returns it
            data["second_per_grid_ts"] = _field(kind, "second_per_grid_ts",
                                                torch.tensor(seg.second_per_grid, dtype=torch.float32))
        features.append(_inputs.MultiModalFeatureSpec(
            data=_inputs.MultiModalKwargsItem(data), modality=kind, identifier=f"{kind}-{n}",
            mm_position=_inputs.PlaceholderRange(offset=start, length=end - start, is_embed=is_embed)))
    return features


def position_ids_vllm(family: str, prompt: Prompt):
    """``<vLLM model>.get_mrope_input_positions(input_tokens, mm_features)`` for one prompt."""
    if family in omni.MODELS:
        return omni.omni_positions(family, prompt)
    stub, config = _model(family, prompt.spatial_merge_size)
    ref = prompt_positions(family, prompt)
    modality = ref.modality.tolist()
    tokens = token_ids(family, config, ref.roles)
    positions, delta = stub.get_mrope_input_positions(tokens, mm_features(family, prompt, ref.roles, modality))
    return torch.as_tensor(positions).to(torch.int64), int(delta)


def _unsupported_reason(family: str, prompt: Prompt | None) -> str | None:
    if family in omni.MODELS:
        return omni.family_unavailable(family) or omni.unsupported_reason(family, prompt)
    return family_unavailable(family)


position_ids_vllm.families = (*MODELS, *omni.MODELS)
position_ids_vllm.unsupported_reason = _unsupported_reason
position_ids_vllm.known_deviations = omni.known_deviations
position_ids_vllm.version = VLLM_VERSION
