"""The prefill-size cases of properties/rotation/test_prefill.py: the explicit boundary cases (the
powers of two from 1,024 to 16,384 and the counts an implementation declares it switches at), the
token x head product cases, and how each falls back to a layout the implementation runs.  A case
module: the property tests and the project's own tests (tests/suite) build the same cases from it.

On the CPU (Triton under its interpreter runs one program at a time, ~10 ms each) the cases have
one query head of 32 channels and at most one kv head, and from 2,048 tokens a boundary (a power of
two, a declared switch) runs without its +-1; on a GPU, real head counts and every boundary.
"""

from __future__ import annotations

from properties.strategies import DTYPES, KINDS, MAPPED_LAYOUTS, RotationCase, mapped_layout_specs
from rope.registry import unsupported_reason
from rope.spec import RopeSpec

__all__ = ["BOUNDARY_KINDS", "CPU_POWER_ALONE_FROM", "POWER_OF_TWO_LOG2", "TOKEN_HEAD_PRODUCT", "TOKEN_HEAD_VARIANTS",
           "boundary_case", "declared_switch_counts", "declared_token_head_cases", "power_of_two_boundaries_run",
           "power_of_two_counts", "small_heads", "spec_of", "supported", "supported_boundary_case",
           "supported_token_head_case", "token_head_case", "token_head_variants"]

GPU_HEADS = (28, 4)          # Qwen2.5-VL-7B per rank: 28 query heads, 4 kv heads, head 128
CPU_KEY_MAX_TOKENS = 8192    # boundary cases under the interpreter carry a key below this count
POWER_OF_TWO_LOG2 = range(10, 15)   # 1,024 .. 16,384, as POWER_OF_TWO_BOUNDARIES
CPU_POWER_ALONE_FROM = 2048  # from this count the interpreter runs a boundary alone, not its +-1


def small_heads(device: str) -> bool:
    return device == "cpu"


# The layouts the boundary cases cycle through: "mapped" twice, so that the cycle (7) is prime to
# the pairing's, the dtype's and the rotary width's (2, 3, 4) and every combination comes round.
BOUNDARY_KINDS = (*KINDS, "mapped")


def spec_of(kind: str, neox: bool, head_size: int, rotary: int, index: int = 0) -> RopeSpec:
    """The spec of a prefill case; kind "mapped" takes the table-read maps in turn with ``index``:
    GLM round-robin (sections whose map differs from the interleaved one), Ernie-4.5-VL, two-row
    interleaved, and a custom map (T H W cycles reversed)."""
    half = rotary // 2
    third, quarter = half // 3, half // 4
    if kind == "mapped":
        return mapped_layout_specs(head_size, half, neox, max_position=32768)[index % len(MAPPED_LAYOUTS)]
    sections = {"1d": None, "chunked1": (half,), "chunked3": (half - 2 * third, third, third),
                "interleaved": (half - 2 * third, third, third),
                "chunked4": (half - 3 * quarter, quarter, quarter, quarter)}[kind]
    return RopeSpec(head_size, rotary, neox, sections, "interleaved" if kind == "interleaved" else "chunked",
                    max_position=32768)


def boundary_case(index: int, num_tokens: int, device: str, layout_step: int = 0) -> RotationCase:
    """The explicit case at a boundary: layout, pairing, dtype, partial rotary and packed q/k
    cycle with ``index`` (periods 7, 2, 3, 4), so neighbouring counts differ in each.
    ``layout_step`` moves the layout that many places further along its cycle (the next layout an
    implementation that lacks this one may support: :func:`supported_boundary_case`)."""
    kind = BOUNDARY_KINDS[(index + layout_step) % len(BOUNDARY_KINDS)]
    neox = index % 2 == 0
    dtype = list(DTYPES)[index % len(DTYPES)]
    head_size = 32 if small_heads(device) else 128
    spec = spec_of(kind, neox, head_size, head_size // 2 if index % 4 == 3 else head_size, index + layout_step)
    # CPU: a key on every other count below 8192 tokens (a key doubles the interpreter's programs,
    # and its programs run the same code as the query's, exercised at every smaller boundary).
    nq, nkv = (1, index % 2 if num_tokens < CPU_KEY_MAX_TOKENS else 0) if small_heads(device) else GPU_HEADS
    return RotationCase(spec, num_tokens, nq, nkv, dtype, "uniform", index % 2 == 1 and nkv > 0, index)


def power_of_two_counts(log2: int, device: str) -> tuple[int, ...]:
    """The counts test_power_of_two_boundaries_match_reference runs at 2**log2 on ``device``: the
    power first (a path switched at 2^k starts there, so a run stopping at its first failure hears
    of it one interpreted case sooner), then +1 and -1; under the interpreter, from
    CPU_POWER_ALONE_FROM, the power alone."""
    power = 1 << log2
    if small_heads(device) and power >= CPU_POWER_ALONE_FROM:
        return (power,)
    return power, power + 1, power - 1


def power_of_two_boundaries_run(device: str) -> list[int]:
    """Every count test_power_of_two_boundaries_match_reference runs on ``device``, ascending."""
    return sorted(n for k in POWER_OF_TWO_LOG2 for n in power_of_two_counts(k, device))


def supported(impl_name: str, impl, case: RotationCase, device: str) -> bool:
    return unsupported_reason(impl_name, impl, case.spec, DTYPES[case.dtype], device) is None


def supported_boundary_case(impl_name: str, impl, index: int, num_tokens: int, device: str) -> RotationCase:
    """The boundary case of ``index``, or, where the implementation does not run its layout, the
    next one along the layout cycle that it runs (same count, pairing, dtype and width): a kernel of
    chunked and interleaved sections only meets every boundary too, 16,384 tokens included,
    instead of skipping the counts whose turn fell on a map it lacks.  The cycled case itself when
    it runs none (the caller skips it)."""
    for step in range(len(BOUNDARY_KINDS)):
        case = boundary_case(index, num_tokens, device, step)
        if supported(impl_name, impl, case, device):
            return case
    return boundary_case(index, num_tokens, device)


def declared_switch_counts(thresholds, device: str) -> list[int]:
    """The counts test_declared_switches_match_reference runs: each declared switch t, t - 1 and
    t + 1 (from CPU_POWER_ALONE_FROM under the interpreter, t alone: the new path's first count),
    less the counts test_power_of_two_boundaries_match_reference runs on ``device``."""
    alone = small_heads(device)
    around = {t + d for t in thresholds for d in ((0,) if alone and t >= CPU_POWER_ALONE_FROM else (-1, 0, 1))
              if t + d >= 1}
    return sorted(around - set(power_of_two_boundaries_run(device)))


# ------------------------------------------------------------------ token x head products
# Fused kernels choose a path by tokens x (query heads + key heads): vLLM's fused QK-norm + RoPE
# takes several token-heads per warp from 10,240 on SM90, where partial-rotary NeoX broke
# (vllm#51049).  Every layout and pairing meets TOKEN_HEAD_PRODUCT, with full and partial rotary:
# on a GPU each layout in all four combinations; on the CPU NeoX and GPT-J, the partial one
# alternating by layout (Triton's interpreter takes ~12 s for a case of 2^15 token-heads of 16
# channels, many heads or few); heads of 16 channels there.
TOKEN_HEAD_PRODUCT = 1 << 15
TOKEN_HEAD_VARIANTS = [(neox, partial) for neox in (True, False) for partial in (False, True)]
CPU_TOKEN_HEADS, GPU_TOKEN_HEADS = (24, 8), (56, 8)     # query, key heads
CPU_TOKEN_HEAD_SIZE = 16
TOKEN_HEAD_MAX_TOKENS = 4096     # a declared product past this many tokens takes more query heads


def token_head_variants(kind: str, device: str) -> list[tuple[bool, bool]]:
    """(NeoX, partial rotary) of the product cases of ``kind`` on ``device``."""
    if not small_heads(device):
        return TOKEN_HEAD_VARIANTS
    partial_neox = KINDS.index(kind) % 2 == 0
    return [(True, partial_neox), (False, not partial_neox)]


def token_head_case(kind: str, neox: bool, partial: bool, index: int, device: str, product: int = TOKEN_HEAD_PRODUCT,
                    below: bool = False, map_index: int | None = None) -> RotationCase:
    """A case whose tokens x (query + key heads) is the first at or past ``product`` (``below``: the
    last under it, one token fewer), for ``kind`` and pairing, full or half rotary; dtype and packed
    q/k cycle with ``index``, and so does the map of kind "mapped" unless ``map_index`` picks it."""
    head_size = CPU_TOKEN_HEAD_SIZE if small_heads(device) else 128
    spec = spec_of(kind, neox, head_size, head_size // 2 if partial else head_size,
                 index if map_index is None else map_index)
    nq, nkv = CPU_TOKEN_HEADS if small_heads(device) else GPU_TOKEN_HEADS
    nq = max(nq, -(-product // TOKEN_HEAD_MAX_TOKENS) - nkv)
    first = -(-product // (nq + nkv))          # the first token count whose product reaches ``product``
    dtype = list(DTYPES)[index % len(DTYPES)]
    return RotationCase(spec, first - 1 if below else first, nq, nkv, dtype, "uniform", index % 2 == 1, index)


def declared_token_head_cases(thresholds, device: str) -> list[tuple[bool, RotationCase]]:
    """(below, case): for each declared product, the last token count under it and the first at
    it, NeoX and GPT-J, full and partial rotary, the layout cycling over the products."""
    out = []
    for index, product in enumerate(thresholds):
        kind = KINDS[index % len(KINDS)]
        for variant, (neox, partial) in enumerate(TOKEN_HEAD_VARIANTS):
            for below in (True, False):
                case = token_head_case(kind, neox, partial, variant, device, product, below)
                if case.num_tokens >= 1:
                    out.append((below, case))
    return out


def supported_token_head_case(impl_name: str, impl, kind: str, neox: bool, partial: bool, index: int,
                              device: str) -> RotationCase:
    """The product case of ``kind``; for "mapped", where the implementation does not run the map
    whose turn it is, the next map it runs (a kernel of one of the table-read maps meets the
    product on it)."""
    case = token_head_case(kind, neox, partial, index, device)
    if kind != "mapped" or supported(impl_name, impl, case, device):
        return case
    for step in range(1, len(MAPPED_LAYOUTS)):
        other = token_head_case(kind, neox, partial, index, device, map_index=index + step)
        if supported(impl_name, impl, other, device):
            return other
    return case
