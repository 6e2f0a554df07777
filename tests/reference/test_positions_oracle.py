"""Model position ids: the reference (``reference.position_ids``) against hand-worked examples, and
transformers' known departures from it pinned both ways (docs/spec.md §4).

Three parts:

1. Worked examples computed by hand, the decode rule, and the ValueError table: these pin the
   reference itself and need no transformers.
2. Hypothesis properties of the reference alone (text-only prompts, token counts, decode).
3. Each departure of transformers' ``get_rope_index`` that ``KNOWN_MISMATCHES`` records
   (rope/backends/transformers/position_ids.py, with the releases it holds for): a strict xfail
   against the reference while it is active, and the exact value transformers returns.  The
   drawn comparison of any position-id implementation, transformers by default, is
   properties/position_ids/test_position_ids.py.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from properties.prompt_strategies import prompts
from reference.position_ids import audio_tokens, decode_positions, llm_grid, prompt_positions
from rope.prompts import (AUDIO, FAMILIES, IMAGE, TEXT, VIDEO, XDROPE_FAMILIES, Audio, Image, Prompt, Text, Video,
                          family_num_dims)

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
    ("segment-type", lambda: Prompt((Text(1), "abc")),
     r"^segments\[1\]='abc': must be a Text, Image, Video or Audio \(got str\)$"),
    ("audio-zero", lambda: Audio(0), r"^frames=0: must be an int in \[1, 1048576\] \(got 0\)$"),
    ("video-audio-bool", lambda: Video((1, 2, 2), audio_frames=True), r"^audio_frames=True: must be an int in \["),
    ("family-no-audio", lambda: prompt_positions("qwen2_5_vl", Prompt((Text(1), Audio(40)))),
     r"^segments\[1\]=Audio\(frames=40\): qwen2_5_vl takes no audio \(only qwen2_5_omni, qwen3_omni do\)$"),
    ("family-no-audio-in-video", lambda: prompt_positions("qwen3_vl", Prompt((Video((1, 2, 2), audio_frames=40),))),
     r"^segments\[0\]\.audio_frames=40: qwen3_vl takes no audio in a video \(only qwen2_5_omni, qwen3_omni do\)$"),
    ("omni-audio-no-tokens", lambda: prompt_positions("qwen2_5_omni", Prompt((Audio(2),))),
     r"^segments\[0\]\.frames=2: qwen2_5_omni makes 0 audio tokens of it \(needs >= 1\)$"),
    ("omni3-fractional-offset", lambda: prompt_positions("qwen3_omni", Prompt((Video((2, 2, 2), second_per_grid=0.5),))),
     r"^segments\[0\]\.second_per_grid=0\.5: qwen3_omni's temporal offset ti \* second_per_grid \* 13 must be "
     r"a whole number \(got 6\.5 at ti=1;"),
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


# Omni and ARC-Hunyuan-Video worked examples.  The lists are transformers 5.25's get_rope_index output
# for the same token sequences (Qwen2.5-Omni / Qwen3-Omni thinkers) and a hand trace of the
# ARC-Hunyuan-Video fork's get_xdrope_position_ids; the comments give the arithmetic.

def test_qwen2_5_omni_audio_then_video_worked_example():
    # "ab" <as> [audio 20 frames -> ((19 // 2 + 1 - 2) // 2 + 1) = 5 tokens] <ae> <vs> [video 2x4x4,
    # spg 2 -> f = int(ti * 2 * 25) = 0, 50] <ve> "c": text positions through the audio.
    pp = prompt_positions("qwen2_5_omni", Prompt((Text(2), Audio(20), Video((2, 4, 4), second_per_grid=2.0), Text(1))))
    assert pp.roles[2:9] == ("audio_start",) + ("audio",) * 5 + ("audio_end",)
    assert pp.modality.tolist().count(AUDIO) == 5
    assert rows(pp)[0] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] + [10] * 4 + [60] * 4 + [61, 62]
    assert rows(pp)[1][10:18] == [10, 10, 11, 11, 10, 10, 11, 11]
    assert pp.delta == 62 + 1 - 20 == 43


def test_qwen2_5_omni_audio_in_video_worked_example():
    # "ab" <vs><as> share 2; st = 3.  Video 4x4x4, spg 1: f = 0, 25, 50, 75 (4 tokens per frame);
    # audio 200 frames -> 50 tokens at 3 .. 52.  Chunks of 50: video [f 0, 25 | 50, 75], audio [0..49]:
    # order V0 (8 tokens), A0 (50), V1 (8); <ae><ve> share max(V1) + 1 = 79; "c" = 80.
    pp = prompt_positions("qwen2_5_omni", Prompt((Text(2), Video((4, 4, 4), second_per_grid=1.0, audio_frames=200),
                                                  Text(1))))
    t = rows(pp)[0]
    assert pp.roles[2:4] == ("vision_start", "audio_start") and t[2:4] == [2, 2]
    assert t[4:12] == [3] * 4 + [28] * 4 and t[12:62] == list(range(3, 53)) and t[62:70] == [53] * 4 + [78] * 4
    assert t[70:] == [79, 79, 80] and pp.roles[70:72] == ("audio_end", "vision_end")
    assert pp.delta == 80 + 1 - 73 == 8


def test_qwen2_5_omni_chunk_jump_worked_example():
    # spg 4: f = 0, 100, 200 for frames of one token.  get_chunked_index advances one chunk per token:
    # 100 >= 50 cuts before frame 1 (chunk 2 next), 200 >= 100 cuts before frame 2: V = [0 | 100 | 200];
    # audio 300 frames -> 75 tokens, [0..49 | 50..74].  Order V0 A0 V1 A1 V2; the last run is V2.
    pp = prompt_positions("qwen2_5_omni", Prompt((Video((3, 2, 2), second_per_grid=4.0, audio_frames=300),)))
    t = rows(pp)[0]
    assert t[:3] == [0, 0, 1]                       # <vs><as> at 0, V0 at st = 1
    assert t[3:53] == list(range(1, 51)) and t[53] == 101 and t[54:79] == list(range(51, 76)) and t[79] == 201
    assert t[80:] == [202, 202]


def test_omni_position_after_block_is_one_past_its_last_run():
    # A video 20 tokens tall (h' = 20) with audio of 30 frames (7 tokens in Qwen2.5-Omni, 4 in
    # Qwen3-Omni): the runs are the video (H up to st + 19), then the audio (st .. st + n - 1).  The
    # end tokens follow the last run, the audio: st + n, below the block's maximum st + 19
    # (transformers reads the last piece's maximum).
    for family, first in (("qwen2_5_omni", 1), ("qwen3_omni", 2)):
        pp = prompt_positions(family, Prompt((Video((1, 40, 2), second_per_grid=1.0, audio_frames=30), Text(1))))
        st = first
        assert int(pp.positions[1].max()) == st + 19
        end = pp.roles.index("audio_end")
        assert pp.positions[:, end].tolist() == [st + audio_tokens(family, 30)] * 3, family


def test_qwen3_omni_audio_in_video_worked_example():
    # "ab" <vs> 2 <as> 3 (consecutive); st = 4.  Video 3x4x4, spg 2 -> f = 0, 26, 52; audio 200 frames
    # -> 2 full windows x 13 = 26 tokens (4 .. 29).  Merged on T, video first on a tie: frame 0 (T 4),
    # audio 4 .. 29, frames 1, 2 (T 30, 56); <ae> 57 <ve> 58; "c" 59.
    pp = prompt_positions("qwen3_omni", Prompt((Text(2), Video((3, 4, 4), second_per_grid=2.0, audio_frames=200),
                                                Text(1))))
    t = rows(pp)[0]
    assert t[:4] == [0, 1, 2, 3] and t[4:8] == [4] * 4 and t[8:34] == list(range(4, 30))
    assert t[34:42] == [30] * 4 + [56] * 4 and t[42:] == [57, 58, 59]
    assert pp.delta == 59 + 1 - 45 == 15


@pytest.mark.parametrize("frames, tokens", [(20, 3), (99, 13), (100, 13), (101, 14), (200, 26), (1000, 130)])
def test_qwen3_omni_audio_tokens(frames, tokens):
    assert audio_tokens("qwen3_omni", frames) == tokens


def test_arc_hunyuan_video_frames_are_images_worked_example():
    # "a", then 2 frames of 2 x 2 merged tokens: each <img> CTX [2 rows x (2 + newline)] CTX </img>;
    # rows P, W (column), H (row), T (frame ordinal); everything else the plain index.
    pp = prompt_positions("arc_hunyuan_video", Prompt((Text(1), Video((2, 4, 4)), Text(2))))
    assert rows(pp) == [
        list(range(23)),
        [0, 1, 2, 0, 1, 2, 0, 1, 2, 9, 10, 11, 12, 0, 1, 2, 0, 1, 2, 19, 20, 21, 22],
        [0, 1, 2, 0, 0, 0, 1, 1, 1, 9, 10, 11, 12, 0, 0, 0, 1, 1, 1, 19, 20, 21, 22],
        [0, 1, 2, 0, 0, 0, 0, 0, 0, 9, 10, 11, 12, 1, 1, 1, 1, 1, 1, 19, 20, 21, 22],
    ]
    assert pp.delta == 0


# =====================================================================================  part 2
# Strategies: properties/prompt_strategies.py.  Counts straight from the description:


def _expected_counts(family: str, prompt: Prompt) -> tuple[int, int, int]:
    """(image tokens, video tokens, audio tokens) straight from the description."""
    n_image = n_video = n_audio = 0
    for seg in prompt.segments:
        if isinstance(seg, Text):
            continue
        if isinstance(seg, Audio):
            n_audio += audio_tokens(family, seg.frames)
            continue
        t, h, w = llm_grid(seg.grid_thw, prompt.spatial_merge_size)
        if family in XDROPE_FAMILIES:                  # ARC-Hunyuan-Video: a frame is an image
            n_image += (t if isinstance(seg, Video) else 1) * (h * (w + 1) + 2)
        elif isinstance(seg, Image):
            n_image += h * w
        else:
            n_video += t * h * w
            n_audio += audio_tokens(family, seg.audio_frames) if seg.audio_frames else 0
    return n_image, n_video, n_audio


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
    n_image, n_video, n_audio = _expected_counts(family, prompt)
    assert pp.positions.shape == (family_num_dims(family), pp.length)
    assert int((pp.modality == IMAGE).sum()) == n_image
    assert int((pp.modality == VIDEO).sum()) == n_video
    assert int((pp.modality == AUDIO).sum()) == n_audio
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
# transformers' get_rope_index, through its adapter (rope/backends/transformers/position_ids.py).
# The drawn comparison is properties/position_ids/test_position_ids.py (--rope-position-ids-impl transformers,
# the default); here, each known departure is pinned both ways: a strict xfail against the
# reference while the departure is active (a fix upstream turns it into an XPASS, i.e. a failure
# that asks for the table to be updated), and the exact value transformers returns.

try:
    from rope.prompts import PromptBatch
    from rope.backends.transformers import position_ids as hf
except ImportError:  # pragma: no cover - CI always has transformers
    hf = None


def _unavailable(family: str) -> str | None:
    return "needs transformers installed" if hf is None else hf.family_unavailable(family)


def needs_oracle(family: str):
    """Skip the test where transformers cannot run ``family``, asked when the test runs: the
    question imports the family's modeling module (seconds), which collection never pays."""
    def decorate(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            reason = _unavailable(family)
            if reason is not None:
                pytest.skip(reason)
            return test(*args, **kwargs)
        return run
    return decorate


def _active(key: str) -> bool:
    return hf is not None and hf.KNOWN_MISMATCHES[key].active()


def _xfail_if_active(key: str):
    return pytest.mark.xfail(_active(key), reason=hf.KNOWN_MISMATCHES[key].said if hf else "", strict=True)


def _skip_unless_active(key: str):
    return pytest.mark.skipif(not _active(key), reason=f"{key} not in the installed transformers")


def _single(family, prompt):
    pos, delta = hf.position_ids_transformers(family, prompt)
    return pos.tolist(), delta


LONG_VIDEO = Prompt((Text(1), Video((4, 4, 4), second_per_grid=2.0), Text(3)))
HALF_SECOND_VIDEO = Prompt((Video((2, 4, 4), second_per_grid=0.5), Text(1)))
ONE_IMAGE = Prompt((Text(1), Image((1, 2, 4))))
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
    ref = prompt_positions("hunyuan_ocr", ONE_IMAGE)
    got = hf.position_ids_transformers.batch("hunyuan_ocr", PromptBatch((ONE_IMAGE, ONE_IMAGE)))
    assert [(p.tolist(), d) for p, d in got] == [(ref.positions.tolist(), 0)] * 2


@needs_oracle("hunyuan_ocr")
@_skip_unless_active("image_ordinal_across_batch")
def test_hunyuan_ocr_batched_image_ordinal_pinned_value():
    (first, _), (second, _) = hf.position_ids_transformers.batch("hunyuan_ocr", PromptBatch((ONE_IMAGE, ONE_IMAGE)))
    # "a" <start> <vit_begin> [1 row x (2 + 1)] <vit_end> <end>: grid tokens are 3, 4, 5
    assert first[3].tolist() == [0, 1, 2, 0, 0, 0, 6, 7]
    assert second[3].tolist() == [0, 1, 2, 1, 1, 1, 6, 7]


@needs_oracle("hunyuan_ocr")
@_skip_unless_active("image_ordinal_across_batch")
@pytest.mark.parametrize("family", ["hunyuan_ocr", "hunyuan_ocr_3d"])
def test_hunyuan_ocr_ordinal_past_the_prompt_pinned_delta(family):
    # Found by a random draw on a GPU box: a lone image (6 tokens with <start>/<end>) after six images
    # in the prompt before it gets ordinal 6 > its last position 5, and transformers' delta, max + 1 - L
    # over every row, becomes 1; the pin said 0.
    many = Prompt(tuple(Image((1, 2, 2)) for _ in range(6)), spatial_merge_size=2)
    lone = Prompt((Image((1, 2, 2)),), spatial_merge_size=2)
    got = hf.position_ids_transformers.batch(family, PromptBatch((many, lone)))
    for before, prompt, (positions, delta) in zip((0, 6), (many, lone), got):
        pinned, pinned_delta, _ = hf.pinned_value(family, prompt, images_before=before)
        assert (positions.tolist(), delta) == (pinned.tolist(), pinned_delta)
    assert got[1][1] == 1


@pytest.mark.skipif(hf is None, reason="needs transformers installed")
def test_known_mismatch_table_is_well_formed():
    from packaging.version import Version
    for m in hf.KNOWN_MISMATCHES.values():
        assert m.reason.startswith("known mismatch: transformers "), m.key
        # A mismatch still present names the installed release, not a fixed "through" version that
        # newer releases outdate.
        assert "through 5." not in m.said and "{" not in m.said, m.said
        assert m.until is not None or f"still in the installed {hf.TRANSFORMERS_VERSION}" in m.said, m.said
        assert set(m.families) <= set(FAMILIES), m.key
        assert m.until is None or Version(m.since) < Version(m.until) <= hf.NEWEST_VERSION_READ, m.key


# Omni: every worked example above through transformers' own get_rope_index, and its one departure.
OMNI_PROMPTS = [
    ("qwen2_5_omni", Prompt((Text(2), Audio(20), Video((2, 4, 4), second_per_grid=2.0), Text(1)))),
    ("qwen2_5_omni", Prompt((Text(2), Video((4, 4, 4), second_per_grid=1.0, audio_frames=200), Text(1)))),
    ("qwen2_5_omni", Prompt((Video((3, 2, 2), second_per_grid=4.0, audio_frames=300),))),
    ("qwen2_5_omni", Prompt((Video((1, 40, 2), second_per_grid=1.0, audio_frames=30), Text(1)))),
    ("qwen3_omni", Prompt((Text(2), Video((3, 4, 4), second_per_grid=2.0, audio_frames=200), Text(1)))),
    ("qwen3_omni", Prompt((Video((1, 40, 2), second_per_grid=1.0, audio_frames=30), Text(1)))),
]


@pytest.mark.parametrize("family, prompt", OMNI_PROMPTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(OMNI_PROMPTS)])
def test_omni_worked_examples_match_transformers(family, prompt):
    if _unavailable(family):
        pytest.skip(_unavailable(family))
    ref = prompt_positions(family, prompt)
    assert _single(family, prompt) == (ref.positions.tolist(), ref.delta)


ONE_TOKEN_PADDED = PromptBatch((Prompt((Text(1),)), Prompt((Text(3),)))) if hf else None


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
@_xfail_if_active("pad_fill_in_delta")
def test_omni_one_token_padded_delta_matches_reference(family):
    if _unavailable(family):
        pytest.skip(_unavailable(family))
    (_, delta), _ = hf.position_ids_transformers.batch(family, ONE_TOKEN_PADDED)
    assert delta == prompt_positions(family, ONE_TOKEN_PADDED.prompts[0]).delta == 0


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
@_skip_unless_active("pad_fill_in_delta")
def test_omni_one_token_padded_delta_pinned_value(family):
    if _unavailable(family):
        pytest.skip(_unavailable(family))
    (pos, delta), (pos3, delta3) = hf.position_ids_transformers.batch(family, ONE_TOKEN_PADDED)
    # one real token at 0, two pad columns filled with 1: max 1 + 1 - 1 real token
    assert pos.tolist() == [[0]] * 3 and delta == 1
    assert pos3.tolist() == [[0, 1, 2]] * 3 and delta3 == 0     # no pad column in the longest row


def test_qwen2_5_omni_talker_applies_the_thinker_rule():
    # Qwen2.5-Omni's talker inherits the thinker's get_rope_index and runs it with its own config
    # (pps 25, 2 s chunks, its vision / audio ids): the qwen2_5_omni family describes its positions,
    # audio in video included.
    if _unavailable("qwen2_5_omni"):
        pytest.skip(_unavailable("qwen2_5_omni"))
    from transformers.models.qwen2_5_omni import configuration_qwen2_5_omni as conf
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as mod
    from rope.backends.vocabulary import token_ids
    talker = mod.Qwen2_5OmniTalkerForConditionalGeneration
    config = conf.Qwen2_5OmniTalkerConfig()
    helpers = ("get_rope_index", "get_llm_pos_ids_for_vision", "get_chunked_index")
    dummy = type("DummyTalker", (), {name: getattr(talker, name) for name in helpers})()
    dummy.config, dummy.spatial_merge_size = config, 2
    prompt = Prompt((Text(3), Video((4, 4, 4), second_per_grid=1.0, audio_frames=200), Text(9)))
    ref = prompt_positions("qwen2_5_omni", prompt)
    ids = torch.tensor([token_ids("qwen2_5_omni", config, ref.roles)])
    positions, delta = dummy.get_rope_index(
        input_ids=ids, attention_mask=torch.ones_like(ids), use_audio_in_video=True,
        video_grid_thw=torch.tensor([[4, 4, 4]]), second_per_grids=torch.tensor([1.0]),
        audio_seqlens=torch.tensor([200]))
    assert positions[:, 0].tolist() == ref.positions.tolist()
    assert int(delta.reshape(-1)[0]) == ref.delta


def test_qwen3_omni_talker_applies_the_thinker_rule():
    # The talker's get_rope_index is the thinker's, run with the talker config (its own ids and
    # position_id_per_seconds; 13 in the checkpoint) on the user turn's ids, placeholders kept, then
    # codec tokens that are text to it: the qwen3_omni family describes its positions.
    if _unavailable("qwen3_omni"):
        pytest.skip(_unavailable("qwen3_omni"))
    from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as conf
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as mod
    from rope.backends.vocabulary import token_ids
    talker = mod.Qwen3OmniMoeTalkerForConditionalGeneration
    config = conf.Qwen3OmniMoeTalkerConfig(position_id_per_seconds=13, audio_end_token_id=151670,
                                           vision_end_token_id=151653)
    helpers = ("get_rope_index", "get_llm_pos_ids_for_vision")
    dummy = type("DummyTalker", (), {name: getattr(talker, name) for name in helpers})()
    dummy.config, dummy.spatial_merge_size = config, 2
    prompt = Prompt((Text(3), Image((1, 4, 6)), Text(2), Video((3, 4, 4), second_per_grid=2.0), Text(9)))
    ref = prompt_positions("qwen3_omni", prompt)
    ids = torch.tensor([token_ids("qwen3_omni", config, ref.roles)])
    positions, delta = dummy.get_rope_index(
        input_ids=ids, attention_mask=torch.ones_like(ids), image_grid_thw=torch.tensor([[1, 4, 6]]),
        video_grid_thw=torch.tensor([[3, 4, 4]]), second_per_grids=torch.tensor([2.0]))
    assert positions[:, 0].to(torch.int64).tolist() == ref.positions.tolist()
    assert int(delta.reshape(-1)[0]) == ref.delta
