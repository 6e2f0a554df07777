"""Reported transformers divergences kept in the regression corpus
(tests/reference/regressions/*.json) and replayed on every run: the reference must still
give its recorded values, and where the installed transformers is in the recorded version range
its get_rope_index must still give the recorded divergent values (a fix upstream fails this test,
so the pin is revisited)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference.position_ids import prompt_positions
from rope.prompts import Image, Prompt, Text, Video

CORPUS = Path(__file__).parent / "regressions"
FILES = sorted(CORPUS.glob("*.json"))


def _prompt(d: dict) -> Prompt:
    segments = []
    for seg in d["segments"]:
        if "text" in seg:
            segments.append(Text(seg["text"]))
        elif "image" in seg:
            segments.append(Image(tuple(seg["image"])))
        else:
            segments.append(Video(tuple(seg["video"]), second_per_grid=seg.get("second_per_grid", 1.0)))
    return Prompt(tuple(segments), spatial_merge_size=d["spatial_merge_size"])


def test_corpus_has_the_reported_divergences():
    assert {json.loads(p.read_text())["mismatch"] for p in FILES} >= {"cursor_after_video", "hunyuan_vl_block_layout"}


POSITION_FILES = [p for p in FILES if "prompt" in json.loads(p.read_text())]


@pytest.mark.parametrize("path", POSITION_FILES, ids=[p.stem for p in POSITION_FILES])
def test_reference_still_gives_the_recorded_positions(path):
    rec = json.loads(path.read_text())
    got = prompt_positions(rec["family"], _prompt(rec["prompt"]))
    assert (got.positions.tolist(), got.delta) == (rec["reference"]["positions"], rec["reference"]["delta"])
    assert rec["reference"] != rec["transformers"], "a divergence file must record a divergence"


@pytest.mark.oracle
@pytest.mark.parametrize("path", POSITION_FILES, ids=[p.stem for p in POSITION_FILES])
def test_transformers_still_diverges_as_recorded(path):
    from rope.backends.transformers import position_ids as hf
    rec = json.loads(path.read_text())
    reason = hf.family_unavailable(rec["family"])
    if reason:
        pytest.skip(reason)
    mismatch = hf.KNOWN_MISMATCHES[rec["mismatch"]]
    if not mismatch.active():
        pytest.skip(f"{rec['mismatch']} not in transformers {hf.TRANSFORMERS_VERSION}")
    assert (mismatch.since, mismatch.until) == (rec["transformers_since"], rec["transformers_until"])
    pos, delta = hf.position_ids_transformers(rec["family"], _prompt(rec["prompt"]))
    assert (pos.tolist(), delta) == (rec["transformers"]["positions"], rec["transformers"]["delta"])


LAYOUT_FILES = [p for p in FILES if json.loads(p.read_text())["mismatch"] == "hunyuan_vl_block_layout"]


@pytest.mark.oracle      # the canonical layout's helper lives beside transformers' (tests/reference/hf_oracle.py)
@pytest.mark.parametrize("path", LAYOUT_FILES, ids=[p.stem for p in LAYOUT_FILES])
def test_reference_channel_rows_are_the_recorded_canonical_layout(path):
    from tests.reference.hf_oracle import canonical_channel_map
    from rope.spec import RopeSpec
    rec = json.loads(path.read_text())
    rows, _ = canonical_channel_map(RopeSpec.from_dict(rec["spec"]), neox_order=True)
    assert rows.tolist() == rec["reference_channel_rows"] != rec["transformers_channel_rows"]


@pytest.mark.oracle
@pytest.mark.parametrize("path", LAYOUT_FILES, ids=[p.stem for p in LAYOUT_FILES])
def test_transformers_hunyuan_vl_still_uses_the_recorded_block_layout(path):
    import torch

    from tests.reference import hf_oracle
    from rope.cache import cos_sin_cache
    from rope.spec import RopeSpec
    rec = json.loads(path.read_text())
    family = hf_oracle.FAMILIES[rec["family"]]
    reason = hf_oracle.unavailable_reason(family)
    if reason:
        pytest.skip(reason)
    spec = RopeSpec.from_dict(rec["spec"])
    flat = torch.tensor(rec["positions"])
    t = flat.shape[1]
    q = torch.randn(t, 2 * spec.head_size, dtype=torch.float64)
    run = hf_oracle.hf_rotate(family, spec, flat[:, None, :], hf_oracle.to_hf_heads(q, 1, spec.head_size),
                              hf_oracle.to_hf_heads(q[:, :spec.head_size], 1, spec.head_size))
    if run.per_row:
        pytest.skip("transformers <= 5.16 recomposes cos/sin inside the rotation function (checked by "
                    "test_transformers_oracle.py)")
    cache = cos_sin_cache(spec, torch.float32)
    _, freqs = hf_oracle.canonical_channel_map(spec, neox_order=True)
    recorded, _ = hf_oracle.gather_channels(cache, flat, torch.tensor(rec["transformers_channel_rows"]), freqs)
    canonical, _ = hf_oracle.gather_channels(cache, flat, torch.tensor(rec["reference_channel_rows"]), freqs)
    got = run.cos.reshape(-1, spec.rotary_dim).to(torch.float64)
    assert torch.equal(got, recorded), "transformers HunYuanVL no longer uses the recorded block layout"
    assert not torch.equal(got, canonical)
