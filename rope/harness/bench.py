"""``rope-harness bench``: rotation and position-step kernels timed against the memory
floor.

Rotary embedding is memory bound.  The floor for one call is the bytes it must move: the
rotated channels of q and k read and written, one cos and one sin value per frequency per
token, and the positions.  Each result is reported as time, achieved GB/s over those bytes,
the fraction of the device's measured copy bandwidth, and the speedup over native eager; on a GPU
each row also gets its own floor, the fastest stream that moves a rotation's bytes in its pattern
(the rotated channels in place, with the positions read and the cos/sin entries gathered as a
rotation gathers them) and does nothing else, and beside it the fastest stream over the rotated
channels alone, timed by the same timers (rope.harness.bench_floor), and ours is raced in the
peers' chain mode (rope.harness.bench.race).  The reports: rope.harness.bench_report.

Timing on CUDA: CUDA graphs for small sizes (``do_bench_cudagraph``: no Python launch
overhead); above, input rotation: the call cycles through enough copies of its inputs that one
pass moves four L2 caches of bytes (about two held), back to back (one round captured in a CUDA
graph), timed with device events, median of 7.  Each call so finds its inputs in DRAM, as inside
a model, and is not charged for writing back a flush buffer: ``do_bench``'s L2 clearing (a 256 MB
memset before every call) leaves the L2 full of dirty lines that the next timed call must write
back; at 4096 tokens on the H200 that added 8% (Qwen2.5-VL-72B) to 65% (Qwen3-VL-8B) to the time
(docs/bench.md, "What the numbers mean").  Every implementation's output is checked against the
float64 reference (on a sample of tokens) before it is timed.
"""

from __future__ import annotations

import functools
import math
import platform
import statistics
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

import reference
from rope.cache import cos_sin_cache
from rope.devices import synchronize, torch_device
from rope.models import load_models
from rope.harness.bench_contenders import (CONTENDERS, NO_OVERLAP, contenders, no_overlap_contender, runs_here,
                                           timed_here)
from rope.harness.bench_floor import measure_floor
from rope.spec import RopeSpec
from rope.harness.rotation.bound import compare_rotation
from rope.triton.pdl import HAS_PDL
from rope.triton.targets import pdl_available

if HAS_PDL:     # _empty_kernel's PDL variant calls these by their global names
    from rope.triton.pdl import gdc_launch_dependents, gdc_wait  # noqa: F401

TOKENS = (1, 16, 256, 4096, 16384, 65536)
POSITION_SHAPES = ((256, 1), (64, 256), (16, 4096))    # (requests, tokens each): decode, mixed, prefill
CPU_TOKENS = (1, 16, 256)                               # off the GPU: what a CPU times in seconds
CPU_POSITION_SHAPES = ((16, 1), (4, 64))
INTERPRETER_CHECK_TOKENS = 16   # the Triton interpreter (CPU) checks up to this size: ~20 s a call at 256 tokens
DEFAULT_MODELS = ("qwen2.5-vl-72b", "qwen3-vl-8b", "glm-4.1v-9b", "hunyuan-ocr")
# On a GPU also the MoE model of interleaved M-RoPE and a 1-D model (FlashInfer's only kind).
GPU_MODELS = DEFAULT_MODELS + ("qwen3-vl-30b-a3b", "qwen2-7b")
GRAPH_MAX_TOKENS = 256          # CUDA graphs below this size
HOST_CALLS = 50                 # calls per round of the host-time clock: well inside the GPU's launch queue
HOST_ROUNDS = 11
CHECK_TOKENS = 64               # tokens compared with the reference before timing
COPY_QUOTED_FROM = 16384        # the race quotes the 1 GiB copy's bandwidth from this many tokens


@dataclass
class Result:
    kind: str                    # "rotation" | "positions"
    impl: str
    model: str
    tokens: int
    dtype: str
    ms: float
    bytes: int
    gbps: float
    frac_copy: float
    speedup_vs_native: float | None = None
    checked: str = ""            # "ok (worst error/bound 0.61)" or the failure
    timing: str = ""             # "cudagraph" | "rotating+graph" | "rotating" | "wall" | "interpreter: ..."
    ours: bool = False
    note: str = ""               # e.g. torch-compile's Dynamo graph count
    host_us: float = math.nan    # the host's time per call, calls back to back (GPU only)
    eager_ms: float = math.nan   # triton.testing.do_bench: launched from Python, the L2 flushed (GPU only)
    copy_eager_ms: float = math.nan   # the same bytes copied, under the same timer (GPU only): the flush's floor
    floor_ms: float = math.nan        # the row's same-bytes floor (rope.harness.bench_floor) under the graph /
    floor_how: str = ""               # rotating timer, and its timer and variant (GPU only)
    floor_eager_ms: float = math.nan  # the same floor under the eager timer, and its variant
    floor_eager_how: str = ""
    channels_ms: float = math.nan     # the fastest stream over the rotated channels alone (fewer bytes;
    channels_how: str = ""            # bench_floor) under the graph / rotating timer, its variant,
    channels_eager_ms: float = math.nan  # and under the eager timer (GPU only)


# ------------------------------------------------------------------------------------ bytes
def rotation_bytes(spec: RopeSpec, tokens: int, num_q: int, num_kv: int, elsize: int) -> int:
    """The floor: rotated channels read + written, cos and sin per frequency, positions (int64)."""
    qk = 2 * tokens * (num_q + num_kv) * spec.rotary_dim * elsize
    cos_sin = tokens * spec.rotary_dim * elsize
    return qk + cos_sin + tokens * spec.num_dims * 8


# ------------------------------------------------------------------------------------ timing
ROTATE_L2_MULTIPLE = 4          # one pass over the rotated input sets moves this many L2 caches of bytes
MAX_INPUT_SETS = 128


def input_sets(device: str, nbytes: int, tokens: int) -> int:
    """How many copies of the inputs to rotate through so that one pass over them moves
    ROTATE_L2_MULTIPLE times the L2 cache in bytes (``nbytes``: read + written per call, so the
    copies hold about half that: two L2s, in place): each call then finds its inputs in DRAM, as a
    call inside a model would, without the timer writing a flush buffer between calls.  One set
    off the GPU and at <= GRAPH_MAX_TOKENS tokens (timed under a CUDA graph on one set)."""
    if device not in ("cuda", "rocm") or tokens <= GRAPH_MAX_TOKENS:
        return 1
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or (64 << 20)
    return max(1, min(MAX_INPUT_SETS, math.ceil(ROTATE_L2_MULTIPLE * l2 / max(1, nbytes))))


@contextmanager
def _graph_capture_may_fail():
    """A capture attempt whose failure is handled (the timing falls back and says so in its
    ``timing`` column): torch warns "The CUDA Graph is empty" when a capture raised before anything
    was recorded (an implementation that reads a length on the host), which is not news to the reader."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        yield


def _time_rotating(fns, target_ms: float = 100.0, repeats: int = 7, graph: bool = True) -> tuple[float, str]:
    """Median time per call of back-to-back calls cycling through ``fns`` (one per input set),
    timed with device events over rounds.  One round is captured in a CUDA graph when it can be
    and ``graph`` (no host launch gaps between calls); else the calls are launched from Python."""
    round_fn = lambda: [f() for f in fns]   # noqa: E731
    how = "rotating"
    try:
        if not graph:
            raise RuntimeError("graph capture not wanted")
        torch.cuda.synchronize()
        cuda_graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            round_fn()                          # warm-up on the side stream, as capture requires
        torch.cuda.current_stream().wait_stream(stream)
        with _graph_capture_may_fail(), torch.cuda.graph(cuda_graph):
            round_fn()
        round_fn = cuda_graph.replay
        how = "rotating+graph"
    except Exception:                           # capture not possible (e.g. torch.compile guards)
        torch.cuda.synchronize()
    round_fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    round_fn()
    end.record()
    end.synchronize()
    rounds = max(1, min(1000, int(target_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(rounds):
            round_fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (rounds * len(fns)))
    return statistics.median(times), how


def time_launched(fns, target_ms: float = 100.0) -> tuple[float, str]:
    """Median time per call of ``fns`` (one per input set) launched from Python back to back, device
    events: the timer of a race whose contenders cannot all be captured in a CUDA graph."""
    return _time_rotating(fns, target_ms, graph=False)


def _timer(device: str, target_ms: float = 50.0):
    """``time_fn(fns, tokens) -> (ms, how)``: ``fns`` are the same call on different input sets
    (see :func:`input_sets`).  CUDA: CUDA graphs at <= GRAPH_MAX_TOKENS (the first set: decode
    sizes live in the L2 anyway, and a launch is what they measure), else back-to-back calls
    rotating through the sets.  Elsewhere: the wall clock."""
    if device in ("cuda", "rocm"):
        import triton.testing as tt

        def time_fn(fns, tokens):
            fns[0]()
            synchronize(device)
            if tokens <= GRAPH_MAX_TOKENS:
                try:
                    with _graph_capture_may_fail():
                        return tt.do_bench_cudagraph(fns[0], rep=50, return_mode="median"), "cudagraph"
                except Exception:   # graph capture not possible (e.g. torch.compile guards): fall back
                    pass
            return _time_rotating(fns, target_ms)
        return time_fn

    def wall(fns, tokens):
        fn = fns[0]
        fn()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times), "wall"
    return wall


def copy_bandwidth(device: str) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), 1 GiB on GPUs, launched
    from Python: captured in a CUDA graph, the copy becomes a memcpy node that ran at 2.7 TB/s on
    the H200 against 4.2 TB/s for the same copy launched as a kernel (docs/bench.md, "What the numbers mean")."""
    n = (1 << 30) if device in ("cuda", "rocm") else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=torch_device(device))
    dst = torch.empty_like(src)
    copy = [lambda: dst.copy_(src)]
    if device in ("cuda", "rocm"):
        copy[0]()
        ms, _ = _time_rotating(copy, graph=False)
    else:
        ms, _ = _timer(device)(copy, tokens=1 << 30)
    return 2 * n / (ms * 1e-3) / 1e9


@triton.jit
def _empty_kernel(x_ptr, PDL: tl.constexpr):
    if PDL:             # compiled only where rope.triton.targets.pdl_available
        gdc_wait()
        gdc_launch_dependents()


def empty_launch_ms(device: str, pdl: bool = False) -> float:
    """Time of a Triton kernel that does nothing (one program), under the small-size timer.  ``pdl``:
    the same kernel launched with programmatic dependent launch (it waits for the launch before it,
    then lets the next one start), as the rotation kernel is launched at decode sizes on Hopper
    and later; NaN where PDL is not available."""
    from rope.devices import triton_runs_on

    if not triton_runs_on(device):      # e.g. the CPU of a GPU box (no interpreter there)
        return float("nan")
    x = torch.empty(1, device=torch_device(device))
    if pdl and not pdl_available(x.device):
        return float("nan")
    extra = {"launch_pdl": True} if pdl else {}
    ms, _ = _timer(device)([lambda: _empty_kernel[(1,)](x, PDL=pdl, **extra)], tokens=1)
    return ms


# ------------------------------------------------------------------------------------ running
def public_entry(fn):
    """``fn`` as a user calls it: the same callable and declarations without ``unchecked``, so the
    bench times the public entry (its checks included) beside the unchecked launch."""
    def public(*args):
        return fn(*args)
    for attr in ("working_precision", "supports", "unsupported_reason", "switch_tokens"):
        if hasattr(fn, attr):
            setattr(public, attr, getattr(fn, attr))
    return public


def _inputs(spec, tokens, num_q, num_kv, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dev = torch_device(device)
    rows = spec.num_dims
    limit = spec.max_position
    pos = torch.randint(0, limit, (rows, tokens), generator=gen)
    pos = pos[0] if rows == 1 else pos
    q = torch.randn(tokens, num_q * spec.head_size, generator=gen).to(dtype)
    k = torch.randn(tokens, num_kv * spec.head_size, generator=gen).to(dtype)
    return pos.to(dev), q.to(dev), k.to(dev)


def check_outputs(spec, positions, q, k, cache, out_q, out_k, precision: str) -> str:
    """Compare a sample of tokens of ``out_q``/``out_k`` (computed from ``q``/``k``) with the
    float64 reference."""
    t = q.shape[0]
    idx = torch.linspace(0, t - 1, min(t, CHECK_TOKENS)).round().long().unique().to(q.device)
    pos = positions[..., idx]
    sub_q, sub_k = q[idx].cpu(), k[idx].cpu()
    ref_q, ref_k = reference.rotate(spec, pos.cpu(), sub_q, sub_k, cache.cpu())
    result = compare_rotation(spec, pos.cpu(), sub_q, sub_k, cache.cpu(), out_q[idx].cpu(), out_k[idx].cpu(),
                              ref_q, ref_k, precision)
    if not result.ok:
        return "MISMATCH " + result.message().splitlines()[0]
    return f"ok (worst error/bound {result.worst_ratio:.2f})"


def _bound_sets(contender, spec, positions, q, k, cache, sets: int):
    return [contender.bind(spec, positions.clone(), q.clone(), k.clone(), cache) for _ in range(sets)]


def host_us_per_call(fns: dict, device: str, calls: int = HOST_CALLS, rounds: int = HOST_ROUNDS) -> dict:
    """The host's time per call of each function in ``fns`` (name -> call): ``calls`` calls back to
    back, the clock read before the synchronize that ends the round; the functions take turns
    round by round, so that each one's median round comes from the same stretch of the host's time
    (a busy host slows them all alike).  What a serving step pays on the CPU for the call wherever
    the GPU keeps up: a round of 50 calls stays well inside the GPU's launch queue."""
    for fn in fns.values():
        fn()
    synchronize(device)
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append(time.perf_counter() - start)
            synchronize(device)
    return {name: statistics.median(t) / calls * 1e6 for name, t in times.items()}


def eager_ms(fn) -> float:
    """``triton.testing.do_bench`` as the peers' own benchmarks use it: each call launched from
    Python after an L2 flush, device events, the median; the host's launch path shows wherever it
    is longer than the flush."""
    import triton.testing as tt
    return tt.do_bench(fn, warmup=10, rep=50, return_mode="median")


def same_bytes_copy(device: str, nbytes: int):
    """A device copy that moves ``nbytes`` (half read, half written), as a rotation of that many
    bytes does: timed by :func:`eager_ms`, what any kernel of this size can reach after do_bench's
    flush, whose dirty lines the call writes back as it goes."""
    src = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device=torch_device(device))
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def race_rotation(contender, spec, positions, q, k, cache, device, time_fn, tokens, nbytes) -> dict:
    """Check one contender on these inputs, then time it where its time means something: a dict of
    Result's fields ``ms`` (the graph or rotating timer: NaN for a check without timing, the Triton
    interpreter's), ``timing``, ``checked``, ``note``, and on a GPU ``eager_ms`` (the host's time is
    taken for a whole row at once: :func:`host_us_per_call`)."""
    graphs_before = contender.graphs() if contender.graphs else 0
    out_q, out_k = contender.bind(spec, positions, q.clone(), k.clone(), cache)()
    checked = check_outputs(spec, positions, q, k, cache, out_q, out_k, contender.working_precision)
    timed = {"eager_ms": math.nan}
    if not timed_here(contender, device):
        ms, how = float("nan"), "interpreter: checked, not timed"
    else:
        calls = _bound_sets(contender, spec, positions, q, k, cache, input_sets(device, nbytes, tokens))
        ms, how = time_fn(calls, tokens)
        if device in ("cuda", "rocm"):
            timed = {"eager_ms": eager_ms(calls[0])}
        del calls
    note = ""
    if contender.graphs:
        graphs = contender.graphs() - graphs_before
        note = f"{graphs} Dynamo graph{'s' * (graphs != 1)}, fullgraph"
    return {"ms": ms, "timing": how, "checked": checked, "note": note, **timed}


def defaults(device: str) -> tuple[tuple[str, ...], tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Models, token counts and position steps timed by default: off the GPU, small sizes (a minute in all)."""
    if device in ("cuda", "rocm"):
        return GPU_MODELS, TOKENS, POSITION_SHAPES
    return DEFAULT_MODELS, CPU_TOKENS, CPU_POSITION_SHAPES


def run(models=None, tokens=None, dtypes=("bfloat16",), device="cuda", extra_impls=(),
        positions=None, progress=print, only=CONTENDERS) -> dict:
    """Race every contender (``rope.harness.bench_contenders``) on ``models`` x ``tokens`` x
    ``dtypes``, then time the position step on the ragged steps ``positions`` ((requests,
    tokens each); empty: none).  ``models``/``tokens``/``positions`` None: the device's defaults."""
    default_models, default_tokens, default_positions = defaults(device)
    models = default_models if models is None else models
    tokens = default_tokens if tokens is None else tokens
    positions = default_positions if positions is None else positions
    models_db = load_models()
    time_fn = _timer(device)
    ceiling = copy_bandwidth(device)
    empty = empty_launch_ms(device)
    empty_pdl = empty_launch_ms(device, pdl=True)
    progress(f"device {device}: copy bandwidth {ceiling:.0f} GB/s, empty launch {empty * 1e3:.1f} us"
             + (f" ({empty_pdl * 1e3:.1f} us with PDL)" if empty_pdl == empty_pdl else ""))
    found, absent = contenders(only, list(extra_impls))
    for c in found:
        if not runs_here(c, device):
            absent[c.name] = f"Triton kernels do not run on {device} here (no GPU, TRITON_INTERPRET unset)"
    found = [c for c in found if runs_here(c, device)]
    if device in ("cuda", "rocm") and "triton" in {c.name for c in found} and pdl_available(torch_device(device)):
        found.append(no_overlap_contender())    # ours in the peers' chain mode (see race)
    by_name = {c.name: c for c in found}
    for name, why in absent.items():
        progress(f"  not raced: {name}: {why}")
    skipped: dict[str, set[str]] = {}      # contender -> why it skipped some shapes
    results: list[Result] = []
    for key in models:
        model = models_db[key]
        spec = model.spec
        num_q, num_kv = model.sharded(1)
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            cache = cos_sin_cache(spec, dtype, torch_device(device))
            for t in tokens:
                positions_t, q, k = _inputs(spec, t, num_q, num_kv, dtype, device)
                nbytes = rotation_bytes(spec, t, num_q, num_kv, dtype.itemsize)
                row = {}
                for contender in found:
                    why = contender.reason(spec, dtype, device)
                    if why is not None:
                        skipped.setdefault(contender.name, set()).add(f"{key} {dtype_name}: {why}")
                        continue
                    if not timed_here(contender, device) and t > INTERPRETER_CHECK_TOKENS:
                        continue        # the interpreter checks at small sizes; its time means nothing
                    try:
                        timed = race_rotation(contender, spec, positions_t, q, k, cache, device, time_fn, t, nbytes)
                    except Exception as exc:       # recorded, the run goes on
                        progress(f"  {key} {t:>6} {contender.name}: error {type(exc).__name__}: {exc}")
                        continue
                    gbps = nbytes / (timed["ms"] * 1e-3) / 1e9
                    row[contender.name] = Result("rotation", contender.name, key, t, dtype_name, bytes=nbytes,
                                                 gbps=gbps, frac_copy=gbps / ceiling, ours=contender.ours, **timed)
                if device in ("cuda", "rocm") and row:
                    host = host_us_per_call({name: by_name[name].bind(spec, positions_t.clone(), q.clone(),
                                                                      k.clone(), cache) for name in row}, device)
                    for name, us in host.items():
                        row[name].host_us = us
                    copy_eager = eager_ms(same_bytes_copy(device, nbytes))
                    try:
                        floor = measure_floor(spec, positions_t, num_q, num_kv, cache, dtype,
                                              input_sets(device, nbytes, t), time_fn, eager_ms)
                    except Exception as exc:       # recorded, the row goes on without a floor ('-' in the report)
                        progress(f"  {key} {t:>6} floor: error {type(exc).__name__}: {exc}")
                        floor = None
                    else:
                        progress(f"  {key:<16} {t:>6} floor {floor.ms * 1e3:9.1f} us ({floor.how}), eager "
                                 f"{floor.eager_ms * 1e3:.1f} us ({floor.eager_how}); channels only "
                                 f"{floor.channels_ms * 1e3:.1f} us ({floor.channels_how}), eager "
                                 f"{floor.channels_eager_ms * 1e3:.1f} us")
                    for r in row.values():
                        r.copy_eager_ms = copy_eager
                        if floor is not None:
                            r.floor_ms, r.floor_how = floor.ms, floor.how
                            r.floor_eager_ms, r.floor_eager_how = floor.eager_ms, floor.eager_how
                            r.channels_ms, r.channels_how = floor.channels_ms, floor.channels_how
                            r.channels_eager_ms = floor.channels_eager_ms
                base = row.get("native")
                for r in row.values():
                    r.speedup_vs_native = base.ms / r.ms if base and r.ms == r.ms else None
                    results.append(r)
                    shown = f"{r.ms * 1e3:>9.1f} us {r.gbps:>7.0f} GB/s {100 * r.frac_copy:>5.1f}%" if r.ms == r.ms \
                        else f"{'(' + r.timing + ')':>31}"
                    if r.host_us == r.host_us:
                        shown += f" | eager {r.eager_ms * 1e3:7.1f} us, host {r.host_us:5.1f} us/call"
                    progress(f"  {key:<16} {t:>6} {r.impl:<17} {shown} {r.checked}")
    if positions:
        results += bench_positions(device, time_fn, ceiling, progress, shapes=positions)
    return {"device": device, "device_name": _device_name(device), "copy_gbps": ceiling,
            "empty_launch_ms": empty, "empty_launch_pdl_ms": empty_pdl, "torch": torch.__version__,
            "host": platform.node(), "absent": absent,
            "skipped": {name: sorted(whys) for name, whys in skipped.items()}, "results": [asdict(r) for r in results],
            "race": race(results)}


def race(results: list[Result]) -> list[dict]:
    """Per model, size and dtype: our unchecked launch against the fastest peer whose output passed
    its check (NaN-timed rows, the interpreter's, take no part), under the graph or rotating timer
    and, where measured (a GPU), launched from Python (``eager_*``: do_bench, the L2 flushed); and
    the host's time per call of ours (unchecked, public, Triton's own launch path) and of each peer.

    Under the graph or rotating timer the calls run back to back: where ours is launched with
    programmatic dependent launch it overlaps the call before it, which no peer does.  Where the
    run has ours without it (``triton-no-pdl``), that is the figure raced (``ours_chain``: "no
    overlap") and the overlapping one is kept beside it (``ours_pdl_ms``).  Where the row's floor was
    measured, ``floor_frac`` is the floor's time over ours (1: ours moves the bytes as fast as a
    stream that does nothing else), under each timer; ``channels_frac`` the channels-only stream's."""
    out = []
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        if r.kind == "rotation":
            groups.setdefault((r.model, r.tokens, r.dtype), []).append(r)
    for (model, tokens, dtype), rows in groups.items():
        by_name = {r.impl: r for r in rows}
        ours = by_name.get("triton")
        peers = [r for r in rows if not r.ours and r.ms == r.ms and r.checked.startswith("ok")]
        if ours is None or ours.ms != ours.ms or not peers:
            continue
        chained = by_name.get(NO_OVERLAP)
        timed_and_right = chained is not None and chained.ms == chained.ms and chained.checked.startswith("ok")
        raced = chained if timed_and_right else ours
        best = min(peers, key=lambda r: r.ms)
        row = {"model": model, "tokens": tokens, "dtype": dtype, "ours_ms": raced.ms, "best_peer": best.impl,
               "best_peer_ms": best.ms, "ratio": raced.ms / best.ms}
        if raced is not ours:
            row |= {"ours_chain": "no overlap", "ours_pdl_ms": ours.ms}
        if ours.floor_ms == ours.floor_ms:
            row |= {"floor_ms": ours.floor_ms, "floor_how": ours.floor_how, "floor_frac": ours.floor_ms / raced.ms,
                    "copy_frac": raced.frac_copy}
        if ours.channels_ms == ours.channels_ms:
            row |= {"channels_ms": ours.channels_ms, "channels_how": ours.channels_how,
                    "channels_frac": ours.channels_ms / raced.ms}
        eager = [r for r in peers if r.eager_ms == r.eager_ms]
        if ours.eager_ms == ours.eager_ms and eager:
            best_eager = min(eager, key=lambda r: r.eager_ms)
            row |= {"ours_eager_ms": ours.eager_ms, "ours_eager_frac": ours.frac_copy * ours.ms / ours.eager_ms,
                    "best_eager_peer": best_eager.impl, "best_eager_peer_ms": best_eager.eager_ms,
                    "eager_ratio": ours.eager_ms / best_eager.eager_ms,
                    "copy_eager_ms": ours.copy_eager_ms,
                    "copy_eager_frac": ours.frac_copy * ours.ms / ours.copy_eager_ms,
                    "host_us": {name: by_name[name].host_us for name in ("triton", "triton-public", "triton-bare")
                                if name in by_name},
                    "peers_host_us": {r.impl: r.host_us for r in eager}}
            if ours.floor_eager_ms == ours.floor_eager_ms:
                row |= {"floor_eager_ms": ours.floor_eager_ms, "floor_eager_how": ours.floor_eager_how,
                        "floor_eager_frac": ours.floor_eager_ms / ours.eager_ms}
            if ours.channels_eager_ms == ours.channels_eager_ms:
                row |= {"channels_eager_ms": ours.channels_eager_ms,
                        "channels_eager_frac": ours.channels_eager_ms / ours.eager_ms}
        out.append(row)
    return out


def position_inputs(device: str, num_reqs: int, chunk: int, dims: int = 3):
    """A ragged step of ``num_reqs`` requests of ``chunk`` tokens each (chunk 1: all decode, else
    prefill chunks at random progress) over a randomly mapped slot table: ``(args, tokens, nbytes)``
    with ``args`` the position-step inputs before ``num_dims``, ``nbytes`` the floor's bytes
    (positions written, and read from the table for prefill, plus five int32 per request)."""
    max_len = max(8192, 2 * chunk)
    gen = torch.Generator().manual_seed(num_reqs)
    table = torch.randint(0, 1 << 20, (num_reqs * dims, max_len), generator=gen, dtype=torch.int32)
    lens = torch.full((num_reqs,), max_len, dtype=torch.int32)
    computed = torch.randint(0, max_len - chunk, (num_reqs,), generator=gen, dtype=torch.int32)
    if chunk == 1:
        computed = lens.clone()                           # all decode
    mapping = torch.randperm(num_reqs, generator=gen).to(torch.int32)
    starts = torch.arange(0, (num_reqs + 1) * chunk, chunk, dtype=torch.int32)
    dev = torch_device(device)
    args = [x.to(dev) for x in (table, torch.zeros(num_reqs, dtype=torch.int32), mapping, starts, lens, computed)]
    tokens = num_reqs * chunk
    return args, tokens, tokens * dims * (8 + (4 if chunk > 1 else 0)) + num_reqs * 5 * 4


def bench_positions(device, time_fn, ceiling, progress, shapes=POSITION_SHAPES) -> list[Result]:
    """The position step for ragged batches: many requests, mixed prefill chunks and decode.
    Both implementations are timed through ``fn.unchecked`` (the same work without validation and
    without a host sync), after the checked call's output was compared; on a GPU the Triton public
    entry (``triton-public``: its checks included) beside them."""
    from rope.devices import triton_runs_on
    from rope.implementation import Implementation
    from rope.registry import get_positions_implementation
    out = []
    dims = 3
    if device == "cpu":      # the CPU of a GPU box runs no Triton kernel unless TRITON_INTERPRET=1
        names = ("native", "triton") if triton_runs_on(device) else ("native",)
    else:
        names = ("native", "triton", "triton-public")
    if "triton" not in names:
        progress(f"  positions: triton not raced: Triton kernels do not run on {device} here (TRITON_INTERPRET unset)")
    for num_reqs, chunk in shapes:
        args, tokens, nbytes = position_inputs(device, num_reqs, chunk, dims)
        expected = reference.prepare_positions(*[a.cpu() for a in args], dims) if tokens <= 4096 else None
        row = {}
        for name in names:
            fn = get_positions_implementation(name.removesuffix("-public"))
            if name.endswith("-public"):
                fn = public_entry(fn)
            o = torch.zeros(dims, tokens, dtype=torch.int64, device=args[0].device)
            fn(*args, dims, o)
            checked = "ok" if expected is None or torch.equal(o.cpu(), expected) else "MISMATCH"
            if expected is None:
                checked = "ok (same as native)" if name == "native" or torch.equal(o.cpu(), row["native"][1]) else "MISMATCH"
            fn = Implementation.of(name, fn, "position_step").unchecked or fn
            if name != "native" and device == "cpu":      # the Triton interpreter: checked, not timed
                ms, how = float("nan"), "interpreter: checked, not timed"
            else:
                sets = [([a.clone() for a in args], o.clone()) for _ in range(input_sets(device, nbytes, tokens))]
                ms, how = time_fn([functools.partial(fn, *a, dims, dst) for a, dst in sets], tokens)
            gbps = nbytes / (ms * 1e-3) / 1e9
            row[name] = (Result("positions", name, f"{num_reqs}x{chunk}", tokens, "int64", ms, nbytes, gbps,
                                gbps / ceiling, checked=checked, timing=how, ours=name != "native"), o.cpu())
        for name, (r, _) in row.items():
            r.speedup_vs_native = row["native"][0].ms / r.ms if r.ms == r.ms else None
            out.append(r)
            shown = f"{r.ms * 1e3:>9.1f} us  speedup {r.speedup_vs_native:.1f}x" if r.ms == r.ms else f"({r.timing})"
            progress(f"  positions {r.model:<10} {name:<13} {shown} {r.checked}")
    return out


def _device_name(device: str) -> str:
    if device in ("cuda", "rocm"):
        return torch.cuda.get_device_name()
    return platform.processor() or "cpu"
