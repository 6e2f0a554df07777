"""Model position ids: the reference (``reference.position_ids``) against hand-worked examples and
against each model's ``get_rope_index`` in the installed transformers (docs/spec.md §4).

Three parts:

1. Worked examples computed by hand, the decode rule, and the ValueError table: these pin the
   reference itself and need no transformers.
2. Hypothesis properties of the reference alone (text-only prompts, token counts, decode).
3. The oracle: the same description is turned into input_ids, mm_token_type_ids, grids and an
   attention mask (a padded batch) and fed to ``<Model>.get_rope_index`` weight-free: the
   unbound method on a dummy object that holds a default-constructed config and the helper
   methods it calls (docs/spec.md §8.6).  Every place where transformers departs from the
   model's original semantics is a ``KnownMismatch`` row with the transformers versions it
   holds for.  The test works out from the description whether an input lies in a mismatch's
   region; outside every region it asserts transformers == reference; inside, it asserts the
   exact value transformers is pinned to produce, derived from the reference by the documented
   rule.  Explicit examples of each mismatch are also strict xfails against the reference, so a
   transformers fix shows up as an XPASS.

Pad columns of the batch (attention_mask == 0) are outside the description and not compared;
transformers >= 5.3 writes 0 there.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect

import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from reference.position_ids import (
    FAMILIES,
    IMAGE,
    QWEN2_5_VL_TOKENS_PER_SECOND,
    TEXT,
    VIDEO,
    XDROPE_FAMILIES,
    Image,
    Prompt,
    Text,
    Video,
    decode_positions,
    family_num_dims,
    llm_grid,
    prompt_positions,
)

# =====================================================================================  part 1
# Worked examples (computed by hand; the comments show the arithmetic).


def rows(pp) -> list[list[int]]:
    return pp.positions.tolist()


def test_qwen2_vl_text_image_text_worked_example():
    # "ab" <vs> [image 1x4x6 -> 1x2x3] <ve> "cd"; the block starts at base 3 (after 0, 1, 2).
    pp = prompt_positions("qwen2_vl", Prompt((Text(2), Image((1, 4, 6)), Text(2))))
    assert pp.roles == ("text", "text", "vision_start") + ("image",) * 6 + ("vision_end", "text", "text")
    assert pp.modality.tolist() == [TEXT] * 3 + [IMAGE] * 6 + [TEXT] * 3
    assert rows(pp) == [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8],  # T: base + 0
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8],  # H: base + row
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8],  # W: base + column; <ve> = max(5) + 1 = 6
    ]
    assert pp.delta == 8 + 1 - 12 == -3
    assert pp.positions.dtype == torch.int64


def test_qwen2_5_vl_video_time_scaled_worked_example():
    # <vs> [video 4x2x2 -> 4x1x1] <ve>; f(ti) = int(ti * 1.0 * 2) = 0, 2, 4, 6 from base 1.
    pp = prompt_positions("qwen2_5_vl", Prompt((Video((4, 2, 2), second_per_grid=1.0),)))
    assert rows(pp) == [[0, 1, 3, 5, 7, 8], [0, 1, 1, 1, 1, 8], [0, 1, 1, 1, 1, 8]]
    assert pp.delta == 8 + 1 - 6 == 3
    assert pp.modality.tolist() == [TEXT, VIDEO, VIDEO, VIDEO, VIDEO, TEXT]


@pytest.mark.parametrize(
    "family, second_per_grid, temporal",
    [
        ("qwen2_5_vl", 0.5, [1, 2, 3, 4]),   # int(ti * 0.5 * 2) = ti
        ("qwen2_5_vl", 0.25, [1, 1, 2, 2]),  # int(ti * 0.5): 0, 0, 1, 1 (truncated)
        ("qwen2_5_vl", 1.5, [1, 4, 7, 10]),  # int(ti * 3)
        ("qwen2_vl", 2.0, [1, 2, 3, 4]),     # Qwen2-VL: factor 1, second_per_grid unused
    ],
)
def test_video_temporal_row_uses_the_family_time_scale(family, second_per_grid, temporal):
    pp = prompt_positions(family, Prompt((Video((4, 2, 2), second_per_grid=second_per_grid),)))
    assert pp.positions[0, 1:5].tolist() == temporal
    assert pp.positions[0, 5].item() == max(temporal) + 1


def test_qwen3_vl_video_is_split_per_frame_worked_example():
    # per frame: <ts> <vs> [1x1x2] <ve>; T constant inside a frame.
    pp = prompt_positions("qwen3_vl", Prompt((Video((2, 2, 4), timestamp_tokens=1),)))
    frame = ("timestamp", "vision_start", "video", "video", "vision_end")
    assert pp.roles == frame * 2
    assert rows(pp) == [
        [0, 1, 2, 2, 4, 5, 6, 7, 7, 9],
        [0, 1, 2, 2, 4, 5, 6, 7, 7, 9],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    ]
    assert pp.delta == 0


def test_glm4v_video_frames_inside_begin_end_of_video_worked_example():
    # <bov> ( <boi> [1x1x2] <eoi> <ts> ) x 2 <eov>
    pp = prompt_positions("glm4v", Prompt((Video((2, 2, 4), timestamp_tokens=1),)))
    frame = ("vision_start", "video", "video", "vision_end", "timestamp")
    assert pp.roles == ("video_start",) + frame * 2 + ("video_end",)
    assert rows(pp) == [
        [0, 1, 2, 2, 4, 5, 6, 7, 7, 9, 10, 11],
        [0, 1, 2, 2, 4, 5, 6, 7, 7, 9, 10, 11],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    ]


def test_hunyuan_ocr_image_worked_example():
    # "ab" <image_start> <vit_begin> [2 rows x (3 patches + row end)] <vit_end> <image_end> "c"
    pp = prompt_positions("hunyuan_ocr", Prompt((Text(2), Image((1, 4, 6)), Text(1))))
    assert rows(pp) == [
        list(range(15)),                                                   # P: plain index
        [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 12, 13, 14],                  # W: column 0..w'
        [0, 1, 2, 3, 0, 0, 0, 0, 1, 1, 1, 1, 12, 13, 14],                  # H: row
        [0, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 12, 13, 14],                  # T: image ordinal 0
    ]
    assert pp.modality.tolist() == [TEXT] * 3 + [IMAGE] * 10 + [TEXT] * 2
    assert pp.delta == 0
    pp3 = prompt_positions("hunyuan_ocr_3d", Prompt((Text(2), Image((1, 4, 6)), Text(1))))
    assert rows(pp3) == rows(pp)[1:]                                         # W, H, T


def test_hunyuan_ocr_second_image_gets_ordinal_one():
    pp = prompt_positions("hunyuan_ocr", Prompt((Image((1, 2, 2)), Image((1, 2, 2)))))
    # image k: <start>, <vit_begin>, 1 x (1 + 1) grid, <vit_end>, <end> = 6 tokens
    assert pp.positions[3].tolist() == [0, 1, 0, 0, 4, 5, 6, 7, 1, 1, 10, 11]


def test_decode_positions_rule():
    assert decode_positions(12, 3, -3, 3).tolist() == [[9, 10, 11]] * 3
    assert decode_positions(15, 2, 0, 4).tolist() == [[15, 16]] * 4
    assert decode_positions(5, 0, 0, 3).shape == (3, 0)
    assert decode_positions(5, 1, 0, 3).dtype == torch.int64


def test_decode_after_worked_prompt_continues_at_max_plus_one():
    pp = prompt_positions("qwen2_vl", Prompt((Text(2), Image((1, 4, 6)), Text(2))))
    first = decode_positions(pp.length, 2, pp.delta, pp.num_dims)
    assert first.tolist() == [[9, 10]] * 3                                   # max 8 + 1


BAD_INPUTS = [
    # (id, callable, message regex): message style ``<field>=<value>: <rule> (<actual>)``
    ("text-negative", lambda: Text(-1), r"^length=-1: must be >= 0 \(got -1\)$"),
    ("text-not-int", lambda: Text(2.0), r"^length=2\.0: must be an int \(got float\)$"),
    ("grid-zero", lambda: Image((1, 0, 4)), r"^grid_thw=\(1, 0, 4\): every entry must be >= 1 \(got h=0\)$"),
    ("grid-empty", lambda: Image(()), r"^grid_thw=\(\): must have 3 entries \(t, h, w\) \(got 0\)$"),
    ("grid-not-int", lambda: Video((1, 2.0, 2)), r"^grid_thw=\(1, 2\.0, 2\): every entry must be an int \(got h=2\.0\)$"),
    ("image-t", lambda: Image((2, 4, 4)), r"^grid_thw=\(2, 4, 4\): an image has t = 1 \(got t=2\)$"),
    ("video-zero-frames", lambda: Video((0, 4, 4)), r"^grid_thw=\(0, 4, 4\): every entry must be >= 1 \(got t=0\)$"),
    ("video-spg-zero", lambda: Video((2, 4, 4), second_per_grid=0.0), r"^second_per_grid=0\.0: must be finite and > 0 \(got 0\.0\)$"),
    ("video-spg-nan", lambda: Video((2, 4, 4), second_per_grid=float("nan")), r"^second_per_grid=nan: must be finite and > 0"),
    ("video-timestamps", lambda: Video((2, 4, 4), timestamp_tokens=-1), r"^timestamp_tokens=-1: must be an int >= 0"),
    ("merge-divides", lambda: Prompt((Text(1), Image((1, 6, 3)))),
     r"^segments\[1\]\.grid_thw=\(1, 6, 3\): h and w must be multiples of spatial_merge_size=2 \(h % 2 = 0, w % 2 = 1\)$"),
    ("merge-divides-4", lambda: Prompt((Video((1, 6, 4)),), spatial_merge_size=4),
     r"^segments\[0\]\.grid_thw=\(1, 6, 4\): h and w must be multiples of spatial_merge_size=4 \(h % 4 = 2, w % 4 = 0\)$"),
    ("merge-zero", lambda: Prompt((Text(1),), spatial_merge_size=0), r"^spatial_merge_size=0: must be an int >= 1 \(got 0\)$"),
    ("segment-type", lambda: Prompt((Text(1), "abc")), r"^segments\[1\]='abc': must be a Text, Image or Video \(got str\)$"),
    ("family-unknown", lambda: prompt_positions("qwen4_vl", Prompt((Text(1),))), r"^family='qwen4_vl': must be one of \("),
    ("family-no-video", lambda: prompt_positions("hunyuan_ocr", Prompt((Text(1), Video((1, 2, 2))))),
     r"^segments\[1\]=Video\(.*\): hunyuan_ocr takes no video \(got a Video\)$"),
    ("prompt-empty", lambda: prompt_positions("qwen2_vl", Prompt((Text(0),))), r"^segments=.*: must produce at least one token \(got 0 tokens\)$"),
    ("prompt-type", lambda: prompt_positions("qwen2_vl", [Text(1)]), r"^prompt=.*: must be a Prompt \(got list\)$"),
    ("decode-count", lambda: decode_positions(4, -1, 0, 3), r"^count=-1: must be >= 0 \(got -1\)$"),
    ("decode-start", lambda: decode_positions(-2, 1, 0, 3), r"^n_start=-2: must be >= 0 \(got -2\)$"),
    ("decode-dims", lambda: decode_positions(4, 1, 0, 5), r"^num_dims=5: must be 1 to 4 \(got 5\)$"),
    ("decode-delta", lambda: decode_positions(4, 1, -9, 3), r"^delta=-9: n_start \+ delta must be >= 0 \(got -5\)$"),
]


@pytest.mark.parametrize("make, message", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_positions_bad_input_raises_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# =====================================================================================  part 2
# Strategies.  Small grids (multiples of the merge size), few frames, few segments: every example
# is a few dozen tokens.  Examples shrink towards one short text run, merge size 2, no padding.

# seconds per temporal grid = temporal_patch_size / fps: fps 2, 4, 1, 8, 24, 3.  transformers forms
# ti * (tokens_per_second * spg) in float32, the reference int(ti * spg * 2) in float64; the two agree
# for these values (checked for ti < 200 and every common fps).
SECONDS_PER_GRID = (1.0, 0.5, 2.0, 0.25, 2 / 24, 2 / 3)


def _check_bound(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r}: must be an int >= {low} (got {value!r})")


def prompts(*, family: str, max_segments: int = 4, max_text: int = 4, max_side: int = 3, max_frames: int = 3,
            spatial_merge_sizes: tuple[int, ...] = (2, 1)):
    """Prompts valid for ``family``: 1..max_segments segments (text first in the shrink order),
    text runs of 1..max_text tokens, images/videos of h', w' in 1..max_side merged tokens and
    1..max_frames frames, spatial merge size from ``spatial_merge_sizes`` (the first is the real
    models' 2).  Shrinks towards ``Prompt((Text(1),))``."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: must be one of {FAMILIES} (got {family!r})")
    if not spatial_merge_sizes or not all(isinstance(m, int) and m >= 1 for m in spatial_merge_sizes):
        raise ValueError(f"spatial_merge_sizes={spatial_merge_sizes!r}: must be a non-empty tuple of ints >= 1")
    for name, value, low in (("max_segments", max_segments, 1), ("max_text", max_text, 1),
                             ("max_side", max_side, 1), ("max_frames", max_frames, 1)):
        _check_bound(name, value, low)

    @st.composite
    def draw_prompt(draw):
        merge = draw(st.sampled_from(spatial_merge_sizes))
        side = st.integers(1, max_side).map(lambda n: n * merge)
        texts = st.builds(Text, st.integers(1, max_text))
        images = st.builds(lambda h, w: Image((1, h, w)), side, side)
        videos = st.builds(
            lambda t, h, w, spg, ts: Video((t, h, w), second_per_grid=spg, timestamp_tokens=ts),
            st.integers(1, max_frames), side, side, st.sampled_from(SECONDS_PER_GRID), st.integers(0, 2),
        )
        kinds = [texts, images] if family in XDROPE_FAMILIES else [texts, images, videos]
        segments = draw(st.lists(st.one_of(*kinds), min_size=1, max_size=max_segments))
        return Prompt(tuple(segments), spatial_merge_size=merge)

    return draw_prompt()


@dataclasses.dataclass(frozen=True)
class Batch:
    """Prompts of one transformers call, each padded with ``pads[i]`` tokens on ``side``."""

    prompts: tuple[Prompt, ...]
    pads: tuple[int, ...]
    side: str = "left"


def batches(*, family: str, max_batch: int = 2, max_pad: int = 2):
    """1..max_batch prompts sharing one merge size, 0..max_pad pad tokens each, left or right.
    Shrinks towards one unpadded prompt."""
    _check_bound("max_batch", max_batch, 1)
    _check_bound("max_pad", max_pad, 0)

    @st.composite
    def draw_batch(draw):
        merge = draw(st.sampled_from((2, 1)))                  # one vision config per call
        same_merge = prompts(family=family, spatial_merge_sizes=(merge,))
        batch = draw(st.lists(same_merge, min_size=1, max_size=max_batch))
        pads = tuple(draw(st.integers(0, max_pad)) for _ in batch)
        side = draw(st.sampled_from(("left", "right")))
        return Batch(tuple(batch), pads, side)

    return draw_batch()


def _expected_counts(family: str, prompt: Prompt) -> tuple[int, int]:
    """(image tokens, video tokens) straight from the description."""
    n_image = n_video = 0
    for seg in prompt.segments:
        if isinstance(seg, Text):
            continue
        t, h, w = llm_grid(seg.grid_thw, prompt.spatial_merge_size)
        if family in XDROPE_FAMILIES:
            n_image += h * (w + 1) + 2
        elif isinstance(seg, Image):
            n_image += h * w
        else:
            n_video += t * h * w
    return n_image, n_video


# Properties of the reference alone -------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@settings(deadline=None)
@given(data=st.data())
def test_text_tokens_reduce_to_1d(family, data):
    lengths = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=3).filter(lambda x: sum(x) > 0))
    pp = prompt_positions(family, Prompt(tuple(Text(n) for n in lengths)))
    arange = torch.arange(sum(lengths), dtype=torch.int64)
    assert torch.equal(pp.positions, arange.expand(family_num_dims(family), -1))
    assert pp.delta == 0


@pytest.mark.parametrize("family", FAMILIES)
@settings(deadline=None)
@given(data=st.data())
def test_positions_token_layout_matches_description(family, data):
    prompt = data.draw(prompts(family=family))
    pp = prompt_positions(family, prompt)
    n_image, n_video = _expected_counts(family, prompt)
    assert pp.positions.shape == (family_num_dims(family), pp.length)
    assert int((pp.modality == IMAGE).sum()) == n_image
    assert int((pp.modality == VIDEO).sum()) == n_video
    assert len(pp.roles) == pp.length
    assert pp.roles.count("text") == sum(s.length for s in prompt.segments if isinstance(s, Text))
    # text and markup tokens: all rows equal (M-RoPE) / plain index (XD-RoPE)
    text = pp.modality == TEXT
    assert torch.equal(pp.positions[:, text], pp.positions[:1, text].expand(pp.num_dims, -1))
    if family in XDROPE_FAMILIES:
        assert torch.equal(pp.positions[:, text][0], torch.nonzero(text).flatten())


@pytest.mark.parametrize("family", FAMILIES)
@settings(deadline=None)
@given(data=st.data())
def test_positions_decode_continues_after_prompt(family, data):
    prompt = data.draw(prompts(family=family))
    count = data.draw(st.integers(1, 3))
    pp = prompt_positions(family, prompt)
    decode = decode_positions(pp.length, count, pp.delta, pp.num_dims)
    start = pp.length if family in XDROPE_FAMILIES else int(pp.positions.max()) + 1
    assert decode.tolist() == [list(range(start, start + count))] * pp.num_dims
    assert pp.delta == start - pp.length


# =====================================================================================  part 3
# The transformers oracle.


def _version(text: str):
    from packaging.version import Version
    return Version(text)


try:
    import transformers
    TRANSFORMERS_VERSION = _version(transformers.__version__)
except ImportError:  # pragma: no cover - CI always has it
    transformers = None
    TRANSFORMERS_VERSION = None

# get_rope_index(input_ids, mm_token_type_ids, ...) groups tokens by type since 5.3.0, but in 5.3.0
# to 5.5.4 Qwen2-VL/Qwen2.5-VL get_vision_position_ids builds video blocks wrongly (temporal row =
# start * interval, height not repeated per frame; transformers#45381; gone in 5.6.0), and 5.3.0 to
# 5.5.3 route images through the video time scale (#45325).  Those releases are not pinned: the
# oracle runs from 5.6.0 (checked on 5.6.0, 5.8.0, 5.9.0, 5.12.0, 5.13.0, 5.16.0, 5.17.0, 5.18.0, 5.20.0,
# 5.22.0, 5.23.0, 5.24.0).
ORACLE_MIN_VERSION = "5.6.0"
NEWEST_VERSION_READ = "5.24.0"


@dataclasses.dataclass(frozen=True)
class Oracle:
    """Where a family's get_rope_index lives and how to configure it (tiny, weight-free)."""

    module: str
    model: str
    config_module: str
    config: str
    token_ids: tuple = ()                      # (role, config attribute or literal id) pairs
    config_kwargs: dict = dataclasses.field(default_factory=dict)


_QWEN_IDS = (("vision_start", "vision_start_token_id"), ("vision_end", "vision_end_token_id"),
             ("image", "image_token_id"), ("video", "video_token_id"))
# HunyuanOCR: head_dim 128, xdrope_section [16]*4 (P, W, H, T); the 3-row variant takes [16, 24, 24].
# <image_start>/<image_end> ids live in the tokenizer, not the config: any distinct ids do.
_HUNYUAN_IDS = (("vision_start", 120118), ("vision_end", 120119), ("image", "image_token_id"))


def _hunyuan_text_config(sections):
    return {"text_config": {"head_dim": 128, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(sections)}}}


ORACLES = {
    "qwen2_vl": Oracle("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel",
                       "transformers.models.qwen2_vl.configuration_qwen2_vl", "Qwen2VLConfig", _QWEN_IDS),
    # Qwen2.5-VL checkpoints set vision_config.tokens_per_second = 2 (the config class default is 4).
    "qwen2_5_vl": Oracle("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLModel",
                         "transformers.models.qwen2_5_vl.configuration_qwen2_5_vl", "Qwen2_5_VLConfig", _QWEN_IDS,
                         {"vision_config": {"tokens_per_second": QWEN2_5_VL_TOKENS_PER_SECOND}}),
    "qwen3_vl": Oracle("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLModel",
                       "transformers.models.qwen3_vl.configuration_qwen3_vl", "Qwen3VLConfig", _QWEN_IDS),
    # GLM writes video frames with the image token; mm_token_type_ids says video (processor rule).
    "glm4v": Oracle("transformers.models.glm4v.modeling_glm4v", "Glm4vModel",
                    "transformers.models.glm4v.configuration_glm4v", "Glm4vConfig",
                    (("vision_start", "image_start_token_id"), ("vision_end", "image_end_token_id"),
                     ("video_start", "video_start_token_id"), ("video_end", "video_end_token_id"),
                     ("image", "image_token_id"), ("video", "image_token_id"))),
    "hunyuan_ocr": Oracle("transformers.models.hunyuan_vl.modeling_hunyuan_vl", "HunYuanVLModel",
                          "transformers.models.hunyuan_vl.configuration_hunyuan_vl", "HunYuanVLConfig",
                          _HUNYUAN_IDS, _hunyuan_text_config((16, 16, 16, 16))),
    "hunyuan_ocr_3d": Oracle("transformers.models.hunyuan_vl.modeling_hunyuan_vl", "HunYuanVLModel",
                             "transformers.models.hunyuan_vl.configuration_hunyuan_vl", "HunYuanVLConfig",
                             _HUNYUAN_IDS, _hunyuan_text_config((16, 24, 24))),
}
TEXT_TOKEN_ID, TIMESTAMP_TOKEN_ID, PAD_TOKEN_ID = 1000, 27, 0
ORACLE_HELPERS = ("get_rope_index", "get_vision_position_ids")


def oracle_unavailable(family: str) -> str | None:
    """Why the family's oracle cannot run here (a skip reason), or None."""
    if transformers is None:
        return "needs transformers installed"
    if TRANSFORMERS_VERSION < _version(ORACLE_MIN_VERSION):
        return (f"needs transformers >= {ORACLE_MIN_VERSION} (get_rope_index with mm_token_type_ids and "
                f"working video blocks); installed {TRANSFORMERS_VERSION}")
    spec = ORACLES[family]
    try:
        importlib.import_module(spec.module)
    except ImportError:
        return f"needs {spec.model} (transformers {TRANSFORMERS_VERSION} does not have it; HunYuanVL arrived in 5.13.0)"
    return None


@functools.lru_cache(maxsize=None)
def oracle(family: str, spatial_merge_size: int):
    """(bound get_rope_index, config) on a dummy object: no weights, no download."""
    spec = ORACLES[family]
    model_cls = getattr(importlib.import_module(spec.module), spec.model)
    config_cls = getattr(importlib.import_module(spec.config_module), spec.config)
    config = config_cls(**spec.config_kwargs)
    config.vision_config.spatial_merge_size = spatial_merge_size
    methods = {name: getattr(model_cls, name) for name in ORACLE_HELPERS if hasattr(model_cls, name)}
    dummy = type(f"Dummy{spec.model}", (), methods)()
    dummy.config = config
    return dummy.get_rope_index, config


def token_ids(family: str, config, roles) -> list[int]:
    ids = {"text": TEXT_TOKEN_ID, "timestamp": TIMESTAMP_TOKEN_ID}
    for role, source in ORACLES[family].token_ids:
        ids[role] = source if isinstance(source, int) else getattr(config, source)
    return [ids[r] for r in roles]


def run_oracle(family: str, batch: Batch):
    """Call transformers on the padded batch; return per prompt (positions [D, L_i], delta)."""
    merge = batch.prompts[0].spatial_merge_size
    get_rope_index, config = oracle(family, merge)
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
    assert position_ids.shape == (family_num_dims(family), len(refs), width), position_ids.shape
    return [(position_ids[:, b, cols], int(deltas[b].item())) for b, cols in enumerate(columns)]


# Known mismatches ------------------------------------------------------------------------------
# Versions were found by unpacking the transformers wheels 4.57.6 and 5.0.0 ... 5.24.0 from PyPI
# and diffing get_rope_index / get_vision_position_ids of each model.

@dataclasses.dataclass(frozen=True)
class KnownMismatch:
    """A transformers behaviour that departs from the model's original semantics.

    ``since``: first release with it (or the oldest wheel read); ``until``: first release without
    it, None while it is still in the newest release read (NEWEST_VERSION_READ).
    """

    key: str
    families: tuple[str, ...]
    since: str
    until: str | None
    reason: str

    def active(self, version=None) -> bool:
        version = TRANSFORMERS_VERSION if version is None else version
        if version is None or version < _version(self.since):
            return False
        return self.until is None or version < _version(self.until)


KNOWN_MISMATCHES = {
    m.key: m
    for m in (
        KnownMismatch(
            key="cursor_after_video",
            families=("qwen2_vl", "qwen2_5_vl"),
            since="5.3.0",
            until=None,
            reason=(
                "known mismatch: transformers >=5.3.0 (through 5.24.0) get_rope_index moves the cursor past a "
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
                "known mismatch: transformers >=5.13.0 (through 5.24.0) HunYuanVL get_rope_index counts the image "
                "ordinal T across the whole batch instead of per prompt, so in a batch the images of prompt b start "
                "at T = (images in prompts 0..b-1); vLLM and the original count per request"
            ),
        ),
    )
}


def active_mismatches(family: str) -> tuple[KnownMismatch, ...]:
    return tuple(m for m in KNOWN_MISMATCHES.values() if family in m.families and m.active())


def runs(modality: torch.Tensor):
    """(start, end, modality) of each maximal run of equal modality, left to right."""
    values = modality.tolist()
    start = 0
    for k in range(1, len(values) + 1):
        if k == len(values) or values[k] != values[start]:
            yield start, k, values[start]
            start = k


def transformers_expected(family: str, prompt: Prompt, ref, images_before: int = 0):
    """The value the installed transformers is pinned to return for ``prompt`` (in a batch whose
    earlier prompts hold ``images_before`` images): the reference's positions with each active
    known mismatch applied, the delta recomputed as transformers does (max + 1 - L).  Whether a
    mismatch applies is decided from the description (grids, second_per_grid, batch), not from
    the reference's positions, so a wrong reference cannot hide inside a mismatch region.

    Returns (positions, delta, keys of the mismatches that changed something).
    """
    active = {m.key for m in active_mismatches(family)}
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
    delta = 0 if family in XDROPE_FAMILIES else int(positions.max()) + 1 - ref.length
    return positions, delta, hit


def assert_matches(family, batch, got, ref_and_expected):
    for b, ((hf_pos, hf_delta), (ref, expected, delta, hit)) in enumerate(zip(got, ref_and_expected)):
        context = (f"{family} transformers {TRANSFORMERS_VERSION}, prompt {b} of {len(got)}: "
                   f"{batch.prompts[b]!r}\n  known mismatches applied: {sorted(hit) or 'none'}"
                   f"\n  reference: {ref.positions.tolist()} delta {ref.delta}")
        assert hf_pos.tolist() == expected.tolist(), f"positions differ: {context}\n  transformers: {hf_pos.tolist()}"
        assert hf_delta == delta, f"delta differs ({hf_delta} != {delta}): {context}"


def check_batch(family: str, batch: Batch) -> set[str]:
    got = run_oracle(family, batch)
    expected, hits, images_before = [], set(), 0
    for prompt in batch.prompts:
        ref = prompt_positions(family, prompt)
        pos, delta, hit = transformers_expected(family, prompt, ref, images_before)
        if not hit:  # outside every mismatch region: transformers must equal the reference itself
            assert torch.equal(pos, ref.positions) and delta == ref.delta
        images_before += sum(isinstance(s, Image) for s in prompt.segments)
        expected.append((ref, pos, delta, hit))
        hits |= hit
    assert_matches(family, batch, got, expected)
    return hits


def oracle_marks(family: str) -> list:
    """The ``oracle`` marker, and a skip naming the requirement when the oracle cannot run here."""
    reason = oracle_unavailable(family)
    return [pytest.mark.oracle, pytest.mark.skipif(reason is not None, reason=reason or "")]


def needs_oracle(family: str):
    def decorate(test):
        for mark in oracle_marks(family):
            test = mark(test)
        return test
    return decorate


ORACLE_FAMILIES = [pytest.param(f, marks=oracle_marks(f)) for f in FAMILIES]

# Interesting inputs, kept as explicit examples (one per known mismatch region and layout).
LONG_VIDEO = Prompt((Text(1), Video((4, 4, 4), second_per_grid=2.0), Text(3)))
HALF_SECOND_VIDEO = Prompt((Video((2, 4, 4), second_per_grid=0.5), Text(1)))
ONE_IMAGE = Prompt((Text(1), Image((1, 2, 4))))


@pytest.mark.parametrize("family", ORACLE_FAMILIES)
@settings(deadline=None)
@given(data=st.data())
@example(data=None)
def test_positions_match_transformers(family, data):
    if data is None:  # the explicit examples: every layout at once, mismatch regions included
        segs = (Text(1), Image((1, 2, 4)), Text(2), Image((1, 4, 2)))
        if family not in XDROPE_FAMILIES:
            segs += (Video((3, 2, 2), second_per_grid=1.0), Text(1), Video((2, 4, 4), second_per_grid=0.5))
        batch = Batch((Prompt(segs), Prompt(segs[1:])), pads=(0, 2), side="left")
    else:
        batch = data.draw(batches(family=family))
    for key in sorted(check_batch(family, batch)):
        event(f"known mismatch: {key}")


# Explicit examples of each known mismatch -------------------------------------------------------
# Each example is a strict xfail against the reference while the mismatch is active (a fix in
# transformers turns it into an XPASS, i.e. a failure that asks for the table to be updated), and
# the exact transformers value is asserted literally.

def _xfail_if_active(key: str):
    m = KNOWN_MISMATCHES[key]
    return pytest.mark.xfail(m.active(), reason=m.reason, strict=True)


def _skip_unless_active(key: str):
    m = KNOWN_MISMATCHES[key]
    return pytest.mark.skipif(not m.active(), reason=f"{m.key} not in transformers {TRANSFORMERS_VERSION}: {m.reason}")


def _single(family, prompt):
    (pos, delta), = run_oracle(family, Batch((prompt,), (0,)))
    return pos.tolist(), delta


@needs_oracle("qwen2_5_vl")
@_xfail_if_active("cursor_after_video")
def test_qwen2_5_vl_text_after_long_video_matches_reference():
    # "a" <vs> [video 4x4x4, spg 2 -> f = 0, 4, 8, 12; h' = w' = 2] <ve> "bcd"
    ref = prompt_positions("qwen2_5_vl", LONG_VIDEO)
    assert ref.positions[:, -4:].tolist() == [[15, 16, 17, 18]] * 3 and ref.delta == -3
    assert _single("qwen2_5_vl", LONG_VIDEO) == (ref.positions.tolist(), ref.delta)


@needs_oracle("qwen2_5_vl")
@_skip_unless_active("cursor_after_video")
def test_qwen2_5_vl_text_after_long_video_pinned_value():
    pos, delta = _single("qwen2_5_vl", LONG_VIDEO)
    # block base 2, last frame T = 2 + 12 = 14; transformers resumes at 2 + max(2, 2) = 4
    assert [row[-4:] for row in pos] == [[4, 5, 6, 7]] * 3
    assert max(pos[0]) == 14 and delta == 14 + 1 - 22 == -7


@needs_oracle("qwen2_vl")
@_xfail_if_active("cursor_after_video")
def test_qwen2_vl_text_after_long_video_matches_reference():
    # Qwen2-VL: f = ti; 3 frames of 1x1 outrun max(h', w') = 1
    prompt = Prompt((Video((3, 2, 2)), Text(1)))
    ref = prompt_positions("qwen2_vl", prompt)
    assert ref.positions.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 1, 1, 4, 5], [0, 1, 1, 1, 4, 5]]
    assert ref.delta == 0
    assert _single("qwen2_vl", prompt) == (ref.positions.tolist(), ref.delta)


@needs_oracle("qwen2_vl")
@_skip_unless_active("cursor_after_video")
def test_qwen2_vl_text_after_long_video_pinned_value():
    pos, delta = _single("qwen2_vl", Prompt((Video((3, 2, 2)), Text(1))))
    # <vs> 0, frames T = 1, 2, 3 at H = W = 1; transformers resumes at 1 + max(1, 1) = 2
    assert pos == [[0, 1, 2, 3, 2, 3], [0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 2, 3]]
    assert delta == 3 + 1 - 6 == -2


@needs_oracle("qwen2_5_vl")
@_xfail_if_active("second_per_grid_truncated")
def test_qwen2_5_vl_half_second_video_matches_reference():
    # f = int(ti * 0.5 * 2) = 0, 1; h' = w' = 2 so the cursor rule does not interfere
    ref = prompt_positions("qwen2_5_vl", HALF_SECOND_VIDEO)
    assert ref.positions[0].tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4]
    assert _single("qwen2_5_vl", HALF_SECOND_VIDEO) == (ref.positions.tolist(), ref.delta)


@needs_oracle("qwen2_5_vl")
@_skip_unless_active("second_per_grid_truncated")
def test_qwen2_5_vl_half_second_video_pinned_value():
    pos, delta = _single("qwen2_5_vl", HALF_SECOND_VIDEO)
    assert pos[0] == [0, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4]        # int(0.5) = 0: every frame at T = 1
    assert delta == 4 + 1 - 11


@needs_oracle("hunyuan_ocr")
@_xfail_if_active("image_ordinal_across_batch")
def test_hunyuan_ocr_batched_image_ordinal_matches_reference():
    batch = Batch((ONE_IMAGE, ONE_IMAGE), (0, 0))
    ref = prompt_positions("hunyuan_ocr", ONE_IMAGE)
    got = run_oracle("hunyuan_ocr", batch)
    assert [(p.tolist(), d) for p, d in got] == [(ref.positions.tolist(), 0)] * 2


@needs_oracle("hunyuan_ocr")
@_skip_unless_active("image_ordinal_across_batch")
def test_hunyuan_ocr_batched_image_ordinal_pinned_value():
    (first, _), (second, _) = run_oracle("hunyuan_ocr", Batch((ONE_IMAGE, ONE_IMAGE), (0, 0)))
    # "a" <start> <vit_begin> [1 row x (2 + 1)] <vit_end> <end>: grid tokens are 3, 4, 5
    assert first[3].tolist() == [0, 1, 2, 0, 0, 0, 6, 7]
    assert second[3].tolist() == [0, 1, 2, 1, 1, 1, 6, 7]


def test_known_mismatch_table_is_well_formed():
    for m in KNOWN_MISMATCHES.values():
        assert m.reason.startswith("known mismatch: transformers "), m.key
        assert set(m.families) <= set(FAMILIES), m.key
        assert m.until is None or _version(m.since) < _version(m.until) <= _version(NEWEST_VERSION_READ), m.key
