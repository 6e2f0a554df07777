"""Hypothesis strategies for rotary cases.

Strategies draw *descriptions* (rope.harness.rotation.cases: spec, head counts, token count, dtype,
position pattern, memory layout, seed); ``build_rotation_inputs`` turns a description into
tensors (drawn cases are ``counter`` cases, made on the device they run on), so a case regenerates
bit-identically on any device and from a case file.  Everything
shrinks towards the simplest case: 64-wide heads, full rotary, one head, one token, uniform
positions, contiguous tensors, seed 0.
"""

from __future__ import annotations

import functools

from hypothesis import strategies as st
import torch

from rope.harness.position_step.cases import OUT_SENTINEL, RaggedBatch  # noqa: F401  (re-exported for the tests)
from rope.harness.rotation.cases import (  # noqa: F401  (the case model the strategies draw, re-exported for the tests)
    DTYPE_SHORT,
    DTYPES,
    HEAD_SIZES,
    POSITION_KINDS,
    RotationCase,
    RotationInputs,
    build_rotation_inputs,
    check_choice,
    make_positions,
)
from rope.harness.seeded import scalar
from rope.spec import RopeSpec


def _memoized(factory):
    """The strategy ``factory(**kwargs)`` built once per argument set: the properties draw
    ``rotation_cases(...)`` inside each example, and a fresh strategy is validated again on
    every draw (0.5-1 ms an example).  Strategies are immutable; unhashable arguments build anew."""
    cached = functools.lru_cache(maxsize=256)(factory)

    @functools.wraps(factory)
    def strategy(*args, **kwargs):
        try:
            return cached(*args, **kwargs)
        except TypeError:          # an unhashable argument (a list of head sizes, say)
            return factory(*args, **kwargs)
    return strategy


@functools.lru_cache(maxsize=None)
def _one_of(options: tuple):
    """``st.sampled_from(options)``, built once per options: a strategy built inside a draw is built
    and validated again on every example (twice the cost of the draw itself)."""
    return st.sampled_from(options)


@functools.lru_cache(maxsize=None)
def _ints(low: int, high: int):
    """``st.integers(low, high)``, built once per bounds (as :func:`_one_of`)."""
    return st.integers(low, high)


_BOOLEANS = st.booleans()
_SEEDS = st.integers(0, 2 ** 32 - 1)


# Per-rank head counts of real models under tensor parallelism (e.g. Qwen2-VL-7B 28/4 at tp=4 -> 7/1).
REAL_HEAD_COUNTS = (28, 14, 7, 64, 32, 16, 8, 96, 48, 12, 6, 3, 2)
BASES = (10000.0, 1000000.0, 5000000.0, 10000000.0, 500000.0)
MAX_POSITIONS = (4096, 1, 7, 300, 2048, 32768, 131072)
# Variant kinds, as used in test ids: how many position rows and which layout.  "mapped": every
# other map from frequencies to rows (rope/row_maps.py): the named GLM round-robin, Ernie-4.5-VL and
# two-row interleaved maps, and any valid map of 2-4 rows.
KINDS = ("1d", "chunked3", "chunked4", "interleaved", "chunked1", "mapped")
KIND_ROWS = {"1d": 1, "chunked1": 1, "chunked3": 3, "chunked4": 4, "interleaved": 3, "mapped": None}
MAPPED_LAYOUTS = ("glm_round_robin", "ernie45", "two_row_interleaved", "custom")


@_memoized
@st.composite
def sections(draw, *, total: int, parts: int):
    """Positive ints summing to ``total`` in ``parts`` pieces (any composition); shrinks to even-ish."""
    if parts < 1 or total < parts:
        raise ValueError(f"parts={parts}: need 1 <= parts <= total={total}")
    if parts == 1:
        return (total,)
    cuts = draw(_cuts(total, parts))
    edges = [0] + sorted(cuts) + [total]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


@functools.lru_cache(maxsize=None)
def _cuts(total: int, parts: int):
    return st.lists(_ints(1, total - 1), min_size=parts - 1, max_size=parts - 1, unique=True)


def _min_half(kind: str) -> int:
    return {"chunked3": 3, "interleaved": 3, "mapped": 3, "chunked4": 4}.get(kind, 1)


@_memoized
@st.composite
def rope_specs(draw, *, kind: str = "chunked3", is_neox_style: bool | None = None,
               head_sizes=HEAD_SIZES, max_positions=MAX_POSITIONS, full_rotary_only: bool = False,
               layouts=MAPPED_LAYOUTS):
    """A valid RopeSpec of the given kind; shrinks to head 64, full rotary, base 1e4.
    ``full_rotary_only``: the whole head rotates (for an implementation without partial rotary);
    ``layouts``: the maps kind "mapped" draws from (those an implementation runs)."""
    check_choice("kind", kind, KINDS)
    rows = KIND_ROWS[kind]
    head_size = draw(_one_of(tuple(head_sizes)))
    half_max = head_size // 2
    min_half = _min_half(kind)
    half = half_max if full_rotary_only else draw(_rotary_halves(min_half, half_max))
    if half < min_half:
        half = half_max
    neox = draw(_BOOLEANS) if is_neox_style is None else is_neox_style
    fields = dict(is_neox_style=neox, base=draw(_one_of(BASES)), max_position=draw(_one_of(tuple(max_positions))))
    if kind == "mapped":
        return draw(mapped_specs(head_size=head_size, half=half, layouts=tuple(layouts), **fields))
    if kind == "1d":
        secs, layout = None, "chunked"
    elif kind == "interleaved":
        secs, layout = draw(sections(total=half, parts=3)), "interleaved"
    else:
        secs, layout = draw(sections(total=half, parts=rows)), "chunked"
    alpha = draw(_one_of((None, 1000.0))) if kind in ("chunked3", "chunked4") and half > 1 else None
    return RopeSpec(head_size=head_size, rotary_dim=2 * half, sections=secs, layout=layout, ntk_alpha=alpha, **fields)


@st.composite
def mapped_specs(draw, *, head_size: int, half: int, layouts=MAPPED_LAYOUTS, **fields):
    """A spec of ``half`` frequencies with one of ``layouts``: GLM round-robin over any 3 sections,
    Ernie-4.5-VL's (s, s, t), two-row interleaved, or a custom map of 2-4 rows (each row at least
    one frequency, any order; one row is 1-D RoPE, kind "1d"); shrinks to the first layout and to
    row 0 everywhere it can."""
    layout = draw(_one_of(tuple(layouts)))
    if layout == "glm_round_robin":
        return RopeSpec.glm_round_robin(head_size, 2 * half, draw(sections(total=half, parts=3)), **fields)
    if layout == "ernie45":
        s = draw(_ints(1, (half - 1) // 2))
        return RopeSpec.ernie45(head_size, 2 * half, (s, s, half - 2 * s), **fields)
    if layout == "two_row_interleaved":
        return RopeSpec.two_row_interleaved(head_size, 2 * half, **fields)
    num_dims = draw(_ints(2, min(4, half)))
    rest = draw(_row_lists(num_dims, half - num_dims))
    order = draw(_permutations(half))
    rows = [0] * half
    for slot, row in zip(order, [*range(num_dims), *rest]):
        rows[slot] = row
    return RopeSpec.from_map(rows, head_size=head_size, num_dims=num_dims, **fields)


@functools.lru_cache(maxsize=None)
def _row_lists(num_dims: int, length: int):
    return st.lists(_ints(0, num_dims - 1), min_size=length, max_size=length)


@functools.lru_cache(maxsize=None)
def _permutations(n: int):
    return st.permutations(range(n))


@functools.lru_cache(maxsize=None)
def _rotary_halves(min_half: int, half_max: int):
    """rotary_dim / 2 of a head: whole, a half, a quarter, or any width (built once per bound pair:
    a strategy built inside a draw is built and checked again on every example)."""
    return st.one_of(st.sampled_from([h for h in (half_max, half_max // 2, half_max // 4) if h >= min_half] or [half_max]),
                     st.integers(min_half, half_max))


_Q_HEADS = st.one_of(st.integers(1, 4), st.sampled_from(REAL_HEAD_COUNTS))
_HAS_KEY = st.booleans().map(lambda b: not b)       # shrinks towards a key


@functools.lru_cache(maxsize=None)
def _token_counts(min_tokens: int, max_tokens: int):
    return st.integers(min(max(1, min_tokens), max_tokens), max_tokens) | st.just(min_tokens)


@functools.lru_cache(maxsize=None)
def _kv_heads(nq: int):
    return st.one_of(st.just(nq), st.just(1), st.integers(1, max(1, nq)))


def probe_specs(kind: str, is_neox_style: bool) -> list[RopeSpec]:
    """One spec of ``kind`` per head size and rotary width (full, half, a quarter, an eighth):
    the shapes rotation_cases draws, for asking an implementation up front whether it runs any."""
    check_choice("kind", kind, KINDS)
    rows = KIND_ROWS[kind]
    min_half = _min_half(kind)
    specs = []
    for head_size in HEAD_SIZES:
        for half in sorted({head_size // 2, head_size // 4, head_size // 8}, reverse=True):
            if half < min_half:
                continue
            if kind == "mapped":
                specs += mapped_layout_specs(head_size, half, is_neox_style)
                continue
            parts = 3 if kind == "interleaved" else rows
            secs = None if kind == "1d" else tuple(half // parts + (i < half % parts) for i in range(parts))
            specs.append(RopeSpec(head_size=head_size, rotary_dim=2 * half, is_neox_style=is_neox_style, sections=secs,
                                  layout="interleaved" if kind == "interleaved" else "chunked", max_position=4096))
    return specs


def mapped_layout_specs(head_size: int, half: int, is_neox_style: bool, max_position: int = 4096) -> list[RopeSpec]:
    """One spec per layout of kind "mapped", in MAPPED_LAYOUTS order (the custom one: rows 0 1 2 0 1 2
    ... reversed, not chunked): the probes, and the prefill properties' fixed cases."""
    fields = dict(is_neox_style=is_neox_style, max_position=max_position)
    s = (half - 1) // 2
    custom = tuple(reversed([i % 3 for i in range(half)]))
    return [RopeSpec.glm_round_robin(head_size, 2 * half, (half - 2 * (half // 3), half // 3, half // 3), **fields),
            RopeSpec.ernie45(head_size, 2 * half, (s, s, half - 2 * s), **fields),
            RopeSpec.two_row_interleaved(head_size, 2 * half, **fields),
            RopeSpec.from_map(custom, head_size=head_size, **fields)]


@functools.lru_cache(maxsize=1024)
def supported_shapes(impl_name: str, impl, kind: str, is_neox_style: bool, dtype: str, device: str) -> dict | None:
    """``rotation_cases`` arguments that keep the draws of ``kind`` to the shapes the implementation
    runs, from its answers on :func:`probe_specs`: the head sizes of the probes it supports, and the
    whole head only when it runs no partial-rotary probe; None when it runs no probe at all.  An
    implementation that runs every probe (the harness's own kernels) gets ``{}``: its draws are
    the full strategy, unchanged.  (Each draw is still asked of the implementation: this only keeps
    an engine's kernel, NeoX-only and whole-head only, say, from rejecting most of its search.)"""
    from rope.registry import unsupported_reason
    probes = probe_specs(kind, is_neox_style)
    ok = [s for s in probes if unsupported_reason(impl_name, impl, s, DTYPES[dtype], device) is None]
    if not ok:
        return None
    if len(ok) == len(probes):
        return {}
    narrowed = {}
    sizes = {s.head_size for s in ok}
    if sizes != set(HEAD_SIZES):
        narrowed["head_sizes"] = tuple(h for h in HEAD_SIZES if h in sizes)
    if all(s.rotary_dim == s.head_size for s in ok):
        narrowed["full_rotary_only"] = True
    layouts = tuple(x for x in MAPPED_LAYOUTS if any(s.layout == x for s in ok))
    if kind == "mapped" and layouts != MAPPED_LAYOUTS:
        narrowed["layouts"] = layouts
    return narrowed


@st.composite
def _head_count_pairs(draw, key: bool | None):
    nq = draw(_Q_HEADS)
    has_key = draw(_HAS_KEY) if key is None else key
    if not has_key:
        return nq, 0
    nkv = draw(_kv_heads(nq))
    return nq, nkv


def head_counts(*, key: bool | None = None):
    """(num_q_heads, num_kv_heads): MHA, GQA, MQA and TP-sharded real counts; kv 0 = key absent.
    (The composite is defined once: @st.composite reads its function's source when applied.)"""
    return _head_count_pairs(key)


@_memoized
@st.composite
def rotation_cases(draw, *, dtype: str = "float32", kind: str = "chunked3", is_neox_style: bool | None = None,
                   min_tokens: int = 0, max_tokens: int = 48, head_sizes=HEAD_SIZES, max_positions=MAX_POSITIONS,
                   nonfinite: bool = False, full_rotary_only: bool = False, layouts=MAPPED_LAYOUTS):
    """A full rotation case; shrinks to one token, one head, uniform positions, contiguous q/k.
    ``nonfinite`` (opt in; the rotation properties do) also draws cases with NaN and infinities
    planted in q and k: the output must then have NaN where the reference has NaN, the same
    infinities, and be finite elsewhere (docs/tolerance.md)."""
    check_choice("dtype", dtype, tuple(DTYPES))
    if not 0 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens={min_tokens}: must be in [0, max_tokens={max_tokens}]")
    spec = draw(rope_specs(kind=kind, is_neox_style=is_neox_style, head_sizes=head_sizes,
                           max_positions=max_positions, full_rotary_only=full_rotary_only, layouts=layouts))
    num_tokens = draw(_token_counts(min_tokens, max_tokens))
    nq, nkv = draw(head_counts())
    num_tokens = max(min_tokens, _few_if_large(nq, spec.head_size, num_tokens))
    return RotationCase(spec=spec, num_tokens=num_tokens, num_q_heads=nq, num_kv_heads=nkv, dtype=dtype,
                        positions_kind=draw(_one_of(POSITION_KINDS)), packed_qkv=draw(_BOOLEANS),
                        seed=draw(_SEEDS), nonfinite=nonfinite and draw(_BOOLEANS), generator="counter")


def _few_if_large(num_q_heads: int, head_size: int, num_tokens: int) -> int:
    """Keep interpreter runs cheap: large real head counts with big heads only for few tokens (at most
    4 where q would pass 64k elements)."""
    return min(num_tokens, 4) if num_q_heads * head_size * max(1, num_tokens) > 64 * 1024 else num_tokens


@st.composite
def _batch_of(draw, shape: RotationCase):
    num_tokens = _few_if_large(shape.num_q_heads, shape.spec.head_size, draw(_ints(0, 48)))
    return RotationCase(spec=shape.spec, num_tokens=num_tokens, num_q_heads=shape.num_q_heads,
                        num_kv_heads=shape.num_kv_heads, dtype=shape.dtype,
                        positions_kind=draw(_one_of(POSITION_KINDS)), packed_qkv=draw(_BOOLEANS),
                        seed=draw(_SEEDS), nonfinite=draw(_BOOLEANS), generator="counter")


def batches_of(shape: RotationCase):
    """Another batch through ``shape``'s compiled kernel: the same spec, head counts and dtype, any
    token count (0-48), positions, packing, seed, and NaN/infinities planted or not; shrinks to one
    uniform, contiguous, finite token.  (The composite is defined once, as for head_counts.)"""
    return _batch_of(shape)


# The counter streams of a seeded batch list's fields (rope.harness.seeded.scalar under the list's seed).
_EDGE, _TOKENS, _KIND, _PACKED, _NONFINITE, _CASE_SEED, _LIST = range(7)
_EDGE_TOKENS = (0, 1, 48)                  # the token counts a batch meets 1 time in 16 each


@st.composite
def seeded_batches_of(draw, shape: RotationCase, min_size: int, max_size: int):
    """``min_size``-``max_size`` further batches through ``shape``, as :func:`batches_of` draws them (the
    same fields and ranges), derived from one drawn seed: two draws for the list where ``st.lists(
    batches_of(shape))`` makes five per batch, the cost of a campaign's many batches per example (about
    70 us a draw on a 2-core box, three to four times that on a GPU host's cores).  Shrinks by count and
    seed; a batch that fails is reported alone, in full, by the one-case check."""
    count = draw(_ints(min_size, max_size))
    seed = draw(_SEEDS)
    return [seeded_batch(shape, seed, i) for i in range(count)]


def seeded_batch(shape: RotationCase, seed: int, i: int) -> RotationCase:
    """Batch ``i`` of :func:`seeded_batches_of`'s list drawn with ``seed``."""
    # Counters run seed * golden + i: seeds s and s + 1 would share all but one index, and Hypothesis
    # draws small seeds often, so the list's counters start from a hash of its seed.
    base = scalar(seed, _LIST, 0, 0, 1 << 62)

    def pick(stream: int, low: int, high: int) -> int:
        return scalar(base, stream, i, low, high)
    edge = pick(_EDGE, 0, 16)
    num_tokens = _few_if_large(shape.num_q_heads, shape.spec.head_size,
                               _EDGE_TOKENS[edge] if edge < len(_EDGE_TOKENS) else pick(_TOKENS, 0, 49))
    return RotationCase(spec=shape.spec, num_tokens=num_tokens, num_q_heads=shape.num_q_heads,
                        num_kv_heads=shape.num_kv_heads, dtype=shape.dtype,
                        positions_kind=POSITION_KINDS[pick(_KIND, 0, len(POSITION_KINDS))],
                        packed_qkv=bool(pick(_PACKED, 0, 2)), seed=pick(_CASE_SEED, 0, 2 ** 32),
                        nonfinite=bool(pick(_NONFINITE, 0, 2)), generator="counter")


# Prefill: an engine's max batched tokens (2,048 to 16,384) is where kernels switch tiles, grids
# and kernels, and where 16-bit grid dimensions and 32-bit offsets overflow.
PREFILL_MAX_TOKENS = 16384
PREFILL_MAX_Q_ELEMENTS = 1 << 26
POWER_OF_TWO_BOUNDARIES = tuple((1 << k) + d for k in range(10, 15) for d in (-1, 0, 1))   # 1023 .. 16385


def boundary_token_counts(thresholds=()) -> tuple[int, ...]:
    """Every boundary a prefill property must cross: each declared switch (n - 1, n, n + 1) and
    the powers of two from 1,024 to 16,384, each +-1."""
    around = {t + d for t in thresholds for d in (-1, 0, 1) if t + d >= 1}
    return tuple(sorted(around | set(POWER_OF_TWO_BOUNDARIES)))


def prefill_token_counts(thresholds=()):
    """A prefill token count: a boundary (declared switch or power of two, +-1) or a count of
    one of the octaves from 1,024 to 16,384, each octave its own branch; shrinks towards the
    smallest boundary.  Each octave is a branch because Hypothesis favours a range's smallest
    value: one range of 1,024-16,384, with the first boundary, makes 1,023-1,025 about half of
    the draws inside prefill_cases, and a path switched at 4,096 tokens is met in one example of
    nine; with an octave each, in one of five."""
    octaves = (st.integers(1 << k, (2 << k) - 1) for k in range(10, PREFILL_MAX_TOKENS.bit_length() - 1))
    return st.one_of(st.sampled_from(boundary_token_counts(thresholds)), *octaves)


@_memoized
@st.composite
def prefill_cases(draw, *, tokens, small_heads: bool, nonfinite: bool = False):
    """A rotation case of ``tokens`` (a strategy) tokens, any layout, pairing and dtype.
    ``small_heads``: one query head of 16 or 32 channels and at most one kv head (the Triton
    interpreter runs a program at a time: few, small heads keep a 16k-token example cheap);
    otherwise real head counts and sizes, as on a GPU."""
    kind = draw(st.sampled_from(KINDS))
    dtype = draw(st.sampled_from(list(DTYPES)))
    spec = draw(rope_specs(kind=kind, head_sizes=(16, 32) if small_heads else HEAD_SIZES,
                           max_positions=(32768, 4096, 131072)))
    nq, nkv = (1, draw(st.integers(0, 1))) if small_heads else draw(head_counts())
    num_tokens = draw(tokens)
    # At most PREFILL_MAX_Q_ELEMENTS in q (16,384 tokens x 32 heads of 128): the float64 reference
    # and the comparison of a 96-head, 256-wide case would take ~20 GB of host memory per worker.
    nq = max(1, min(nq, PREFILL_MAX_Q_ELEMENTS // (num_tokens * spec.head_size)))
    nkv = min(nkv, nq)
    return RotationCase(spec=spec, num_tokens=num_tokens, num_q_heads=nq, num_kv_heads=nkv, dtype=dtype,
                        positions_kind=draw(_one_of(POSITION_KINDS)), packed_qkv=draw(_BOOLEANS),
                        seed=draw(_SEEDS), nonfinite=nonfinite and draw(_BOOLEANS), generator="counter")


def affine_table(num_dims: int, slots: int, model_len: int, scale: int = 1, offset: int = 0) -> tuple:
    """A runner's prefill_positions, flattened [slots * num_dims][model_len]: an affine pattern,
    distinct per row and column (long prompts: no draw per entry), from ``offset`` on."""
    rows = torch.arange(slots * num_dims)
    base = offset + 3 * (rows % num_dims) + 1000 * (rows // num_dims)
    return tuple((scale * torch.arange(model_len) + base[:, None]).flatten().tolist())


# The magnitudes models reach: positions to 2^20 (Qwen3.5 to about 1M tokens) and deltas to -2^20
# (an hour of video at Qwen2.5-VL's rates compresses about a million tokens' positions), beside the
# small values that shrink well.  A 16-bit slot for either shows past 2^15.
MAX_MODEL_POSITION = 1 << 20
_SMALL_DELTAS = st.integers(-40, 40)
# Past 2^15 either way as often as not: a draw of the whole range lands there rarely enough that a
# derandomized run of 20 examples missed a delta kept in 16 bits.
_DELTAS = (_SMALL_DELTAS | st.integers(-MAX_MODEL_POSITION, -(1 << 15))
           | st.integers(1 << 15, MAX_MODEL_POSITION))


@st.composite
def _table_offset(draw, highest_entry: int):
    """Where a prompt's positions start: 0, or anywhere that keeps its largest below 2^20."""
    room = MAX_MODEL_POSITION - 1 - highest_entry
    return draw(st.just(0) | st.integers(0, room)) if room > 0 else 0


@st.composite
def _slot_progress(draw, prefill_len: int, small_steps: int):
    """(num_computed_tokens, prefill_delta) of one slot: mid-prompt (chunked prefill), at its end,
    or decoding past it; a decoding slot's position (computed + delta) is never negative, as in a
    runner, so a large negative delta comes with the long prompt behind it."""
    computed = draw(st.integers(0, prefill_len + small_steps))
    delta = draw(_DELTAS)
    if computed >= prefill_len and computed + delta < 0:
        computed += -delta - computed + draw(st.integers(0, small_steps))      # that many tokens generated
    return computed, delta


@st.composite
def prefill_steps(draw, *, max_tokens: int = PREFILL_MAX_TOKENS):
    """A runner step of prefill size: 1 to 4 prefill chunks whose tokens total a boundary count or
    any count from 1,024 to ``max_tokens`` (each far longer than any block a kernel takes), beside
    an optional decode request; positions come from an affine table per row (distinct per row and
    column).  Shrinks to one request of the smallest boundary."""
    dims = draw(st.sampled_from([3, 1, 4]))
    counts = [n for n in boundary_token_counts() if n <= max_tokens]
    total = draw(st.sampled_from(counts) | st.integers(min(1024, max_tokens), max_tokens))
    num_prefill = draw(st.integers(1, 4))
    cuts = draw(st.lists(st.integers(1, total - 1), min_size=num_prefill - 1, max_size=num_prefill - 1,
                         unique=True)) if total > num_prefill else []
    edges = [0] + sorted(cuts) + [total]
    chunks = [b - a for a, b in zip(edges, edges[1:])]
    computed = [draw(st.integers(0, 64)) for _ in chunks]              # mid-prompt: chunked prefill
    prefill_lens = [c + n + draw(st.integers(0, 8)) for c, n in zip(computed, chunks)]
    query_lens = list(chunks)
    if draw(st.booleans()):                                             # a decode request beside them
        prefill_lens.append(draw(st.integers(1, 64)))
        computed.append(prefill_lens[-1] + draw(st.integers(0, 8)))
        query_lens.append(draw(st.integers(1, 3)))
    slots = len(query_lens) + draw(st.integers(0, 2))
    prefill_lens += [0] * (slots - len(prefill_lens))
    computed += [0] * (slots - len(computed))
    model_len = max(prefill_lens)
    scale = draw(st.integers(1, 5))
    offset = draw(_table_offset(scale * model_len + 1000 * slots + 3 * dims))
    table = affine_table(dims, slots, model_len, scale, offset)
    mapping = draw(st.permutations(range(slots)))[:len(query_lens)]
    # Request b of the step is the slot mapping[b]: its lengths move to that slot.
    lens, comp = [0] * slots, [0] * slots
    for b, r in enumerate(mapping):
        lens[r], comp[r] = prefill_lens[b], computed[b]
    # A decoding slot's delta keeps its position (computed + delta) non-negative.
    deltas = tuple(max(draw(_DELTAS), -comp[r]) if comp[r] >= lens[r] else draw(_DELTAS) for r in range(slots))
    return RaggedBatch(dims, table, deltas, tuple(lens), tuple(comp), tuple(mapping), tuple(query_lens),
                       draw(st.integers(0, 5)))


def case_id(impl: str, device: str, dtype: str, kind: str, neox: bool) -> str:
    """Test id in the project's format: ``triton-cuda-bf16-interleaved-gptj``."""
    return f"{impl}-{device}-{DTYPE_SHORT.get(dtype, dtype)}-{kind}-{'neox' if neox else 'gptj'}"


@st.composite
def ragged_batches(draw, *, num_dims: int | None = None, max_reqs: int = 6, max_model_len: int = 48):
    """A step mixing prefill, chunked prefill and decode requests over an arbitrary injective
    slot mapping; shrinks to one request, one slot, short prompts, identity mapping.  Prompts
    longer than 64 positions get an affine table (one draw per entry would be thousands)."""
    dims = draw(st.sampled_from([3, 1, 4])) if num_dims is None else num_dims
    slots = draw(st.integers(1, max_reqs))
    model_len = draw(st.integers(1, max_model_len))
    if model_len <= 64 and draw(st.booleans()):
        offset = draw(_table_offset(10 * model_len))
        table = tuple(offset + draw(st.integers(0, 10 * model_len)) for _ in range(slots * dims * model_len))
    else:
        scale = draw(st.integers(1, 5))
        offset = draw(_table_offset(scale * model_len + 1000 * slots + 3 * dims))
        table = affine_table(dims, slots, model_len, scale, offset)
    prefill_lens = [draw(st.integers(0, model_len)) for _ in range(slots)]
    computed, deltas = [], []
    for r in range(slots):
        # Any progress: mid-prompt (chunked prefill), at the end, or decoding past it.
        nc, delta = draw(_slot_progress(prefill_lens[r], 8))
        computed.append(nc)
        deltas.append(delta)
    num_reqs = draw(st.integers(0, slots))
    mapping = draw(st.permutations(range(slots)))[:num_reqs]
    query_lens = []
    for r in mapping:
        if computed[r] < prefill_lens[r]:          # prefill: a chunk of what is left
            query_lens.append(draw(st.integers(1, prefill_lens[r] - computed[r])))
        else:                                      # decode (several tokens: speculative decoding)
            query_lens.append(draw(st.integers(0, 3)))
    return RaggedBatch(dims, table, tuple(deltas), tuple(prefill_lens),
                       tuple(computed), tuple(mapping), tuple(query_lens), draw(st.integers(0, 5)))


def as_1d(spec: RopeSpec) -> RopeSpec:
    """The 1-D spec of ``spec``'s frequencies: XD-RoPE's NTK-alpha folded into the base (1-D RoPE takes
    no ntk_alpha); with all position rows equal, every layout rotates as this spec does."""
    return RopeSpec(spec.head_size, spec.rotary_dim, spec.is_neox_style, None, "chunked", spec.effective_base,
                    spec.max_position)

