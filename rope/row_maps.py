"""Which position row drives each frequency of a rotary head: the named maps engines ship
(docs/spec.md §2).  Pure Python on tuples; :class:`rope.spec.RopeSpec` validates a spec's map and
names it.

A map is a tuple of ``num_freqs`` row indices, ``rows[i]`` the row of the positions ``[num_dims, T]``
whose value rotates frequency i.  Each named layout below turns a model's ``sections`` (as its
config writes them) into one; ``custom`` takes the map itself.
"""

from __future__ import annotations

import functools

# The named layouts, with the number of position rows each takes (None: 1 to 4).
LAYOUT_ROWS = {
    "chunked": None,                  # Qwen2-VL, Qwen2.5-VL, GLM-4.1V/4.5V, XD-RoPE
    "interleaved": 3,                 # Qwen3-VL, Qwen3.5, Qwen3-Omni: T H W T H W ..., bounded by 3*s
    "glm_round_robin": 3,             # SGLang's mrope_interleaved_glm: row i % 3, a full row passed on
    "ernie45": 3,                     # Ernie-4.5-VL: H/W alternate over the first s_h + s_w, then T
    "two_row_interleaved": 2,         # HunyuanImage-3.0: y x y x ...
}
CUSTOM = "custom"                     # any map, given frequency by frequency
LAYOUTS = (*LAYOUT_ROWS, CUSTOM)


def chunked(sections: tuple[int, ...]) -> tuple[int, ...]:
    """Row d owns the contiguous run ``sections[0] + .. + sections[d-1] <= i < .. + sections[d]``."""
    return tuple(row for row, count in enumerate(sections) for _ in range(count))


def interleaved(sections: tuple[int, ...]) -> tuple[int, ...]:
    """Qwen3-VL, sections (s_t, s_h, s_w): row 1 where ``i % 3 == 1 and i < 3*s_h``, row 2 where
    ``i % 3 == 2 and i < 3*s_w``, row 0 elsewhere.  s_t is never read: T takes the rest, so the
    rows' counts differ from the sections when 3*s_h or 3*s_w passes the frequencies ([8, 12, 12]:
    11, 11, 10)."""
    _, s_h, s_w = sections
    out = []
    for i in range(sum(sections)):
        if i % 3 == 1 and i < 3 * s_h:
            out.append(1)
        elif i % 3 == 2 and i < 3 * s_w:
            out.append(2)
        else:
            out.append(0)
    return tuple(out)


def glm_round_robin(sections: tuple[int, ...]) -> tuple[int, ...]:
    """SGLang's GLM map (``mrope_interleaved_glm``), sections (s_t, s_h, s_w): frequency i takes row
    i % 3 (T H W T H W ...) unless that row already drives its section's count, then the next row
    in turn that does not, so every row gets exactly its section.  [8, 12, 12]: 8 T H W cycles,
    then H H W H H W W W; [24, 20, 20] and [11, 11, 10]: the interleaved map of those sections."""
    taken = [0] * len(sections)
    out = []
    for i in range(sum(sections)):
        row = i % len(sections)
        while taken[row] == sections[row]:
            row = (row + 1) % len(sections)
        out.append(row)
        taken[row] += 1
    return tuple(out)


def ernie45(sections: tuple[int, ...]) -> tuple[int, ...]:
    """Ernie-4.5-VL, sections as its config writes them, (s_h, s_w, s_t) with s_h == s_w, over the
    rows (T, H, W) of its positions: below s_h + s_w even frequencies take H (row 1) and odd ones W
    (row 2); the last s_t take T (row 0)."""
    s_h, s_w, s_t = sections
    return tuple((1 if i % 2 == 0 else 2) if i < s_h + s_w else 0 for i in range(s_h + s_w + s_t))


def two_row_interleaved(sections: tuple[int, ...]) -> tuple[int, ...]:
    """HunyuanImage-3.0's 2-D map over rows (y, x): even frequencies take y (row 0), odd ones x
    (row 1); sections (ceil(F/2), floor(F/2)) are the rows' counts (vllm-omni#1784: vLLM's chunked
    map gave half of the frequencies the wrong row)."""
    return tuple(i % 2 for i in range(sum(sections)))


_BUILDERS = {"chunked": chunked, "interleaved": interleaved, "glm_round_robin": glm_round_robin,
             "ernie45": ernie45, "two_row_interleaved": two_row_interleaved}


@functools.lru_cache(maxsize=1024)
def named_map(layout: str, sections: tuple[int, ...]) -> tuple[int, ...]:
    """The map of a named layout for ``sections`` (validated by RopeSpec before)."""
    return _BUILDERS[layout](sections)


def row_counts(rows: tuple[int, ...], num_dims: int) -> tuple[int, ...]:
    """How many frequencies each of the ``num_dims`` rows drives."""
    return tuple(rows.count(d) for d in range(num_dims))


def two_row_sections(num_freqs: int) -> tuple[int, int]:
    """The two rows' counts of :func:`two_row_interleaved` over ``num_freqs`` frequencies."""
    return (num_freqs + 1) // 2, num_freqs // 2


def layout_rule_error(layout: str, sections: tuple[int, ...]) -> str | None:
    """What a named layout demands of valid ``sections`` (positive, summing right: checked before)
    beyond its row count, or None when they satisfy it."""
    if layout == "ernie45" and sections[0] != sections[1]:
        return f"layout='ernie45' needs s_h == s_w in (s_h, s_w, s_t) (got {sections[0]} and {sections[1]})"
    if layout == "two_row_interleaved" and sections != two_row_sections(sum(sections)):
        return (f"layout='two_row_interleaved' gives the rows {two_row_sections(sum(sections))} frequencies "
                f"(even ones y, odd ones x)")
    return None
