"""Where mismatched elements lie: ranges of indices, the (frequency, position row, pair member) of a
channel, and the location of a mask over tokens, heads and channels."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from rope.spec import RopeSpec


# --------------------------------------------------------------------------- locations
MAX_RUNS = 8      # runs a location lists in full; past this it is said as a pattern


def ranges(values) -> str:
    """Compact sorted ranges: [0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'; empty -> 'none'.  Past MAX_RUNS
    runs, a summary instead of an enumeration (a wrong kernel can leave thousands of runs): the
    count, the first and last runs, and the period where the runs repeat at one step
    ('3 of every 4 from 1: 1-3,5-7,...,16381-16383 (12288 in 4096 runs)')."""
    vals = sorted(set(int(v) for v in values))
    if not vals:
        return "none"
    runs, start, prev = [], vals[0], vals[0]
    for v in vals[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        runs.append((start, prev))
        if v is not None:
            start = prev = v
    text = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(runs) <= MAX_RUNS:
        return ",".join(text)
    shown = ",".join(text[:3]) + ",...," + text[-1]
    steps = {b2[0] - b1[0] for b1, b2 in zip(runs, runs[1:])}
    lengths = {b - a + 1 for a, b in runs[:-1]}
    pattern = ""
    if len(steps) == 1 and len(lengths) == 1:
        step, length = steps.pop(), lengths.pop()
        pattern = f"{length} of every {step} from {runs[0][0]}: "
    return f"{pattern}{shown} ({len(vals)} in {len(runs)} runs)"


def channel_location(spec: RopeSpec, channel: int) -> dict:
    """Frequency, pair member ('a' rotates as x1, 'b' as x2) and position row of a channel."""
    if channel >= spec.rotary_dim:
        return {"pass_through": True}
    half = spec.num_freqs
    if spec.is_neox_style:
        freq, member = channel % half, "a" if channel < half else "b"
    else:
        freq, member = channel // 2, "ab"[channel % 2]
    return {"freq": freq, "member": member, "row": spec.axis_map()[freq]}


def boundary_frequencies(spec: RopeSpec) -> dict:
    """frequency -> what it is at a section boundary, for the frequencies a boundary moved by one
    takes to another row: chunked, the first frequency of each section after the first ('opens row
    1') and the last of each before the last ('closes row 0'); interleaved, the last frequency of
    each bounded row and the one past its bound 3*s.  Empty for 1-D RoPE and the other maps."""
    secs = spec.sections
    if secs is None or len(secs) < 2:
        return {}
    out = {}
    if spec.layout == "chunked":
        for j, b in enumerate(itertools.accumulate(secs[:-1])):
            out.setdefault(b, f"{b} opens row {j + 1}")
            out.setdefault(b - 1, f"{b - 1} closes row {j}")
    elif spec.layout == "interleaved":
        for r in range(1, len(secs)):
            last, past = 3 * (secs[r] - 1) + r, 3 * secs[r] + r
            out.setdefault(last, f"{last} closes row {r} (i < 3*s_{r} = {3 * secs[r]})")
            if past < spec.num_freqs:
                out.setdefault(past, f"{past} is past row {r}'s bound 3*s_{r} = {3 * secs[r]}")
    return out


def boundary_note(spec: RopeSpec, freqs) -> str:
    """' (on section boundaries: 16 opens row 1, 40 opens row 2)' when every frequency in ``freqs``
    sits on a section boundary (a ``<`` / ``<=`` slip in the axis map moves exactly those), else ''."""
    at = boundary_frequencies(spec)
    if not freqs or not all(f in at for f in freqs):
        return ""
    return f" (on section boundaries: {', '.join(at[f] for f in sorted(freqs))})"


@dataclass
class _Where:
    """Mismatched elements of one tensor, as index sets."""
    count: int
    total: int
    num_tokens: int
    num_heads: int
    tokens: list
    heads: list
    freqs: list
    rows: list
    members: list
    pass_through: list

    def summary(self, spec: RopeSpec) -> dict:
        return {
            "elements": f"{self.count}/{self.total}",
            "tokens": f"{ranges(self.tokens)} of {self.num_tokens}",
            "heads": f"{ranges(self.heads)} of {self.num_heads}",
            "freqs": f"{ranges(self.freqs)} of {spec.num_freqs}{boundary_note(spec, self.freqs)}",
            "rows": ranges(self.rows),
            "members": ",".join(self.members) or "none",
            "pass_through_channels": ranges(self.pass_through),
        }


def mismatch_locations(spec: RopeSpec, bad: torch.Tensor) -> _Where:
    """bad: bool [T, H * head_size] -> index sets of the mismatched elements."""
    num_tokens = bad.shape[0]
    heads = bad.reshape(num_tokens, bad.shape[1] // spec.head_size, spec.head_size)   # (0 tokens too)
    chans = heads.any(dim=0).any(dim=0).nonzero().flatten().tolist()
    rot = [c for c in chans if c < spec.rotary_dim]
    locs = [channel_location(spec, c) for c in rot]
    return _Where(
        count=int(bad.sum()), total=bad.numel(), num_tokens=num_tokens, num_heads=heads.shape[1],
        tokens=heads.any(dim=2).any(dim=1).nonzero().flatten().tolist(),
        heads=heads.any(dim=2).any(dim=0).nonzero().flatten().tolist(),
        freqs=sorted({loc["freq"] for loc in locs}), rows=sorted({loc["row"] for loc in locs}),
        members=sorted({loc["member"] for loc in locs}),
        pass_through=[c for c in chans if c >= spec.rotary_dim])


def prev_power_of_2(n: int) -> int:
    return 1 << (n.bit_length() - 1)
