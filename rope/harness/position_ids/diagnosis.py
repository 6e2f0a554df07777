"""Where a position-id implementation departs from the expected ids, and what the departure looks like.

:func:`compare` finds the first differing token (column), the rows that differ there, the prompt
segment and role of that token; :func:`diagnose` names the pattern, each label one way this field
has shipped position ids wrong (docs/spec.md §4):

==============================  ===========================================================================
label                           what the implementation returned
==============================  ===========================================================================
video_as_text                   a video's tokens at text positions (all rows equal, one apart; vllm#33039)
frames_not_split                Qwen3-VL / GLM video tokens whose temporal row moves inside the video
                                instead of staying constant per frame (transformers#44474)
temporal_scale_truncated        Qwen2.5-VL temporal offsets int(ti * int(spg) * 2): seconds per grid cut
                                to an int before scaling (transformers#48669, lmms-eval#1393)
temporal_scale_wrong            any other temporal row of a video block (time scale, frame spacing)
text_after_video_restart        the video itself right, the tokens after it restarting below max + 1
                                (transformers >= 5.3 resumes at start + max(h', w'))
ordinal_across_batch            an XD-RoPE image's T row offset by a constant: the image ordinal counted
                                across the batch instead of per prompt (HunYuanVL in transformers 5.13+)
zero_taken_as_missing           a position that must be 0 replaced (0 taken for "no position", rtp-llm#1213)
audio_start_not_shared          Qwen2.5-Omni's start (or end) tokens of a video with audio at two positions,
                                not one (the audio bos / eos counted twice, vllm#16878)
image_end_shifted               an image's end token one below its place, with what follows (the shared-end
                                shift of a video with audio applied to an image, vllm#16878)
audio_rows_held                 audio tokens whose H and W rows stay at the clip's first position while T
                                advances (mstar#196)
temporal_scale_default          an Omni video's temporal row at the default seconds per grid (1.0 / 2.0),
                                not its own (the processor's value never found, vllm#23056)
audio_in_video_not_interleaved  a video's audio laid out as a clip after the video instead of interleaved
                                with its frames (one use_audio_in_video for videos with and without
                                audio, VeOmni#493)
vision_block_wrong              an image / video block's spatial rows
text_wrong                      a text or markup token
delta_wrong                     positions right, delta not max + 1 - L (e.g. recomputed per prefill
                                chunk, vllm#10403)
negative_delta_clamped          positions right, a negative delta returned as 0 (LightLLM#1147)
==============================  ===========================================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from reference.position_ids import llm_grid, prompt_positions
from rope.prompts import (IMAGE, OMNI_FAMILIES, QWEN2_5_VL_TOKENS_PER_SECOND, VIDEO, XDROPE_FAMILIES, Audio, Prompt,
                          Video)

LABELS = ("video_as_text", "frames_not_split", "temporal_scale_truncated", "temporal_scale_wrong",
          "text_after_video_restart", "ordinal_across_batch", "zero_taken_as_missing", "audio_start_not_shared",
          "image_end_shifted", "audio_rows_held", "temporal_scale_default", "audio_in_video_not_interleaved",
          "vision_block_wrong", "text_wrong", "delta_wrong", "negative_delta_clamped")
# The seconds per grid engines fell back to when the processor's value was not found.
OMNI_DEFAULT_SECOND_PER_GRID = {"qwen2_5_omni": 1.0, "qwen3_omni": 2.0}


@dataclass(frozen=True)
class PositionIdsMismatch:
    """The first departure of ``got`` from ``expected`` and its diagnosis."""

    family: str
    token: int | None               # first differing column; None when only the delta differs
    rows: tuple[int, ...]           # rows that differ at that token
    segment: int | None             # index into prompt.segments of that token
    role: str | None                # reference.ROLES of that token
    got: tuple[int, ...] | None     # all rows at that token
    expected: tuple[int, ...] | None
    num_differing: int              # tokens (columns) that differ anywhere
    got_delta: int
    expected_delta: int
    label: str
    sentence: str

    def to_dict(self) -> dict:
        return {"token": self.token, "rows": list(self.rows), "segment": self.segment, "role": self.role,
                "got": None if self.got is None else list(self.got),
                "expected": None if self.expected is None else list(self.expected),
                "num_differing": self.num_differing, "got_delta": self.got_delta,
                "expected_delta": self.expected_delta}

    def describe(self) -> str:
        if self.token is None:
            where = f"positions agree; delta {self.got_delta}, expected {self.expected_delta}"
        else:
            where = (f"{self.num_differing} token(s) differ; first at token {self.token} (segment {self.segment}, "
                     f"{self.role}), rows {list(self.rows)}: got {list(self.got)}, expected {list(self.expected)}; "
                     f"delta {self.got_delta}, expected {self.expected_delta}")
        return f"{where}\ndiagnosis: {self.label}: {self.sentence}"


def segment_spans(family: str, prompt: Prompt) -> list[tuple[int, int]]:
    """[start, end) of each segment's tokens (markup included) in the family's layout."""
    spans, start = [], 0
    for i in range(len(prompt.segments)):
        head = Prompt(prompt.segments[: i + 1], prompt.spatial_merge_size)
        try:
            end = prompt_positions(family, head).length
        except ValueError:          # a prefix of empty text runs: no tokens yet
            end = 0
        spans.append((start, end))
        start = end
    return spans


def compare(family: str, prompt: Prompt, got: torch.Tensor, got_delta: int, expected: torch.Tensor,
            expected_delta: int) -> PositionIdsMismatch | None:
    """None when positions (same shape, checked before) and delta agree, else the first departure."""
    differ = (got != expected).any(dim=0)
    if not bool(differ.any()) and got_delta == expected_delta:
        return None
    if not bool(differ.any()):
        label, sentence = _diagnose_delta(got, got_delta, expected_delta)
        return PositionIdsMismatch(family, None, (), None, None, None, None, 0, got_delta, expected_delta,
                                   label, sentence)
    token = int(differ.nonzero()[0])
    rows = tuple(int(r) for r in (got[:, token] != expected[:, token]).nonzero().flatten())
    spans = segment_spans(family, prompt)
    segment = next(i for i, (a, b) in enumerate(spans) if a <= token < b)
    roles = prompt_positions(family, prompt).roles
    label, sentence = _diagnose_positions(family, prompt, got, expected, token, segment, spans)
    return PositionIdsMismatch(family, token, rows, segment, roles[token], tuple(got[:, token].tolist()),
                               tuple(expected[:, token].tolist()), int(differ.sum()), got_delta, expected_delta,
                               label, sentence)


# ------------------------------------------------------------------------------------------ rules
def _diagnose_delta(positions: torch.Tensor, got: int, want: int) -> tuple[str, str]:
    if want < 0 and got == 0:
        return ("negative_delta_clamped", f"the positions are right but the negative delta {want} came back as 0: "
                "decode tokens then sit |delta| places too far on (a delta clamped or taken as unsigned)")
    length = positions.shape[1]
    for k in range(1, length):
        if int(positions[:, :k].max()) + 1 - k == got:
            return ("delta_wrong", f"the positions are right but delta is {got}, not {want}: it equals max + 1 - L "
                    f"over the first {k} of {length} tokens (a delta computed from one prefill chunk instead of "
                    f"the whole prompt)")
    return "delta_wrong", f"the positions are right but delta is {got}, not max + 1 - L = {want}"


def _alternative(family: str, prompt: Prompt, segments) -> torch.Tensor | None:
    """The reference's ids of ``prompt`` with other segments (same length), or None."""
    try:
        positions = prompt_positions(family, Prompt(tuple(segments), prompt.spatial_merge_size)).positions
    except ValueError:
        return None
    return positions


def _diagnose_omni(family, prompt, got, want, token, segment, spans, roles) -> tuple[str, str] | None:
    seg = prompt.segments[segment]
    role, before = roles[token], roles[token - 1] if token else None
    diff = (got[:, token] - want[:, token]).tolist()
    if family == "qwen2_5_omni" and (before, role) == ("vision_start", "audio_start") and diff == [1, 1, 1]:
        return ("audio_start_not_shared", f"the audio start token {token} of the video of segment {segment} is one "
                "past the vision start: Qwen2.5-Omni gives both start tokens (and both end tokens) one position")
    if (before, role) == ("image", "vision_end") and diff == [-1, -1, -1]:
        return ("image_end_shifted", f"the end token {token} of the image of segment {segment} is one below its "
                "place: the shared end-token shift of a video with audio applied to an image")
    if role == "audio" and diff[0] == 0 and before in ("audio_start", "audio"):
        return ("audio_rows_held", f"audio token {token} (segment {segment}) has T right but H, W at "
                f"{got[1:, token].tolist()}: audio tokens take text positions on every row")
    if isinstance(seg, Video):
        a, b = spans[segment]
        default = [dataclasses.replace(s, second_per_grid=OMNI_DEFAULT_SECOND_PER_GRID[family])
                   if isinstance(s, Video) else s for s in prompt.segments]
        alt = _alternative(family, prompt, default)
        if alt is not None and torch.equal(got[:, a:b], alt[:, a:b]):
            return ("temporal_scale_default", f"the video of segment {segment} has the temporal row of seconds per grid "
                    f"{OMNI_DEFAULT_SECOND_PER_GRID[family]} (the default), not its own {seg.second_per_grid}")
        if seg.audio_frames is not None:
            split = [*prompt.segments[:segment], dataclasses.replace(seg, audio_frames=None), Audio(seg.audio_frames),
                     *prompt.segments[segment + 1:]]
            alt = _alternative(family, prompt, split)
            if alt is not None and torch.equal(got[:, a:b], alt[:, a:b]):
                return ("audio_in_video_not_interleaved", f"the video of segment {segment} and its audio are laid out "
                        "one after the other, not interleaved by time (use_audio_in_video off for this video)")
    return None


def _diagnose_positions(family, prompt, got, want, token, segment, spans) -> tuple[str, str]:
    seg = prompt.segments[segment]
    a, b = spans[segment]
    ref = prompt_positions(family, prompt)
    if family in OMNI_FAMILIES:
        found = _diagnose_omni(family, prompt, got, want, token, segment, spans, ref.roles)
        if found is not None:
            return found
    # The vision tokens of this segment (of a video, the video's own: an Omni video's audio is not).
    video = isinstance(seg, Video) and family not in XDROPE_FAMILIES
    block = ref.modality[a:b] == VIDEO if video else ref.modality[a:b] != 0
    cols = torch.arange(a, b)[block]
    if isinstance(seg, Video) and cols.numel() and family not in XDROPE_FAMILIES:
        g, e = got[:, cols], want[:, cols]
        increasing = bool((g[0, 1:] > g[0, :-1]).all())
        if bool((g == g[:1]).all()) and increasing and not bool((e == e[:1]).all()):
            return ("video_as_text", f"the {cols.numel()} video tokens of segment {segment} got text positions "
                    f"(every row equal and increasing, from {int(g[0, 0])}): the video was not recognised as vision")
        t, h, w = llm_grid(seg.grid_thw, prompt.spatial_merge_size)
        if family in ("qwen3_vl", "glm4v"):
            frames_t, frames_h = g[0].reshape(t, h * w), g[1].reshape(t, h * w)
            moves = bool((frames_t != frames_t[:, :1]).any())
            reused = t > 1 and bool((frames_h == frames_h[:1]).all()) and not bool(
                (e[1].reshape(t, h * w) == e[1].reshape(t, h * w)[:1]).all())
            if moves or reused:
                return ("frames_not_split", f"the video of segment {segment} was laid out as one (t, h', w') block: "
                        f"{'the temporal row moves inside a frame' if moves else 'every frame reuses the first frame spatial base'}"
                        f", not one (1, h', w') grid per frame after the text between frames")
        rows_wrong = (g != e).any(dim=1).nonzero().flatten().tolist()
        if rows_wrong == [0]:
            base = int(e[0, 0])
            offsets = (g[0].reshape(t, h * w)[:, 0] - base).tolist()
            truncated = [int(ti * int(seg.second_per_grid) * QWEN2_5_VL_TOKENS_PER_SECOND) for ti in range(t)]
            if family == "qwen2_5_vl" and offsets == truncated:
                return ("temporal_scale_truncated", f"temporal offsets {offsets} = int(ti * int({seg.second_per_grid})"
                        f" * {QWEN2_5_VL_TOKENS_PER_SECOND}): seconds per grid cut to an int before scaling")
            return ("temporal_scale_wrong", f"the temporal row of the video of segment {segment} is wrong (offsets "
                    f"{offsets}), its spatial rows right")
    if ref.modality[token] == 0:
        videos = [(i, spans[i]) for i in range(segment + 1) if isinstance(prompt.segments[i], Video)]
        for i, (va, vb) in reversed(videos):
            vcols = torch.arange(va, vb)[ref.modality[va:vb] != 0]
            if vcols.numel() and int(vcols[-1]) < token:
                if bool((got[:, vcols] == want[:, vcols]).all()) and int(got[:, token].max()) < int(want[:, token].min()):
                    return ("text_after_video_restart", f"the video of segment {i} is right but token {token} after "
                            f"it restarts at {got[:, token].tolist()}, below max + 1 = {int(want[0, token])}")
                break
    if family in XDROPE_FAMILIES and cols.numel() and ref.modality[token] == IMAGE:
        d = got[:, cols] - want[:, cols]
        shifted = d[-1][d[-1] != 0]
        if bool((d[:-1] == 0).all()) and shifted.numel() and bool((shifted == shifted[0]).all()) and int(shifted[0]) > 0:
            return ("ordinal_across_batch", f"the T row of the image of segment {segment} is offset by "
                    f"{int(shifted[0])}: the image ordinal counted across the batch (or across earlier prompts) "
                    f"instead of per prompt")
    zero_rows = ((want[:, token] == 0) & (got[:, token] != 0)).nonzero().flatten().tolist()
    if zero_rows:
        return ("zero_taken_as_missing", f"token {token} must be 0 on rows {zero_rows} and got "
                f"{got[:, token].tolist()}: a 0 taken for 'no position' and filled in")
    if ref.modality[token] in (IMAGE, VIDEO):
        return "vision_block_wrong", f"the vision block of segment {segment} is wrong at token {token}"
    return "text_wrong", f"text or markup token {token} (segment {segment}) is wrong"
