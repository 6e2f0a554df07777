"""transformers' own rotary modules agree with ``reference.rotate`` (docs/spec.md §1-3), weight-free.

For each family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL (+MoE), GLM-4.1V, GLM-OCR, GLM-4.5V, HunYuanVL) a config
is built from the drawn RopeSpec, transformers' rotary module computes cos/sin for the drawn positions and the
family's own rotation function rotates float64 q/k (``tests/reference/hf_oracle.py``).  Each test checks

1. ``attention_scaling == 1.0`` (the "default" / NTK-alpha rope types scale nothing);
2. transformers' cos/sin are *bit-identical* to ``rope.cache.cos_sin_cache(spec, float32)`` read at the
   positions through the expected axis map (same float32 recipe: inv_freq, p * inv_freq, cos, sin);
3. the rotated q/k agree with the reference within ``rope.harness.rotation.bound``'s per-element bound for the
   family's working precision (float64, or float32 where the family upcasts; see TOLERANCE below).

HunYuanVL disagrees with the canonical XD-RoPE layout on image tokens (docs/spec.md §2): text tokens are
checked for agreement, image tokens for the exact transformers layout, modelled here in float64.

Real configurations come from ``models.yaml`` (keys as there), with the cache cut to MAX_POSITION rows:
the cache length changes no value at the positions drawn.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install .[oracle])")

import torch  # noqa: E402
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from packaging.version import Version  # noqa: E402

import reference  # noqa: E402
from tests.reference import hf_oracle  # noqa: E402
from tests.reference.hf_oracle import (  # noqa: E402
    FAMILIES,
    KNOWN_MISMATCH_HUNYUAN_VL,
    TRANSFORMERS_VERSION,
    assert_within,
    canonical_channel_map,
    channel_bound,
    from_hf_heads,
    gather_channels,
    hf_rotate,
    to_hf_heads,
)
from properties.strategies import sections  # noqa: E402
from rope.cache import cos_sin_cache  # noqa: E402
from rope.models import get_model  # noqa: E402
from rope.spec import RopeSpec  # noqa: E402
from rope.harness.rotation.bound import compare_rotation  # noqa: E402

pytestmark = pytest.mark.oracle

MAX_POSITION = 4096   # cache rows; every drawn position is below it (docs/spec.md §1), and so below the
                      # config's max_position_embeddings (5.16/5.17 HunYuanVL "dynamic" never rescales)
MAX_TOKENS = 64       # B * L
POSITION_KINDS = ("text", "grid", "random")
GRID_STYLES = ("mrope", "xd")


# ------------------------------------------------------------------------------------------ cases
@dataclasses.dataclass(frozen=True)
class OracleCase:
    """One comparison, rebuilt from plain values: spec, shapes, a positions plan and the tensor seed.

    positions: "text" (all rows equal, consecutive), "grid" (a vision block, rows differ) or "random"
    (every row drawn independently).  Grids: ``grid_style`` "mrope" is a Qwen2-VL block of (t, h, w)
    tokens at ``base + (ti, hi, wi)`` (docs/spec.md §4); "xd" is a HunyuanOCR image of h rows of w columns plus a
    row-end token: W = column 0..w, H = row, T = ``grid[0]`` (the image ordinal), P = the plain index.
    Text runs continue at max + 1.  Each batch sample starts at its own offset, drawn from ``seed``.
    """

    spec: RopeSpec
    batch: int
    seq_len: int
    num_q_heads: int
    num_kv_heads: int
    positions: str = "text"
    grid_style: str = "mrope"
    prefix: int = 0
    grid: tuple[int, int, int] = (1, 1, 1)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.positions not in POSITION_KINDS:
            raise ValueError(f"positions={self.positions!r}: must be one of {POSITION_KINDS}")
        if self.grid_style not in GRID_STYLES:
            raise ValueError(f"grid_style={self.grid_style!r}: must be one of {GRID_STYLES}")
        if not 1 <= self.batch * self.seq_len <= self.spec.max_position:
            raise ValueError(f"batch*seq_len={self.batch * self.seq_len}: must be in [1, max_position]")
        if self.positions == "grid" and self.prefix + self.block_tokens > self.seq_len:
            raise ValueError(f"grid={self.grid}: prefix {self.prefix} + block {self.block_tokens} tokens "
                             f"must fit seq_len={self.seq_len}")

    @property
    def block_tokens(self) -> int:
        t, h, w = self.grid
        return t * h * w if self.grid_style == "mrope" else h * (w + 1)

    @property
    def num_tokens(self) -> int:
        return self.batch * self.seq_len


def build_positions(case: OracleCase, generator: torch.Generator) -> torch.Tensor:
    """int64 [rows, B, L] following the case's plan; values < spec.max_position."""
    rows, seq = case.spec.num_dims, case.seq_len
    if case.positions == "random":
        return torch.randint(0, case.spec.max_position, (rows, case.batch, seq), generator=generator)
    # Every position is at most start + seq - 1, so starts up to max_position - seq keep them in range.
    starts = torch.randint(0, case.spec.max_position - seq + 1, (case.batch,), generator=generator)
    out = torch.empty(rows, case.batch, seq, dtype=torch.long)
    for b, start in enumerate(starts.tolist()):
        plain = start + torch.arange(seq)
        sample = plain.expand(rows, seq).clone()
        if case.positions == "grid":
            lo, hi = case.prefix, case.prefix + case.block_tokens
            if case.grid_style == "mrope":
                t, h, w = case.grid
                base = start + case.prefix
                ti, hi_, wi = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
                sample[:, lo:hi] = base + torch.stack([ti.flatten(), hi_.flatten(), wi.flatten()])
                # text after the block continues at max(block) + 1 on every row
                sample[:, hi:] = base + max(t, h, w) + torch.arange(seq - hi)
            else:
                k, h, w = case.grid
                j = torch.arange(case.block_tokens)
                w_h_t = torch.stack([j % (w + 1), j // (w + 1), torch.full_like(j, k)])
                sample[rows - 3:, lo:hi] = w_h_t      # 4 rows: P stays the plain index
        out[:, b] = sample
    return out


def build_tensors(case: OracleCase):
    """positions [rows, B, L] and float64 query/key [B*L, heads*head_size] (float32-representable)."""
    g = torch.Generator().manual_seed(case.seed)
    positions = build_positions(case, g)
    d = case.spec.head_size
    query = torch.randn(case.num_tokens, case.num_q_heads * d, generator=g).to(torch.float64)
    key = torch.randn(case.num_tokens, case.num_kv_heads * d, generator=g).to(torch.float64)
    return positions, query, key


# ------------------------------------------------------------------------------------- strategies
@st.composite
def oracle_cases(draw, *, layout: str, is_neox_style: bool, rotary_fractions=(1.0,), rows=(3,),
                 ntk_alphas=(None,), bases=(10000.0, 1000000.0, 5000000.0), kinds=POSITION_KINDS,
                 grid_style: str = "mrope", min_tokens: int = 1, max_tokens: int = MAX_TOKENS):
    """OracleCase for one family's variant; shrinks towards 3 frequencies, 1 token, 1 head, text.

    Args:
        rotary_fractions: rotary_dim / head_size values to draw from (GLM: 0.5).
        rows: position row counts (M-RoPE 3; XD-RoPE 3 or 4).
        ntk_alphas: XD-RoPE NTK alpha values (None: plain base).
        kinds: position plans, simplest first.
    """
    for name, value in (("rotary_fractions", rotary_fractions), ("rows", rows), ("ntk_alphas", ntk_alphas),
                        ("bases", bases), ("kinds", kinds)):
        if not value:
            raise ValueError(f"{name}={value!r}: must not be empty")
    if not set(kinds) <= set(POSITION_KINDS):
        raise ValueError(f"kinds={kinds!r}: must be a subset of {POSITION_KINDS}")
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens={min_tokens}, max_tokens={max_tokens}: need 1 <= min_tokens <= max_tokens")

    num_rows = draw(st.sampled_from(rows))
    num_freqs = draw(st.integers(max(num_rows, 3), 64))
    fraction = draw(st.sampled_from(rotary_fractions))
    rotary_dim = 2 * num_freqs
    head_size = int(rotary_dim / fraction)
    spec = RopeSpec(head_size=head_size, rotary_dim=rotary_dim, is_neox_style=is_neox_style,
                    sections=draw(sections(total=num_freqs, parts=num_rows)), layout=layout,
                    base=draw(st.sampled_from(bases)), max_position=MAX_POSITION,
                    ntk_alpha=draw(st.sampled_from(ntk_alphas)))

    batch = draw(st.integers(1, 2))
    seq_len = draw(st.integers(max(1, -(-min_tokens // batch)), max_tokens // batch))
    num_q_heads = draw(st.integers(1, 4))
    num_kv_heads = draw(st.integers(1, num_q_heads))
    kind = draw(st.sampled_from(kinds))
    prefix, grid = 0, (1, 1, 1)
    if kind == "grid":
        if grid_style == "mrope":
            prefix = draw(st.integers(0, seq_len - 1))
            room = seq_len - prefix
            h = draw(st.integers(1, min(room, 16)))
            w = draw(st.integers(1, min(room // h, 16)))
            t = draw(st.integers(1, min(room // (h * w), 4)))
            grid = (t, h, w)
        elif seq_len >= 2:        # an XD image row holds at least one column and its row-end token
            prefix = draw(st.integers(0, seq_len - 2))
            room = seq_len - prefix
            w = draw(st.integers(1, min(room - 1, 16)))
            h = draw(st.integers(1, room // (w + 1)))
            grid = (draw(st.integers(0, 3)), h, w)
        else:
            kind = "random" if "random" in kinds else "text"
    return OracleCase(spec=spec, batch=batch, seq_len=seq_len, num_q_heads=num_q_heads,
                      num_kv_heads=num_kv_heads, positions=kind, grid_style=grid_style, prefix=prefix,
                      grid=grid, seed=draw(st.integers(0, 2 ** 32 - 1)))


# ---------------------------------------------------------------------------------------- checks
def _skip_marks(*keys: str):
    reasons = [r for r in (hf_oracle.unavailable_reason(FAMILIES[k]) for k in keys) if r]
    return [pytest.mark.skip(reason="; ".join(reasons))] if reasons else []


def _families(*keys: str):
    return [pytest.param(FAMILIES[k], id=k, marks=_skip_marks(k)) for k in keys]


def _what(family, run, name: str, case: OracleCase, against: str) -> str:
    return (f"transformers {TRANSFORMERS_VERSION} {run.function} ({family.key}) vs {against}: {name}\n"
            f"case: {case}")


def check_cos_sin(family, run, spec: RopeSpec, positions: torch.Tensor, cache: torch.Tensor,
                  orders: dict[str, tuple[torch.Tensor, torch.Tensor]], case: OracleCase) -> None:
    """transformers' cos/sin are bit-identical to ``cache`` read at ``positions`` [rows, T].

    Per-row cos/sin (<= 5.16) must hold every row's values in NeoX order; recomposed cos/sin must match
    one of ``orders`` (name -> per-channel (row, frequency) map).
    """
    rd = spec.rotary_dim
    if run.per_row:
        for r in range(spec.num_dims):
            cos, sin = gather_channels(cache, positions, *hf_oracle.row_channel_map(spec, r))
            for name, got, want in (("cos", run.cos[r], cos), ("sin", run.sin[r], sin)):
                hf_oracle.assert_bitwise(got.reshape(-1, rd), want,
                                         what=_what(family, run, f"{name} row {r}", case, "cos_sin_cache"))
        return
    actual_cos, actual_sin = run.cos.reshape(-1, rd), run.sin.reshape(-1, rd)
    failures = []
    for name, (rows, freqs) in orders.items():
        cos, sin = gather_channels(cache, positions, rows, freqs)
        if torch.equal(actual_cos, cos) and torch.equal(actual_sin, sin):
            return
        failures.append(f"{name}: {int((actual_cos != cos).sum())} cos and {int((actual_sin != sin).sum())} sin "
                        f"of {cos.numel()} elements differ")
    raise AssertionError(_what(family, run, "cos/sin", case, "cos_sin_cache at the positions") +
                         "\nnot bit-identical in any expected channel order:\n" + "\n".join(failures))


def canonical_orders(spec: RopeSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Channel orders a recomposed cos may take: NeoX cat(f, f); GPT-J families repeat_interleave(f, 2)
    from 5.17 on (<= 5.16 glm4v returned cat(f, f) and interleaved inside apply_rotary_pos_emb)."""
    orders = {"cat(f, f)": canonical_channel_map(spec, neox_order=True)}
    if not spec.is_neox_style:
        orders["repeat_interleave(f, 2)"] = canonical_channel_map(spec, neox_order=False)
    return orders


# TOLERANCE.  q/k are drawn float32-representable (held in float64) and cos/sin are float32 values, so
# every product a*c, b*s is exact in float64 (24 + 24 significand bits <= 53).
# * Families rotating in q's dtype (float64 here) and the reference both round only the final sum:
#   they agree bit for bit.  rope.harness.rotation.bound's bound for float64 arithmetic is u64 (M + |r|) + 3 u64^2 M
#   (M = |a c| + |b s|, r the result, u64 = 2^-53), i.e. at most ~2 float64 units of M: room for a
#   different valid evaluation order, nothing more.  Any wrong row, pairing or frequency moves a
#   cos/sin by at least one float32 ulp (~2^-24 relative), about 2^28 times this bound.
# * HunYuanVL rotates in float32 (inputs convert exactly, each product and the sum round once): the
#   same formula with u32 = 2^-24, i.e. at most ~2 float32 units of M.
def check_matches_reference(family, case: OracleCase) -> None:
    """attention_scaling == 1, cos/sin bit-identical to the cache, rotation == reference.rotate."""
    spec = case.spec
    positions, query, key = build_tensors(case)
    flat = positions.reshape(spec.num_dims, -1)                       # [rows, B*L], token t = b*L + l
    cache = cos_sin_cache(spec, torch.float32)
    run = hf_rotate(family, spec, positions, to_hf_heads(query, case.batch, spec.head_size),
                    to_hf_heads(key, case.batch, spec.head_size))
    assert run.attention_scaling == 1.0, f"{family.key}: attention_scaling={run.attention_scaling}, expected 1.0"
    check_cos_sin(family, run, spec, flat, cache, canonical_orders(spec), case)

    ref_q, ref_k = reference.rotate(spec, flat, query, key, cache)
    comparison = compare_rotation(spec, flat, query, key, cache, from_hf_heads(run.query), from_hf_heads(run.key),
                                  ref_q, ref_k, family.working_precision)
    if not comparison.ok:
        raise AssertionError(comparison.message(_what(family, run, "query/key", case, "reference.rotate")))


def real(key: str) -> RopeSpec:
    """The catalogue entry's spec (models.yaml), its cache cut to MAX_POSITION rows."""
    return dataclasses.replace(get_model(key).spec, max_position=MAX_POSITION)


def real_case(key: str, **kw) -> OracleCase:
    """A case with the catalogue entry's spec and head counts (before tensor parallelism)."""
    m = get_model(key)
    return OracleCase(spec=real(key), num_q_heads=m.num_q_heads, num_kv_heads=m.num_kv_heads, **kw)


# Interleaved with 3*s_h > rotary_dim/2 (docs/spec.md §2): rows get 11/11/10 frequencies, not 8/12/12.
INTERLEAVED_SHORT = RopeSpec(head_size=64, rotary_dim=64, sections=(8, 12, 12), layout="interleaved",
                             base=5000000.0, max_position=MAX_POSITION)
# An XD image of 4 rows x 8 columns (+ row-end tokens) after 2 text tokens, then text.
OCR_IMAGE = dict(batch=1, seq_len=40, positions="grid", grid_style="xd", prefix=2, grid=(0, 4, 8))


# ------------------------------------------------------------------------------------------ tests
# Rejects a reference that pairs GPT-J instead of NeoX, uses the interleaved instead of the chunked
# map, takes the rows in another order (t, h, w), misplaces a section boundary, or (cos/sin check)
# builds the cache with another base or inv_freq exponent.
@pytest.mark.parametrize("family", _families("qwen2-vl", "qwen2.5-vl"))
@settings(deadline=None)
@given(case=oracle_cases(layout="chunked", is_neox_style=True))
@example(case=real_case("qwen2-vl-7b", batch=1, seq_len=40, positions="grid", prefix=3, grid=(1, 4, 6), seed=1))
@example(case=real_case("qwen2.5-vl-7b", batch=2, seq_len=32, positions="grid", prefix=1, grid=(2, 3, 4), seed=2))
@example(case=real_case("qwen2-vl-7b", batch=1, seq_len=16, positions="random", seed=3))
def test_qwen2_vl_rotation_matches_reference(family, case):
    check_matches_reference(family, case)


# Rejects a reference that uses the chunked map for Qwen3-VL, swaps the H and W rows, lets the
# H/W runs end early or late (bounds other than i < 3*s_h, i < 3*s_w), or pairs GPT-J.
@pytest.mark.parametrize("family", _families("qwen3-vl", "qwen3-vl-moe"))
@settings(deadline=None)
@given(case=oracle_cases(layout="interleaved", is_neox_style=True))
@example(case=real_case("qwen3-vl-8b", batch=1, seq_len=40, positions="grid", prefix=2, grid=(1, 5, 7), seed=4))
@example(case=real_case("qwen3-vl-30b-a3b", batch=1, seq_len=24, positions="random", seed=5))
@example(case=OracleCase(INTERLEAVED_SHORT, batch=1, seq_len=24, num_q_heads=2, num_kv_heads=1,
                         positions="random", seed=6))
def test_qwen3_vl_rotation_matches_reference(family, case):
    check_matches_reference(family, case)


# GLM-4.1V, GLM-OCR: rejects a reference that pairs NeoX instead of GPT-J (docs/spec.md §7.1), rotates
# with a head_size/2 stride instead of rotary_dim/2 or touches the pass-through channels (bug 3), or
# uses the wrong axis map.
@pytest.mark.parametrize("family", _families("glm-4.1v", "glm-ocr"))
@settings(deadline=None)
@given(case=oracle_cases(layout="chunked", is_neox_style=False, rotary_fractions=(0.5, 1.0), bases=(10000.0,)))
@example(case=real_case("glm-4.1v-9b", batch=1, seq_len=48, positions="grid", prefix=4, grid=(1, 6, 6), seed=7))
@example(case=real_case("glm-4.1v-9b", batch=2, seq_len=20, positions="random", seed=8))
@example(case=real_case("glm-ocr", batch=1, seq_len=30, positions="grid", prefix=2, grid=(1, 4, 7), seed=9))
def test_glm4v_rotation_matches_reference(family, case):
    check_matches_reference(family, case)


# GLM-4.5V: rejects a reference that pairs GPT-J (the GLM-4.1V pairing) instead of NeoX, or breaks
# partial rotary (pair stride head_size/2, pass-through channels changed).
@pytest.mark.parametrize("family", _families("glm-4.5v"))
@settings(deadline=None)
@given(case=oracle_cases(layout="chunked", is_neox_style=True, rotary_fractions=(0.5, 1.0), bases=(10000.0,)))
@example(case=real_case("glm-4.5v", batch=1, seq_len=48, positions="grid", prefix=4, grid=(1, 6, 6), seed=10))
def test_glm4v_moe_rotation_matches_reference(family, case):
    check_matches_reference(family, case)


# Ernie-4.5-VL: rejects a reference whose Ernie map differs from transformers' own module (H on the
# even, W on the odd frequencies below s_h + s_w, then T; the module stores inv_freq permuted and its
# recomposition puts it back), or that pairs NeoX.  Fixed cases: the sections must have s_h == s_w.
ERNIE_SMALL = RopeSpec.ernie45(32, 32, (5, 5, 6), is_neox_style=False, base=500000.0, max_position=MAX_POSITION)


@pytest.mark.parametrize("family", _families("ernie-4.5-vl"))
@pytest.mark.parametrize("case", [
    real_case("ernie-4.5-vl-28b-a3b", batch=1, seq_len=40, positions="grid", prefix=3, grid=(1, 4, 6), seed=11),
    real_case("ernie-4.5-vl-28b-a3b", batch=2, seq_len=16, positions="random", seed=12),
    OracleCase(ERNIE_SMALL, batch=1, seq_len=24, num_q_heads=2, num_kv_heads=1, positions="random", seed=13),
], ids=["28b-grid", "28b-random", "small-random"])
def test_ernie45_rotation_matches_reference(family, case):
    check_matches_reference(family, case)


# HunYuanVL text tokens (all rows equal): every layout reduces to 1-D RoPE, so transformers and the
# canonical layout must agree.  Rejects a cache without the NTK-alpha base (or with another exponent
# than rotary_dim / (rotary_dim - 2)), and GPT-J pairing.
@pytest.mark.parametrize("family", _families("hunyuan-vl"))
@settings(deadline=None)
@given(case=oracle_cases(layout="chunked", is_neox_style=True, rows=(4, 3), ntk_alphas=(None, 1000.0),
                         bases=(10000.0,), kinds=("text",), grid_style="xd"))
@example(case=real_case("hunyuan-ocr", batch=1, seq_len=40, positions="text", grid_style="xd", seed=11))
def test_hunyuan_vl_text_tokens_match_reference(family, case):
    check_matches_reference(family, case)


# ----------------------------------------------------------------- HunYuanVL image tokens (docs/spec.md §2)
def transformers_block_rows(spec: RopeSpec) -> torch.Tensor:
    """Row of each rotary channel in transformers' HunYuanVL layout: the rotary_dim channels (cos laid
    out cat(f, f)) are split into consecutive blocks of 2*s_0, 2*s_1, ...; block i takes row i."""
    return torch.repeat_interleave(torch.arange(spec.num_dims), torch.tensor([2 * s for s in spec.sections]))


def transformers_xd_rotate(spec: RopeSpec, positions: torch.Tensor, x: torch.Tensor,
                           cache: torch.Tensor) -> torch.Tensor:
    """Float64 model of transformers' HunYuanVL rotation of x [T, heads*head_size], positions [rows, T].

    Channel c < rotary_dim uses frequency f(c) = c mod rotary_dim/2 at the position of row
    ``transformers_block_rows(spec)[c]``, and NeoX rotate_half:
        out[c] = x[c] * cos_c - x[c + rd/2] * sin_c    (c <  rd/2)
        out[c] = x[c] * cos_c + x[c - rd/2] * sin_c    (c >= rd/2)
    Unlike the canonical layout, c and c + rd/2 may read different rows: not a rotation in general.
    """
    rd, half = spec.rotary_dim, spec.num_freqs
    c = torch.arange(rd)
    pos = positions.long()[transformers_block_rows(spec)]             # [rd, T]: position of channel c
    table = cache.to(torch.float64)
    cos = table[pos, (c % half)[:, None]].T                            # [T, rd]
    sin = table[pos, half + (c % half)[:, None]].T
    heads = x.to(torch.float64).reshape(x.shape[0], -1, spec.head_size)
    xr = heads[..., :rd]
    rotated_half = torch.cat((-xr[..., half:], xr[..., :half]), dim=-1)
    out = heads.clone()
    out[..., :rd] = xr * cos[:, None, :] + rotated_half * sin[:, None, :]
    return out.reshape(x.shape[0], -1)


# Pins the divergence exactly: (ii) transformers == the float64 block-layout model above (and its
# cos/sin are the cache read through that layout, bit for bit); (i) transformers != reference.rotate
# on exactly the tokens whose rows the two layouts pick differently.  Rejects a reference that
# quietly adopted the transformers layout ((i): nothing would differ any more), a transformers release
# that changed the layout ((ii)), and a model of it with the wrong block sizes or row order ((ii)).
@pytest.mark.parametrize("family", _families("hunyuan-vl"))
@settings(deadline=None)
@given(case=oracle_cases(layout="chunked", is_neox_style=True, rows=(4, 3), ntk_alphas=(None, 1000.0),
                         bases=(10000.0,), kinds=("grid", "random"), grid_style="xd", min_tokens=2))
@example(case=real_case("hunyuan-ocr", seed=12, **OCR_IMAGE))
@example(case=real_case("hunyuan-ocr", batch=2, seq_len=24, positions="grid", grid_style="xd", prefix=1,
                        grid=(2, 3, 5), seed=13))
def test_hunyuan_vl_image_tokens_follow_transformers_block_layout(family, case):
    # KNOWN_MISMATCH_HUNYUAN_VL: this test asserts the documented difference, not agreement.
    spec = case.spec
    positions, query, key = build_tensors(case)
    flat = positions.reshape(spec.num_dims, -1)
    cache = cos_sin_cache(spec, torch.float32)
    run = hf_rotate(family, spec, positions, to_hf_heads(query, case.batch, spec.head_size),
                    to_hf_heads(key, case.batch, spec.head_size))
    assert run.attention_scaling == 1.0, f"{family.key}: attention_scaling={run.attention_scaling}, expected 1.0"

    block_rows = transformers_block_rows(spec)
    canon_rows, freqs = canonical_channel_map(spec, neox_order=True)
    check_cos_sin(family, run, spec, flat, cache, {"blocks of 2*s_i": (block_rows, freqs)}, case)

    # (ii) transformers equals the float64 model of its block layout (bound as in TOLERANCE, per channel).
    model_cos, model_sin = gather_channels(cache, flat, block_rows, freqs)
    for name, x, hf in (("query", query, run.query), ("key", key, run.key)):
        model = transformers_xd_rotate(spec, flat, x, cache)
        bound = channel_bound(spec, x, model, model_cos, model_sin, family.working_precision)
        assert_within(from_hf_heads(hf), model, bound, what=_what(family, run, name, case, "the block-layout model"))

    # (i) transformers differs from reference.rotate exactly on the tokens where some channel's
    # block row holds another position than its canonical row.
    picks_differ = (flat[block_rows] != flat[canon_rows]).any(dim=0)             # [T]
    if case.positions == "grid":
        assert picks_differ.any(), f"strategy: an XD image grid must have tokens whose rows differ ({case})"
    ref_q, ref_k = reference.rotate(spec, flat, query, key, cache)
    comparison = compare_rotation(spec, flat, query, key, cache, from_hf_heads(run.query), from_hf_heads(run.key),
                                  ref_q, ref_k, family.working_precision)
    differs = torch.zeros(case.num_tokens, dtype=torch.bool)
    for name in ("query", "key"):
        differs |= (comparison.errors[name] > comparison.bounds[name]).any(dim=1)
    if not torch.equal(differs, picks_differ):
        raise AssertionError(
            _what(family, run, "query/key", case, "reference.rotate") +
            f"\ntokens that differ from the reference: {differs.nonzero().flatten().tolist()}"
            f"\ntokens whose rows the layouts pick differently: {picks_differ.nonzero().flatten().tolist()}")


# The same kind of image case checked for agreement: fails as long as transformers keeps its block
# layout.  strict: a release that adopts the canonical layout turns this into a failure (XPASS), the
# signal to retire the known mismatch.
@pytest.mark.parametrize("family", _families("hunyuan-vl"))
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN_MISMATCH_HUNYUAN_VL)
def test_hunyuan_vl_image_tokens_match_reference(family):
    check_matches_reference(family, real_case("hunyuan-ocr", seed=14, **OCR_IMAGE))


# ------------------------------------------------------------------------- API detection (Qwen2-VL)
# transformers moved the section recomposition of Qwen2-VL / Qwen2.5-VL from
# apply_multimodal_rotary_pos_emb (<= 5.16) into the rotary module (5.17+).  Pins which path ran, so
# the adapter can neither silently fall back nor call a removed function.  Rejects an adapter that
# always takes one path (wrong on one side of 5.17).
@pytest.mark.parametrize("family", _families("qwen2-vl", "qwen2.5-vl"))
def test_qwen2_vl_rotation_api_matches_release(family):
    case = real_case("qwen2-vl-7b", batch=1, seq_len=8, positions="grid", prefix=1, grid=(1, 2, 3), seed=15)
    positions, query, key = build_tensors(case)
    d = case.spec.head_size
    run = hf_rotate(family, case.spec, positions, to_hf_heads(query, 1, d), to_hf_heads(key, 1, d))
    modeling = importlib.import_module(family.modeling_module)
    if TRANSFORMERS_VERSION < Version("5.17.0"):
        assert run.per_row and run.function.endswith(".apply_multimodal_rotary_pos_emb"), run.function
    else:
        assert not run.per_row and run.function.endswith(".apply_rotary_pos_emb"), run.function
        assert not hasattr(modeling, "apply_multimodal_rotary_pos_emb")
        assert hasattr(getattr(modeling, family.rotary_class), "recomposition_frequencies")
    check_matches_reference(family, case)
