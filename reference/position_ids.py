"""Reference prefill position ids and the decode rule, from a description of the prompt (docs/spec.md §4).

A prompt is described, not tokenized: an ordered tuple of segments, each a text run (``Text``),
an image (``Image``) or a video (``Video``), with the vision grids in patches before the spatial
merge.  ``prompt_positions(family, prompt)`` lays the description out as the model's real token
sequence, markup tokens included, and returns the position ids the model gives every token:
int64 ``[num_dims, L]`` plus the decode ``delta`` and, per token, its modality and role so that a
test can build ``input_ids`` and ``mm_token_type_ids`` for a peer from the same description.

Conventions (all families):

* A vision grid ``(t, h, w)`` counts patches before the merge; the language model sees
  ``t' = t``, ``h' = h / spatial_merge_size``, ``w' = w / spatial_merge_size`` tokens, in t-major,
  then h, then w order.  Images have ``t = 1``.
* M-RoPE (3 rows T, H, W): a text token gets the same value on every row; the first token of the
  prompt gets 0 and every later text token gets ``max(all previous positions) + 1`` (the models'
  original rule, and vLLM's).  A vision block starts at ``base = max(previous) + 1`` and gives
  token (ti, hi, wi) the rows ``(base + f(ti), base + hi, base + wi)``.
* ``delta = max(prefill positions) + 1 - L`` for M-RoPE and 0 for XD-RoPE; decode token at absolute
  index n gets ``n + delta`` on every row (``decode_positions``).

Token layout per family (markup tokens are text tokens, modality 0; their roles name them):

==============  ===========================================================================
qwen2_vl,       image: ``vision_start, image * h'w', vision_end`` (f = 0)
qwen2_5_vl      video: ``vision_start, video * t'h'w', vision_end``, one block with temporal
                offset f(ti) = ti (qwen2_vl), or ``int(ti * second_per_grid * 2)``
                (qwen2_5_vl, tokens_per_second = 2, truncated toward zero)
qwen3_vl        image: as qwen2_vl (f = 0);  video: for each of the t' frames
                ``timestamp * timestamp_tokens, vision_start, video * h'w', vision_end``;
                every frame is its own (1, h', w') block, so T is constant inside a frame
glm4v           image: ``vision_start, image * h'w', vision_end`` (``<|begin_of_image|>`` ...)
                video: ``video_start``, then for each of the t' frames
                ``vision_start, video * h'w', vision_end, timestamp * timestamp_tokens``,
                then ``video_end``; each frame is its own (1, h', w') block (the frame
                grouping of transformers' original Glm4v get_rope_index, 4.57)
hunyuan_ocr,    image: ``vision_start, image * (h'(w' + 1) + 2), vision_end``: the image tokens
hunyuan_ocr_3d  are the ViT begin token, h' rows of w' patch tokens plus one row-end token, and
                the ViT end token.  Every row starts as the plain token index n.  For the k-th
                image (0-based) the h'(w'+1) grid tokens (after ``vision_start`` and the first
                image token) get W = column 0..w', H = row 0..h'-1, T = k; P stays n.
                Rows are P, W, H, T (hunyuan_ocr) or W, H, T (hunyuan_ocr_3d).  No videos.
qwen2_5_omni,   image: as qwen2_vl.  video without audio: ``vision_start, video * t'h'w',
qwen3_omni      vision_end``, one block, f(ti) = ``int(ti * second_per_grid * pps)`` with
                position_id_per_seconds pps = 25 (qwen2_5_omni; truncated toward zero) or 13
                (qwen3_omni; the product must be a whole number: transformers keeps a fraction,
                vLLM truncates it, and int64 ids cannot say which is meant).
                audio: ``audio_start, audio * n, audio_end``, text positions on every row
                (n = ``audio_tokens(family, frames)``).
                video with audio (``audio_frames``): ``vision_start, audio_start``, the video's
                tokens and its n audio tokens interleaved by time, ``audio_end, vision_end``.
                Video tokens sit at (st + f(ti), st + hi, st + wi), audio token i at st + i on
                every row, from the same start st.  qwen2_5_omni: both start tokens share one
                position p and st = p + 1; the video is cut into chunks at each token whose
                offset reaches the next multiple of pps * seconds_per_chunk = 50 (at most one
                cut per token: transformers' get_chunked_index), the audio into runs of 50,
                and the order is video chunk 0, audio chunk 0, video chunk 1, ...; both end
                tokens share the position after.  qwen3_omni: the start tokens are
                consecutive, st follows them, and the two streams are merged token by token
                on the temporal value, a video token first on a tie; the end tokens are
                consecutive.  In both, the position after the block is one past the largest
                value of its *last run* (the last chunk, or the tail of the stream that
                outlasts the merge), not of the whole block: transformers reads the previous
                piece's maximum, and a video taller than its audio is long leaves that
                piece below the block's maximum.
arc_hunyuan_    as hunyuan_ocr (rows P, W, H, T), and a video is t' frames, each laid out as an
video           image (``<img>``, learnable token, h' rows of w' patches plus ``<newline>``,
                learnable token, ``</img>``), back to back; T counts images and frames
                together, in prompt order.
==============  ===========================================================================

Roles: ``text`` (the description's own text), ``timestamp`` (a video frame's time text),
``vision_start`` / ``vision_end`` (``<|vision_start|>``/``<|vision_end|>``, GLM
``<|begin_of_image|>``/``<|end_of_image|>``, HunyuanOCR ``<image_start>``/``<image_end>``),
``video_start`` / ``video_end`` (GLM ``<|begin_of_video|>``/``<|end_of_video|>``),
``audio_start`` / ``audio_end`` (``<|audio_bos|>``/``<|audio_eos|>``), ``image``, ``video`` and
``audio`` (placeholder tokens, modality 1, 2 and 3; GLM writes its video placeholders with the image
token id, the modality still says video).  No other tokens are added: no chat template, no BOS.

Error messages follow ``<field>=<value>: <rule> (<actual>)``.  Pure Python integers throughout
(the time scale is one float64 product per frame); tensors are built at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The prompt description and the families are the contract's (rope/prompts.py), named here too.
from rope.prompts import (  # noqa: F401 - re-exported
    AUDIO,
    FAMILIES,
    IMAGE,
    OMNI_FAMILIES,
    QWEN2_5_VL_TOKENS_PER_SECOND,
    ROLES,
    TEXT,
    VIDEO,
    XDROPE_FAMILIES,
    Audio,
    Image,
    Prompt,
    Text,
    Video,
    check_family,
    check_segments,
    family_num_dims,
    is_int,
)


# ---------------------------------------------------------------------------------- result
@dataclass(frozen=True, eq=False)
class PromptPositions:
    """What ``prompt_positions`` returns.

    positions: int64 [num_dims, L], rows T, H, W (M-RoPE), P, W, H, T or W, H, T (XD-RoPE).
    delta: the decode offset (``decode_positions``).
    modality: int64 [L], 0 text, 1 image, 2 video (transformers' ``mm_token_type_ids``).
    roles: per token, one of ``ROLES`` (which token id a test should write there).
    """

    family: str
    positions: torch.Tensor
    delta: int
    modality: torch.Tensor
    roles: tuple[str, ...]

    @property
    def length(self) -> int:
        return self.positions.shape[1]

    @property
    def num_dims(self) -> int:
        return self.positions.shape[0]


# ---------------------------------------------------------------------------------- rules
def llm_grid(grid_thw: tuple[int, int, int], spatial_merge_size: int) -> tuple[int, int, int]:
    """(t', h', w') = (t, h / m, w / m): the grid the language model sees."""
    t, h, w = grid_thw
    return t, h // spatial_merge_size, w // spatial_merge_size


def temporal_offsets(family: str, video: Video) -> list[int]:
    """f(ti) for ti = 0 .. t'-1 of a video that is one block (qwen2_vl, qwen2_5_vl).

    qwen2_vl: f(ti) = ti.  qwen2_5_vl: f(ti) = int(ti * second_per_grid * tokens_per_second),
    truncated toward zero, tokens_per_second = 2.
    """
    t = video.grid_thw[0]
    if family == "qwen2_5_vl":
        return [int(ti * video.second_per_grid * QWEN2_5_VL_TOKENS_PER_SECOND) for ti in range(t)]
    return list(range(t))


# The Omni thinkers' position_id_per_seconds (Qwen2.5-Omni's config; Qwen3-Omni's checkpoints set 13,
# the transformers config class default is 25) and Qwen2.5-Omni's seconds_per_chunk.
OMNI_POSITION_ID_PER_SECONDS = {"qwen2_5_omni": 25, "qwen3_omni": 13}
QWEN2_5_OMNI_SECONDS_PER_CHUNK = 2
# Qwen3-Omni's audio encoder works in windows of 2 * n_window = 100 feature frames.
QWEN3_OMNI_AUDIO_WINDOW = 100


def audio_tokens(family: str, frames: int) -> int:
    """Tokens an audio of ``frames`` feature frames becomes in an Omni family.

    qwen2_5_omni: a stride-2 convolution, then a 2-wide average pool:
    ``((frames - 1) // 2 + 1 - 2) // 2 + 1``.  qwen3_omni: 13 tokens per full window of 100
    frames, and for the rest three stride-2 steps: ``f = (rest - 1) // 2 + 1``,
    ``((f - 1) // 2 + 1 - 1) // 2 + 1``.  Floor division throughout (as torch's ``//``).
    """
    if family == "qwen2_5_omni":
        return ((frames - 1) // 2 + 1 - 2) // 2 + 1
    rest = frames % QWEN3_OMNI_AUDIO_WINDOW
    f = (rest - 1) // 2 + 1
    return ((f - 1) // 2 + 1 - 1) // 2 + 1 + (frames // QWEN3_OMNI_AUDIO_WINDOW) * 13


def omni_temporal_offsets(family: str, video: Video, where: str = "video") -> list[int]:
    """f(ti) of an Omni video: ``ti * second_per_grid * pps``, truncated toward zero (qwen2_5_omni)
    or required to be whole (qwen3_omni: ValueError naming ``second_per_grid`` otherwise)."""
    pps = OMNI_POSITION_ID_PER_SECONDS[family]
    out = []
    for ti in range(video.grid_thw[0]):
        value = ti * video.second_per_grid * pps
        if family == "qwen3_omni" and not value.is_integer():
            raise ValueError(
                f"{where}.second_per_grid={video.second_per_grid!r}: qwen3_omni's temporal offset "
                f"ti * second_per_grid * {pps} must be a whole number (got {value!r} at ti={ti}; transformers "
                f"keeps the fraction, vLLM truncates it, int64 position ids cannot hold it)")
        out.append(int(value))
    return out


def chunk_bounds(values: list[int], size: int) -> list[tuple[int, int]]:
    """[start, end) runs of ``values`` (non-decreasing, from 0): a run ends before each value that
    reaches the next multiple of ``size``, one multiple per value (a value that jumps two multiples
    ends one run and the next value ends another).  transformers' Qwen2.5-Omni get_chunked_index."""
    bounds, start, chunk = [], 0, 1
    for i, value in enumerate(values):
        if value >= chunk * size:
            bounds.append((start, i))
            start, chunk = i, chunk + 1
    bounds.append((start, len(values)))
    return bounds


def mrope_delta(positions: torch.Tensor) -> int:
    """max(positions) + 1 - L for M-RoPE positions [num_dims, L] (L >= 1)."""
    return int(positions.max()) + 1 - positions.shape[1]


def decode_positions(n_start: int, count: int, delta: int, num_dims: int) -> torch.Tensor:
    """int64 [num_dims, count]: decode token at absolute index n = n_start + i gets n + delta on every row.

    ``delta`` is the prompt's (``PromptPositions.delta``), fixed once from the full prompt; it is
    0 for XD-RoPE, where every row simply continues the token index.
    """
    for name, value in (("n_start", n_start), ("count", count), ("delta", delta), ("num_dims", num_dims)):
        if not is_int(value):
            raise ValueError(f"{name}={value!r}: must be an int (got {type(value).__name__})")
    if n_start < 0:
        raise ValueError(f"n_start={n_start}: must be >= 0 (got {n_start})")
    if count < 0:
        raise ValueError(f"count={count}: must be >= 0 (got {count})")
    if not 1 <= num_dims <= 4:
        raise ValueError(f"num_dims={num_dims}: must be 1 to 4 (got {num_dims})")
    if n_start + delta < 0:
        raise ValueError(f"delta={delta}: n_start + delta must be >= 0 (got {n_start + delta})")
    row = [n + delta for n in range(n_start, n_start + count)]
    return torch.tensor([row] * num_dims, dtype=torch.int64).reshape(num_dims, count)


# ---------------------------------------------------------------------------------- M-RoPE layout
class _MRopeWriter:
    """Appends tokens left to right and remembers the largest position written so far."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []
        self.modality: list[int] = []
        self.roles: list[str] = []
        self.largest = -1

    def _append(self, t: int, h: int, w: int, modality: int, role: str) -> None:
        self.rows.append((t, h, w))
        self.modality.append(modality)
        self.roles.append(role)
        self.largest = max(self.largest, t, h, w)

    def text(self, count: int, role: str = "text") -> None:
        """``count`` text tokens, each at max(previous) + 1 on all rows."""
        for _ in range(count):
            p = self.largest + 1
            self._append(p, p, p, TEXT, role)

    def same(self, role: str) -> None:
        """One markup token at the previous token's position (Qwen2.5-Omni's second start / end token)."""
        t, h, w = self.rows[-1]
        self._append(t, h, w, TEXT, role)

    def audio(self, count: int) -> None:
        """``count`` audio tokens: text positions on every row."""
        for _ in range(count):
            p = self.largest + 1
            self._append(p, p, p, AUDIO, "audio")

    def block(self, t_offsets: list[int], h: int, w: int, modality: int, role: str) -> None:
        """A vision block of len(t_offsets) x h x w tokens, t-major: (base + f(ti), base + hi, base + wi)."""
        base = self.largest + 1
        for f_ti in t_offsets:
            for hi in range(h):
                for wi in range(w):
                    self._append(base + f_ti, base + hi, base + wi, modality, role)

    def wrapped(self, t_offsets: list[int], h: int, w: int, modality: int, role: str) -> None:
        """``vision_start``, a vision block (:meth:`block`), ``vision_end``."""
        self.text(1, "vision_start")
        self.block(t_offsets, h, w, modality, role)
        self.text(1, "vision_end")

    def runs(self, runs: list[list[tuple[int, int, int, int, str]]]) -> None:
        """Tokens given as runs of (t, h, w, modality, role); the next token continues after the
        largest value of the *last* run (the Omni interleave's rule, see the module docstring)."""
        for run in runs:
            for t, h, w, modality, role in run:
                self._append(t, h, w, modality, role)
        self.largest = max(max(t, h, w) for t, h, w, _, _ in runs[-1])


def _write_mrope(family: str, prompt: Prompt) -> _MRopeWriter:
    out = _MRopeWriter()
    m = prompt.spatial_merge_size
    for seg in prompt.segments:
        if isinstance(seg, Text):
            out.text(seg.length)
            continue
        t, h, w = llm_grid(seg.grid_thw, m)
        if isinstance(seg, Image):
            out.wrapped([0], h, w, IMAGE, "image")
        elif family in ("qwen2_vl", "qwen2_5_vl"):        # the whole video is one block
            out.wrapped(temporal_offsets(family, seg), h, w, VIDEO, "video")
        elif family == "qwen3_vl":                        # one block per frame, time as text before it
            for _ in range(t):
                out.text(seg.timestamp_tokens, "timestamp")
                out.wrapped([0], h, w, VIDEO, "video")
        else:                                             # glm4v: frames inside begin/end of video
            out.text(1, "video_start")
            for _ in range(t):
                out.wrapped([0], h, w, VIDEO, "video")
                out.text(seg.timestamp_tokens, "timestamp")
            out.text(1, "video_end")
    return out


# ---------------------------------------------------------------------------------- Omni layout
def _interleaved(family: str, video: Video, st: int, h: int, w: int, where: str):
    """The runs of an Omni video with its audio, positions from start ``st`` (module docstring)."""
    offsets = omni_temporal_offsets(family, video, where)
    frames = [[(st + f, st + hi, st + wi, VIDEO, "video") for hi in range(h) for wi in range(w)] for f in offsets]
    vision = [tok for frame in frames for tok in frame]
    sound = [(st + i, st + i, st + i, AUDIO, "audio") for i in range(audio_tokens(family, video.audio_frames))]
    if family == "qwen2_5_omni":
        size = OMNI_POSITION_ID_PER_SECONDS[family] * QWEN2_5_OMNI_SECONDS_PER_CHUNK
        v_runs = [vision[a:b] for a, b in chunk_bounds([tok[0] - st for tok in vision], size)]
        a_runs = [sound[a:b] for a, b in chunk_bounds([tok[0] - st for tok in sound], size)]
        runs = []
        for j in range(max(len(v_runs), len(a_runs))):
            runs += v_runs[j:j + 1] + a_runs[j:j + 1]
        return runs
    runs, vi, ai = [], 0, 0                              # qwen3_omni: merge on T, video first on a tie
    while vi < len(vision) and ai < len(sound):
        if vision[vi][0] <= sound[ai][0]:
            runs.append([vision[vi]])
            vi += 1
        else:
            runs.append([sound[ai]])
            ai += 1
    runs.append(vision[vi:] or sound[ai:])               # one stream always outlasts the other
    return runs


def _write_omni(family: str, prompt: Prompt) -> _MRopeWriter:
    out = _MRopeWriter()
    m = prompt.spatial_merge_size
    for i, seg in enumerate(prompt.segments):
        where = f"segments[{i}]"
        if isinstance(seg, Text):
            out.text(seg.length)
            continue
        if isinstance(seg, Audio):
            count = audio_tokens(family, seg.frames)
            if count < 1:
                raise ValueError(f"{where}.frames={seg.frames}: {family} makes {count} audio tokens of it (needs >= 1)")
            out.text(1, "audio_start")
            out.audio(count)
            out.text(1, "audio_end")
            continue
        t, h, w = llm_grid(seg.grid_thw, m)
        if isinstance(seg, Image):
            out.wrapped([0], h, w, IMAGE, "image")
        elif seg.audio_frames is None:
            out.wrapped(omni_temporal_offsets(family, seg, where), h, w, VIDEO, "video")
        else:
            if audio_tokens(family, seg.audio_frames) < 1:
                raise ValueError(f"{where}.audio_frames={seg.audio_frames}: {family} makes "
                                 f"{audio_tokens(family, seg.audio_frames)} audio tokens of it (needs >= 1)")
            shared = family == "qwen2_5_omni"            # both start tokens at one position
            out.text(1, "vision_start")
            out.same("audio_start") if shared else out.text(1, "audio_start")
            out.runs(_interleaved(family, seg, out.largest + 1, h, w, where))
            out.text(1, "audio_end")
            out.same("vision_end") if shared else out.text(1, "vision_end")
    return out


# ---------------------------------------------------------------------------------- XD-RoPE layout
def _write_xdrope(family: str, prompt: Prompt) -> tuple[torch.Tensor, list[int], list[str]]:
    """Rows [P, W, H, T] per token as a [4, tokens] tensor (the caller drops P for hunyuan_ocr_3d),
    modality, roles."""
    blocks: list[torch.Tensor] = []        # [4, k] each, the tokens in order
    modality: list[int] = []
    roles: list[str] = []

    def add(block: torch.Tensor, role: str, kind: int) -> None:
        blocks.append(block)
        modality.extend([kind] * block.shape[1])
        roles.extend([role] * block.shape[1])

    def plain(count: int, role: str, kind: int = TEXT) -> None:
        n = len(roles)                                                   # the tokens so far
        add(torch.arange(n, n + count).expand(4, count), role, kind)     # every row the plain index

    m = prompt.spatial_merge_size
    image_ordinal = 0
    for seg in prompt.segments:
        if isinstance(seg, Text):
            plain(seg.length, "text")
            continue
        t, h, w = llm_grid(seg.grid_thw, m)
        for _ in range(t if isinstance(seg, Video) else 1):    # arc_hunyuan_video: a frame is an image
            plain(1, "vision_start")
            plain(1, "image", IMAGE)                   # ViT begin token: plain index
            # h rows of w' patches then the row-end token, row by row: P the plain index, W the
            # column (the row-end token's is w'), H the row, T the image's ordinal.
            n = len(roles)
            count = h * (w + 1)
            add(torch.stack((torch.arange(n, n + count), torch.arange(w + 1).repeat(h),
                             torch.arange(h).repeat_interleave(w + 1), torch.full((count,), image_ordinal))),
                "image", IMAGE)
            plain(1, "image", IMAGE)                   # ViT end token: plain index
            plain(1, "vision_end")
            image_ordinal += 1
    return torch.cat(blocks, dim=1) if blocks else torch.empty(4, 0, dtype=torch.int64), modality, roles


# ---------------------------------------------------------------------------------- entry point
def prompt_positions(family: str, prompt: Prompt) -> PromptPositions:
    """Prefill position ids, decode delta, modality and roles of ``prompt`` laid out as ``family`` does.

    The layout adds the family's markup tokens (vision start/end, GLM video begin/end, per-frame
    timestamps; see the module docstring) around each image and video; nothing else.
    Raises ValueError for an unknown family, a segment the family cannot take (a video in
    HunyuanOCR, audio outside the Omni families), an audio of no tokens, a fractional Qwen3-Omni
    temporal offset, or 0 tokens.
    """
    check_family(family)
    if not isinstance(prompt, Prompt):
        raise ValueError(f"prompt={prompt!r}: must be a Prompt (got {type(prompt).__name__})")
    check_segments(family, prompt)
    if family in XDROPE_FAMILIES:
        positions, modality, roles = _write_xdrope(family, prompt)
        if family == "hunyuan_ocr_3d":
            positions = positions[1:]                  # W, H, T
    else:
        out = (_write_omni if family in OMNI_FAMILIES else _write_mrope)(family, prompt)
        positions = torch.tensor(out.rows, dtype=torch.int64).T if out.rows else torch.empty(3, 0, dtype=torch.int64)
        modality, roles = out.modality, out.roles
    if not modality:
        raise ValueError(f"segments={prompt.segments!r}: must produce at least one token (got 0 tokens)")
    positions = positions.contiguous()
    delta = 0 if family in XDROPE_FAMILIES else mrope_delta(positions)
    return PromptPositions(
        family=family,
        positions=positions,
        delta=delta,
        modality=torch.tensor(modality, dtype=torch.int64),
        roles=tuple(roles),
    )


__all__ = [
    "FAMILIES", "OMNI_FAMILIES", "XDROPE_FAMILIES", "TEXT", "IMAGE", "VIDEO", "AUDIO", "ROLES",
    "QWEN2_5_VL_TOKENS_PER_SECOND", "OMNI_POSITION_ID_PER_SECONDS", "QWEN2_5_OMNI_SECONDS_PER_CHUNK",
    "Text", "Image", "Video", "Audio", "Prompt", "PromptPositions",
    "check_family", "family_num_dims", "llm_grid", "temporal_offsets", "omni_temporal_offsets", "audio_tokens",
    "chunk_bounds", "mrope_delta",
    "decode_positions", "prompt_positions",
]
