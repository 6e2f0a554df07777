"""Where a check's time goes: seconds per phase, summed in each test process.

Every rotation check passes through the same phases (rope.harness.rotation.check): building the
inputs, the implementation's call (``jit`` instead of ``call`` when a Triton kernel compiled
during it), the float64 reference, the comparison, the read-only checks and the record write.
The plugin adds each test's wall time and the process's session time, and writes one
``profile`` record per process at its end (rope.harness.report), so a run's or a campaign's
report can say how much of the time went to Hypothesis and pytest rather than to the checks.
Timing is two ``perf_counter`` calls per phase: always on.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import defaultdict

PHASES = ("inputs", "call", "jit", "reference", "compare", "checks", "record")
_seconds: dict[str, float] = defaultdict(float)
_counts: dict[str, int] = defaultdict(int)
_by_test: dict[str, list] = defaultdict(lambda: [0.0, 0])   # test function -> [seconds, implementation calls]
_compiles = [0]          # Triton compiles seen in this process (jit_cache_hook)
_hooked = [False]


@contextlib.contextmanager
def phase(name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        _seconds[name] += time.perf_counter() - start
        _counts[name] += 1


@contextlib.contextmanager
def call_phase():
    """The implementation's call: counted as ``jit`` when a Triton kernel compiled during it
    (a first launch of a new specialization: the compile, or its load from Triton's disk cache)."""
    _hook_triton()
    before = _compiles[0]
    start = time.perf_counter()
    try:
        yield
    finally:
        name = "jit" if _compiles[0] != before else "call"
        _seconds[name] += time.perf_counter() - start
        _counts[name] += 1


def add(name: str, seconds: float) -> None:
    _seconds[name] += seconds
    _counts[name] += 1


def calls() -> int:
    """Implementation calls timed in this process so far."""
    return _counts["call"] + _counts["jit"]


def add_test(test: str, seconds: float, calls_made: int) -> None:
    """One test's wall time (Hypothesis and all) and the implementation calls it made."""
    add("tests", seconds)
    _by_test[test][0] += seconds
    _by_test[test][1] += calls_made


def _hook_triton() -> None:
    """Count Triton's compiles through its ``jit_cache_hook`` (called before each compile of a
    kernel specialization this process has not launched yet), keeping any hook already set."""
    if _hooked[0] or "triton" not in sys.modules:
        return
    _hooked[0] = True
    try:
        from triton import knobs
    except ImportError:            # a Triton without knobs: compiles are counted as calls
        return
    previous = knobs.runtime.jit_cache_hook

    def count(*args, **kwargs):
        _compiles[0] += 1
        return previous(*args, **kwargs) if previous is not None else False

    knobs.runtime.jit_cache_hook = count


def gpu_memory_peaks() -> dict:
    """The most GPU memory PyTorch's caching allocator held in this process, on the device where it
    held the most: {"allocated": bytes, "reserved": bytes} ({} where no GPU was used).  Reserved is
    what the other processes on the GPU cannot have (allocated, and cached for reuse); the CUDA context
    and compiled kernels come on top.  Host-side counters: no device wait."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return {}
        peaks = [(torch.cuda.max_memory_allocated(d), torch.cuda.max_memory_reserved(d))
                 for d in range(torch.cuda.device_count())]
    except Exception:   # noqa: BLE001 - a profile without memory, never a failed run
        return {}
    return {"allocated": max(a for a, _ in peaks), "reserved": max(r for _, r in peaks)} if peaks else {}


def snapshot() -> dict:
    """This process's totals: seconds and counts per phase (and any extra names), compiles, and its
    GPU memory peaks where it used a GPU."""
    out = {"seconds": {k: round(v, 6) for k, v in _seconds.items()}, "counts": dict(_counts),
           "compiles": _compiles[0], "tests": {k: [round(v[0], 6), v[1]] for k, v in _by_test.items()}}
    memory = gpu_memory_peaks()
    if memory:
        out["gpu_memory"] = memory
    return out


def reset() -> None:
    _seconds.clear()
    _counts.clear()
    _by_test.clear()
    _compiles[0] = 0


def combine(profiles: list[dict]) -> dict | None:
    """The profile records of a run's processes, summed: seconds and counts per phase, compiles,
    process count, and the seconds of tests not spent in a phase (Hypothesis, pytest, fixtures)."""
    if not profiles:
        return None
    seconds, counts, compiles, tests = defaultdict(float), defaultdict(int), 0, defaultdict(lambda: [0.0, 0])
    for p in profiles:
        for k, (sec, n) in p.get("tests", {}).items():
            tests[k][0] += float(sec)
            tests[k][1] += int(n)
        for k, v in p.get("seconds", {}).items():
            seconds[k] += float(v)
        for k, v in p.get("counts", {}).items():
            counts[k] += int(v)
        compiles += int(p.get("compiles", 0))
    checked = sum(seconds.get(k, 0.0) for k in PHASES)
    outside = max(0.0, seconds.get("tests", 0.0) - checked)
    out = {"processes": len(profiles), "seconds": dict(seconds), "counts": dict(counts), "compiles": compiles,
           "calls": counts.get("call", 0) + counts.get("jit", 0), "outside_phases": outside,
           "tests": {k: v for k, v in sorted(tests.items(), key=lambda kv: -kv[1][0])}}
    memory = [p["gpu_memory"] for p in profiles if p.get("gpu_memory")]
    if memory:
        # The most one process held, and the sum of every process's peak: what the run may hold at once
        # at most (the peaks need not coincide).
        out["gpu_memory"] = {"processes": len(memory),
                             **{f"{k}_max": max(int(m[k]) for m in memory) for k in ("allocated", "reserved")},
                             **{f"{k}_sum": sum(int(m[k]) for m in memory) for k in ("allocated", "reserved")}}
    return out


def memory_line(combined: dict) -> str | None:
    """One sentence on the GPU memory the run's test processes held at their peaks (None: no GPU)."""
    m = combined.get("gpu_memory")
    if not m:
        return None
    gib = lambda n: f"{n / 2**30:.2f} GiB"       # noqa: E731
    return (f"GPU memory held by PyTorch in a test process at its peak: allocated up to {gib(m['allocated_max'])}, "
            f"reserved up to {gib(m['reserved_max'])}; the peaks of the {m['processes']} processes summed (an upper "
            f"bound of what they held at once): allocated {gib(m['allocated_sum'])}, reserved "
            f"{gib(m['reserved_sum'])}.  CUDA contexts and compiled kernels come on top.")


def markdown_rows(combined: dict, top: int = 8) -> list[str]:
    """A table: each phase's seconds (summed over processes), share of test time, ms per call."""
    s, calls = combined["seconds"], combined["calls"]
    per_call = (lambda v: f"{1000 * v / calls:.2f}") if calls else (lambda v: "-")
    tests = s.get("tests", 0.0) or sum(s.get(k, 0.0) for k in PHASES) or 1e-9
    rows = [("building inputs", "inputs"), ("implementation call", "call"),
            (f"call with a Triton compile ({combined['compiles']} compiles)", "jit"),
            ("float64 reference", "reference"), ("comparison", "compare"), ("read-only checks", "checks"),
            ("record write", "record")]
    lines = ["| phase | s (all processes) | share of test time | ms per implementation call |", "|---|---:|---:|---:|"]
    for label, key in rows:
        v = s.get(key, 0.0)
        lines.append(f"| {label} | {v:.1f} | {100 * v / tests:.1f}% | {per_call(v)} |")
        if key == "jit" and s.get("compile_wait"):
            v = s["compile_wait"]
            lines.append(f"| of which waiting for another process's compile of the same kernel "
                         f"({combined['counts'].get('compile_wait', 0)}) | {v:.1f} | {100 * v / tests:.1f}% | "
                         f"{per_call(v)} |")
        if key == "inputs" and s.get("table_builds"):
            v = s["table_builds"]
            lines.append(f"| of which cos/sin tables built ({combined['counts'].get('table_builds', 0)}) | {v:.1f} | "
                         f"{100 * v / tests:.1f}% | {per_call(v)} |")
        if key == "inputs" and s.get("table_loads"):
            v = s["table_loads"]
            lines.append(f"| of which cos/sin tables mapped from the host's store "
                         f"({combined['counts'].get('table_loads', 0)}) | {v:.1f} | {100 * v / tests:.1f}% | {per_call(v)} |")
    out = combined["outside_phases"]
    lines.append(f"| Hypothesis, pytest and test code outside the phases | {out:.1f} | {100 * out / tests:.1f}% | "
                 f"{per_call(out)} |")
    session = s.get("session", 0.0)
    if session:
        between = max(0.0, session - s.get("tests", 0.0))
        lines.append(f"| between tests (collection, fixtures, scheduling) | {between:.1f} | - | "
                     f"{per_call(between)} |")
    memory = memory_line(combined)
    if memory:
        lines += ["", memory]
    slowest = list(combined.get("tests", {}).items())[:top]
    if slowest:
        lines += ["", f"The {len(slowest)} slowest test functions:", "",
                  "| test | s | share of test time | implementation calls | ms per call |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {name} | {sec:.1f} | {100 * sec / tests:.1f}% | {n} | {1000 * sec / n:.2f} |" if n else
                  f"| {name} | {sec:.1f} | {100 * sec / tests:.1f}% | 0 | - |" for name, (sec, n) in slowest]
    return lines
