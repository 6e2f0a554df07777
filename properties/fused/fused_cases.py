"""The fused ops' strategies and fixed cases: what draws a :class:`~rope.harness.fused.cases.QKNormCase`
(contract A) and a :class:`~rope.harness.fused.cases.CacheCase` (contract B), reaching the switches an
implementation has: token x head products past 2^15 (about one draw in ten: cheap under the
interpreter at few examples) and past 10240 with partial rotary (vllm#51049), positions to the spec's
length (up to 2^17), padding slots (-1) and short slot mappings, caches with stale (non-zero, NaN
codes included) contents, FP8 scales drawn and never 1.0 only, packed q/k/v column views and joint
key/value caches, packed qkv rows with padding past v; for MLA (:class:`MLACase`) the rope dim (64
first), kv_lora_rank, q's nope channels and q token- or heads-major (aiter#3841), kv_c and k_pe as views
of one kv_a; and the known bugs' triggers."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from properties.strategies import KINDS, rope_specs
from rope.harness.fused.cases import (BLOCK_SIZES, CACHE_KINDS, DTYPES, Q_LAYOUTS, SCALES, CacheCase, MLACase,
                                      QKNormCase, model_spec)

__all__ = ["DEEPSEEK_V3", "GLM41V", "HEAD_SIZES", "KIMI_K2", "KNOWN_CACHE", "KNOWN_MLA", "KNOWN_QK_NORM",
           "MAX_POSITIONS", "MLA_ROPE_DIMS", "POSITION_KINDS", "QWEN2", "QWEN35", "QWEN3VL", "cache_case", "cache_cases",
           "mla_case", "mla_cases", "qk_norm_case", "qk_norm_cases", "token_counts"]

HEAD_SIZES = (64, 128, 80, 256, 96, 32)
MAX_POSITIONS = (4096, 7, 300, 131072)
POSITION_KINDS = ("uniform", "grid", "text", "last_row")

QWEN2 = model_spec("qwen2-7b")          # 1-D NeoX, head 128 (28 / 4 heads; tp 4: 7 / 1)
GLM41V = model_spec("glm-4.1v-9b")      # chunked [8, 12, 12], GPT-J, rotary 64 of 128
QWEN3VL = model_spec("qwen3-vl-8b")     # interleaved [24, 20, 20], NeoX, head 128, q/k norm
QWEN35 = model_spec("qwen3.5-9b")       # interleaved [11, 11, 10], rotary 64 of 256
DEEPSEEK_V3 = model_spec("deepseek-v3")           # MLA: rope dim 64, GPT-J, DeepSeek YaRN (128 heads; tp 8: 16)
KIMI_K2 = model_spec("kimi-k2-instruct-0905")     # MLA: rope dim 64, GPT-J, base 50000 (64 heads)
MLA_ROPE_DIMS = (64, 32, 128)


def token_counts(max_small: int = 40, big: int = 2080):
    """Mostly 1..max_small tokens, about one draw in ten ``big`` (with 16 heads, past 2^15 token x
    head products)."""
    return st.integers(0, 9).flatmap(lambda i: st.just(big) if i == 0 else st.integers(1, max_small))


def _partial_specs():
    """1-D, head 32 with 8, 16 or 24 channels rotating, either pairing, positions to the drawn length."""
    return st.builds(lambda rotary, neox, rows: dataclasses.replace(QWEN2, head_size=32, rotary_dim=rotary,
                                                                   is_neox_style=neox, max_position=rows),
                     st.sampled_from([8, 16, 24]), st.booleans(), st.sampled_from(MAX_POSITIONS))


# Head sizes of ``append_heads`` (a kernel dispatched on 64, 128, 256: FlashInfer's paged append).
APPEND_HEAD_SIZES = (64, 128, 256)


def _specs(kinds, num_tokens: int, draws: tuple[str, ...] = ()):
    """A spec of every kind; a big draw (past 10240 and 2^15 token x heads) has head 32, and two
    times in three partial rotary on 1-D positions (where vllm#51049's warps lose a pair's partner).
    With ``append_heads`` (an implementation's declared draws) every head is 64, 128 or 256 wide (64
    in a big draw, with the rotary width drawn as for any other)."""
    if "append_heads" in draws:
        heads = (64,) if num_tokens > 100 else APPEND_HEAD_SIZES
        return st.sampled_from(kinds).flatmap(
            lambda kind: rope_specs(kind=kind, head_sizes=heads, max_positions=MAX_POSITIONS))
    drawn = st.sampled_from(kinds).flatmap(
        lambda kind: rope_specs(kind=kind, head_sizes=(32,) if num_tokens > 100 else HEAD_SIZES,
                                max_positions=MAX_POSITIONS))
    if num_tokens <= 100:
        return drawn
    return st.integers(0, 2).flatmap(lambda i: _partial_specs() if i < 2 else drawn)


@st.composite
def qk_norm_cases(draw, *, kinds=KINDS, big: bool = True):
    """A QK-norm + RoPE call; shrinks to 1-D, one token, one head of each.  About one draw in ten
    (``big``) has 2080 tokens of 16 q and k heads (32 wide, to keep it cheap): past 2^15 token x
    head products."""
    num_tokens = draw(token_counts() if big else st.integers(1, 40))
    spec = draw(_specs(kinds, num_tokens))
    if num_tokens > 100:
        num_q, num_k = draw(st.sampled_from([(12, 4), (14, 2)]))
    else:
        num_q = draw(st.integers(1, 6))
        num_k = draw(st.integers(1, num_q))
    return QKNormCase(spec=spec, num_tokens=num_tokens, num_heads_q=num_q, num_heads_k=num_k,
                      num_heads_v=draw(st.sampled_from([num_k, 0, 1])), dtype=draw(st.sampled_from(list(DTYPES))),
                      eps=draw(st.sampled_from([1e-6, 1e-5, 0.0])), row_padding=draw(st.sampled_from([0, 0, 24])),
                      positions_kind=draw(st.sampled_from(POSITION_KINDS)), seed=draw(st.integers(0, 2**32 - 1)),
                      generator="counter")


def _narrowed(spec, draws):
    """``spec`` within an implementation's declared ``draws`` (rope.implementation.FUSED_DRAWS):
    with ``dims_of_16`` a 1-D spec's rotary width rounds down to a multiple of 16 (at least 16), so
    rotating and passed-through widths both are."""
    if "dims_of_16" in draws and spec.sections is None and spec.rotary_dim % 16:
        return dataclasses.replace(spec, rotary_dim=max(16, spec.rotary_dim // 16 * 16))
    return spec


def _dtypes(draws):
    return ["bfloat16", "float16"] if "half_dtypes" in draws else list(DTYPES)


def _caches(draws):
    if "activation_cache" in draws:
        return ["activation"]
    return [c for c in CACHE_KINDS if c != "activation"] if "fp8_cache" in draws else list(CACHE_KINDS)


@st.composite
def cache_cases(draw, *, kinds=KINDS, big: bool = True, max_tokens: int = 40, draws: tuple[str, ...] = ()):
    """A RoPE + KV-cache write; shrinks to 1-D, one token, a bf16 cache, NHD, block 16.  About one
    draw in ten (``big``) has 2080 tokens of 16 heads (32 wide, to keep it cheap): past 2^15 token x
    head products.  ``draws``: an implementation's declared narrowing (1-D only, FP8 caches only, one
    scale for k and v, widths of 16, half dtypes)."""
    num_tokens = draw(token_counts(max_tokens) if big else st.integers(1, max_tokens))
    spec = _narrowed(draw(_specs(("1d",) if "1d" in draws else kinds, num_tokens, draws)), draws)
    if num_tokens > 100:
        num_q, num_kv = draw(st.sampled_from([(14, 2), (12, 4)]))
    else:
        num_q = draw(st.integers(1, 6))
        num_kv = draw(st.integers(1, num_q))
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    least = -(-num_tokens // block_size)
    return CacheCase(spec=spec, num_tokens=num_tokens, num_q_heads=num_q, num_kv_heads=num_kv,
                     dtype=draw(st.sampled_from(_dtypes(draws))), cache=draw(st.sampled_from(_caches(draws))),
                     layout=draw(st.sampled_from(["NHD", "HND"])), block_size=block_size,
                     num_blocks=draw(st.integers(least, least + 2)),
                     padding=draw(st.sampled_from([0.0, 0.25, 1.0])), short_slots=draw(st.sampled_from([0, 0, 3])),
                     scale_as_tensor=draw(st.booleans()), k_scale=(k_scale := draw(st.sampled_from(SCALES))),
                     v_scale=k_scale if "one_kv_scale" in draws else draw(st.sampled_from(SCALES)),
                     packed=draw(st.booleans()),
                     joint_cache=draw(st.booleans()), positions_kind=draw(st.sampled_from(POSITION_KINDS)),
                     seed=draw(st.integers(0, 2**32 - 1)), generator="counter")


def _mla_specs():
    """DeepSeek-V3's or Kimi K2's table (YaRN) at a drawn rope dim (64 first), either pairing (GPT-J
    first: DeepSeek's), positions to the drawn length."""
    return st.builds(lambda base, r, neox, rows: dataclasses.replace(base, head_size=r, rotary_dim=r, is_neox_style=neox,
                                                                    max_position=rows),
                     st.sampled_from([DEEPSEEK_V3, KIMI_K2]), st.sampled_from(MLA_ROPE_DIMS),
                     st.sampled_from([False, True]), st.sampled_from(MAX_POSITIONS))


@st.composite
def mla_cases(draw, *, max_tokens: int = 24, draws: tuple[str, ...] = ()):
    """An MLA RoPE + latent-cache write; shrinks to one token of one head, rope dim 64, GPT-J,
    kv_lora_rank 512, nope 128, q token-major, a bf16 cache, block 16.  ``draws`` as
    :func:`cache_cases` (every drawn MLA width is a multiple of 16 already)."""
    num_tokens = draw(st.integers(1, max_tokens))
    spec = draw(_mla_specs())
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    least = -(-num_tokens // block_size)
    # A heads-major q of one head is laid out as a token-major one: heads-major draws 2 or more.
    q_layout = draw(st.sampled_from(Q_LAYOUTS))
    heads = [1, 2, 3, 16] if q_layout == "token_major" else [2, 3, 16]
    return MLACase(spec=spec, num_tokens=num_tokens, num_heads=draw(st.sampled_from(heads)),
                   kv_lora_rank=draw(st.sampled_from([512, 16, 48])), nope_dim=draw(st.sampled_from([128, 0, 32])),
                   q_layout=q_layout, packed_kv=draw(st.booleans()),
                   k_pe_3d=draw(st.booleans()), dtype=draw(st.sampled_from(_dtypes(draws))),
                   cache=draw(st.sampled_from(_caches(draws))), block_size=block_size,
                   num_blocks=draw(st.integers(least, least + 2)), padding=draw(st.sampled_from([0.0, 0.25, 1.0])),
                   short_slots=draw(st.sampled_from([0, 0, 3])), scale_as_tensor=draw(st.booleans()),
                   scale=draw(st.sampled_from(SCALES)), positions_kind=draw(st.sampled_from(POSITION_KINDS)),
                   seed=draw(st.integers(0, 2**32 - 1)), generator="counter")


def mla_case(spec, **fields) -> MLACase:
    """A fixed contract-C case: these fields, the rest a small bf16 one of DeepSeek's shapes with a padding slot."""
    base = dict(spec=spec, num_tokens=9, num_heads=4, kv_lora_rank=512, nope_dim=128, q_layout="token_major",
                packed_kv=True, k_pe_3d=False, dtype="bfloat16", cache="activation", block_size=16, num_blocks=2,
                padding=0.25, short_slots=0, scale_as_tensor=False, scale=0.3, positions_kind="uniform", seed=2)
    return MLACase(**(base | fields))


def qk_norm_case(spec, **fields) -> QKNormCase:
    """A fixed contract-A case: these fields, the rest a small bf16 one."""
    base = dict(spec=spec, num_tokens=7, num_heads_q=4, num_heads_k=2, num_heads_v=2, dtype="bfloat16", eps=1e-6,
                row_padding=0, positions_kind="grid", seed=3)
    return QKNormCase(**(base | fields))


def cache_case(spec, **fields) -> CacheCase:
    """A fixed contract-B case: these fields, the rest a small bf16 one with a padding slot."""
    base = dict(spec=spec, num_tokens=9, num_q_heads=4, num_kv_heads=2, dtype="bfloat16", cache="activation",
                layout="NHD", block_size=16, num_blocks=2, padding=0.25, short_slots=0, scale_as_tensor=False,
                k_scale=0.3, v_scale=2.5, packed=True, joint_cache=False, positions_kind="uniform", seed=1)
    return CacheCase(**(base | fields))


def _partial_1d(rows: int = 4096):
    """1-D NeoX, head 32, rotary 16 of 32: partial rotary at a head size that keeps a case past 10240
    token x heads cheap."""
    return dataclasses.replace(QWEN2, head_size=32, rotary_dim=16, max_position=rows)


# The known bugs' triggers (docs/spec.md §10), each a fixed case of its contract.
KNOWN_QK_NORM = {
    # vllm#51049: a warp handling several heads with partial rotary loses a pair's partner past 10240
    # token x heads (700 tokens x 16 heads = 11200).
    "vllm-51049-partial-rotary-past-10240": qk_norm_case(_partial_1d(), num_tokens=700, num_heads_q=12, num_heads_k=4,
                                                         num_heads_v=4, positions_kind="uniform"),
    "qwen3-vl-8b-tp4": qk_norm_case(QWEN3VL, num_heads_q=8, num_heads_k=2, num_heads_v=2),
    "glm-4.1v-row-padding": qk_norm_case(GLM41V, num_heads_q=8, num_heads_k=1, num_heads_v=1, dtype="float16",
                                         row_padding=24),
}
KNOWN_CACHE = {
    # sglang#19636: the rotated k cached, the live k returned unrotated.
    "sglang-19636-live-k": cache_case(QWEN2, num_q_heads=7, num_kv_heads=1, num_tokens=5, padding=0.25, short_slots=2),
    # flashinfer#2792: a padding slot (-1) taken as an index writes the cache's last row: every token padding,
    # so any written row shows.
    # (one scale for k and v, as FlashInfer's op takes.)
    "flashinfer-2792-padding-slots": cache_case(QWEN2, num_tokens=6, num_q_heads=2, num_kv_heads=2,
                                                cache="float8_e4m3fn", num_blocks=1, padding=1.0, short_slots=2,
                                                v_scale=0.3),
    # FlashInfer's own FP8 tests: GPT-J pairing only, scales of 1, positions below 2048.  Here NeoX, a
    # scale whose reciprocal is inexact, positions across the whole table, e5m2, HND, a padding slot.
    "flashinfer-fp8-neox-scaled-long": cache_case(QWEN2, num_tokens=33, num_q_heads=4, num_kv_heads=2,
                                                  cache="float8_e5m2", layout="HND", block_size=16, num_blocks=3,
                                                  k_scale=0.3, v_scale=0.3, positions_kind="uniform"),
    # vllm#51049 inside a fused cache write: partial rotary past 10240 token x heads.
    "vllm-51049-partial-rotary-past-10240": cache_case(_partial_1d(), num_tokens=700, num_q_heads=12, num_kv_heads=4,
                                                       block_size=256, num_blocks=3, padding=0.0),
    "glm-4.1v-fp8-hnd": cache_case(GLM41V, num_q_heads=16, num_kv_heads=1, cache="float8_e4m3fn", layout="HND",
                                   block_size=64, num_blocks=1, k_scale=0.05, positions_kind="last_row",
                                   joint_cache=True),
}
KNOWN_MLA = {
    # DeepSeek-V3 at tensor parallel 8: 16 heads of q [T, 16, 128 + 64], kv_lora_rank 512.
    "deepseek-v3-tp8": mla_case(DEEPSEEK_V3, num_heads=16, block_size=64, num_blocks=1),
    # aiter#3841: q from a batched matmul over heads, heads-major ([H, T, nope + R] transposed): head 1
    # is T rows after head 0, not adjacent; FP8 with a scale that is not 1.
    "aiter-3841-heads-major-q": mla_case(DEEPSEEK_V3, num_tokens=6, num_heads=4, q_layout="heads_major",
                                         cache="float8_e4m3fn", scale=0.3, scale_as_tensor=True),
    # Kimi K2: e5m2 cache, k_pe as [T, 1, R], padding slots and a short slot mapping, the table's last row.
    "kimi-k2-fp8-e5m2-padding": mla_case(KIMI_K2, num_tokens=7, num_heads=2, cache="float8_e5m2", scale=2.5,
                                         k_pe_3d=True, short_slots=2, positions_kind="last_row", packed_kv=False),
}
