"""The rotation's case: a rotation input described well enough to regenerate its tensors anywhere,
and the code that regenerates them.

A :class:`RotationCase` holds a spec, head counts, a token count, a dtype, a position pattern, a
memory layout (the view q and k are handed as: :data:`VIEWS`), a seed and what turns the seed into
values (:data:`GENERATORS`); :func:`build_rotation_inputs` turns it into tensors, on the device for a
``counter`` case (rope.harness.seeded), with a ``torch.Generator`` on the CPU and then copied for a
``torch-cpu`` one, so a case regenerates bit-identically on any device and from a case file.  The
Hypothesis strategies that draw it live in the test suite (properties.strategies).
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass

import torch

from rope.cache import cos_sin_cache
from rope.harness import profiling, table_store
from rope.harness.seeded import HostDraws, Request, draw_many, scalar
from rope.devices import torch_device
from rope.spec import RopeSpec

# The head sizes cases are drawn from: real models' first (64 shrinks best), then small ones for
# edge cases (the strategies draw from it; tools that sweep "every head size the properties draw" too).
HEAD_SIZES = (64, 128, 80, 96, 112, 160, 192, 256, 32, 16, 8)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

POSITION_KINDS = ("uniform", "text", "grid", "last_row")

# How q and k lie in memory, the views an engine hands an implementation that rotates in place.  On the
# three strided layouts the values are those of the contiguous case of the same seed; only the layout
# differs.  Every element of the buffer outside q's and k's views holds data of its own, drawn after q
# and k, and must come back unchanged (rope.harness.rotation.check.outside_view_problems); on the strided
# layouts each view must afterwards hold its input or exactly the output returned for it (check.in_place_problems).
#   contiguous   q and k tensors of their own, rows back to back
#   packed-qkv   column slices of one [T, (Hq + 2 Hkv) * D] qkv tensor: row stride past the width, V after k
#                (the field ``packed_qkv``, which predates ``view``, says it: view="packed-qkv" is stored so)
#   row-gaps     as_strided rows of one flat buffer: a gap of D elements before every row of q and k
#                (row stride = width + D), q's rows, then k's
#   heads-major  the transposes of a heads-major [(Hq + 2 Hkv) * D, T] qkv buffer (heads, channels, then
#                tokens): unit row stride, column stride T, V's heads after k's.  The [H, T, D] layout of
#                attention backends has no [T, H * D] view; this is the heads-major layout the contract's
#                2-D q and k can take
#   same-buffer  k then q in every row of one [T, Hkv*D + Hq*D + 3 D] buffer, a D-element gap before k,
#                between k and q and after q (llama.cpp's in-place rope on a non-contiguous view of its
#                cache, llama.cpp#20274)
VIEWS = ("contiguous", "packed-qkv", "row-gaps", "heads-major", "same-buffer")

# How a case's seed becomes its tensors, each the same bits on every device:
#   counter    rope.harness.seeded: every value a hash of (seed, stream, index), made on the device the
#              case runs on, the cases of a batch in one pass
#   torch-cpu  a torch.Generator on the host, then copied to the device (every case file written before
#              the counter, whose ``case`` has no ``generator``)
GENERATORS = ("counter", "torch-cpu")


def check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: must be one of {allowed}")


@dataclass(frozen=True)
class RotationCase:
    """A rotation input, described well enough to regenerate it anywhere."""
    spec: RopeSpec
    num_tokens: int
    num_q_heads: int
    num_kv_heads: int          # 0: key absent
    dtype: str
    positions_kind: str = "uniform"
    packed_qkv: bool = False   # q and k are row-strided views into one [T, (Hq + 2 Hkv) * hs] tensor
    seed: int = 0
    nonfinite: bool = False    # NaN, +inf and -inf planted in q and k (inject_nonfinite)
    view: str = "contiguous"   # how q and k lie in memory besides packing (VIEWS)
    # The cos/sin cache's dtype when it differs from q's and k's (None: the activation dtype): an
    # fp32 table beside bf16/fp16 activations, as FlashInfer and SGLang take it.
    cache_dtype: str | None = None
    # What makes the tensors from the seed (GENERATORS): "counter" on the device the case runs on,
    # "torch-cpu" (a case file's absent field, the cases written before) a torch.Generator on the host.
    generator: str = "torch-cpu"

    def __post_init__(self):
        check_choice("view", self.view, VIEWS)
        check_choice("generator", self.generator, GENERATORS)
        if self.view == "packed-qkv":      # one spelling per case: the flag that predates `view`
            object.__setattr__(self, "view", "contiguous")
            object.__setattr__(self, "packed_qkv", True)
        elif self.packed_qkv and self.view != "contiguous":
            raise ValueError(f"view={self.view!r}: packed_qkv=True lays q and k out as slices of a packed qkv "
                             f"tensor already; view must be 'contiguous' or 'packed-qkv' with it")
        if self.cache_dtype is not None:
            check_choice("cache_dtype", self.cache_dtype, tuple(DTYPES))

    @property
    def view_kind(self) -> str:
        """The case's entry of :data:`VIEWS` (``packed-qkv`` where ``packed_qkv`` is set)."""
        return "packed-qkv" if self.packed_qkv else self.view

    @property
    def table_dtype(self) -> str:
        """The dtype of the cos/sin cache handed to the implementation."""
        return self.cache_dtype or self.dtype

    @property
    def size(self) -> int:
        """Elements of q and k: what orders a group of failures, the smallest case first."""
        return self.num_tokens * (self.num_q_heads + self.num_kv_heads) * self.spec.head_size

    def brief(self) -> str:
        """One short line: ``3 tokens, 2 q + 1 kv heads, bfloat16, chunked3-neox``."""
        kv = f"{self.num_kv_heads} kv heads" if self.num_kv_heads else "no key"
        return (f"{self.num_tokens} tokens, {self.num_q_heads} q heads, {kv}, {self.dtype}, "
                f"{self.spec.variant()}" + (", packed qkv" if self.packed_qkv else "")
                + (f", {self.view} view" if self.view != "contiguous" else "")
                + (f", {self.cache_dtype} table" if self.cache_dtype not in (None, self.dtype) else ""))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spec"] = self.spec.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RotationCase":
        d = dict(d)
        d["spec"] = RopeSpec.from_dict(d["spec"])
        return cls(**d)


# --------------------------------------------------------------------------- tensors
class _TableMemo:
    """cos/sin tables by (base, rotary_dim, length, dtype, device), least recently used dropped
    first past a budget of bytes per device (``budget(device)``, asked once per device): a campaign
    draws caches of up to 131,072 rows (128 MiB) again and again, and rebuilding or re-copying one
    costs more than the check."""

    def __init__(self, budget):
        self.budget, self.tables, self.held = budget, {}, {}    # held: bytes memoized per device
        self.budgets: dict[str, int] = {}

    def budget_of(self, device: str) -> int:
        if device not in self.budgets:
            self.budgets[device] = int(self.budget(device))
        return self.budgets[device]

    def get(self, key, build):
        table = self.tables.pop(key, None)
        device = key[-1]
        if table is None:
            table = build()
        else:
            self.held[device] -= table.numel() * table.element_size()
        size = table.numel() * table.element_size()
        budget = self.budget_of(device)
        if size <= budget:
            while self.held.get(device, 0) + size > budget:
                oldest = next(k for k in self.tables if k[-1] == device)     # least recently used first
                gone = self.tables.pop(oldest)
                self.held[device] -= gone.numel() * gone.element_size()
            self.tables[key] = table
            self.held[device] = self.held.get(device, 0) + size
        return table

    def take(self, key):
        """Remove the table memoized under ``key`` from the memo and return it (None if there is none)."""
        table = self.tables.pop(key, None)
        if table is not None:
            self.held[key[-1]] -= table.numel() * table.element_size()
        return table


def _device_memory(device: str) -> int | None:
    """Bytes of memory of an accelerator (None: not known, or the host)."""
    dev = torch.device(device)
    module = getattr(torch, dev.type, None) if dev.type != "cpu" else None
    try:
        return int(module.get_device_properties(dev).total_memory)
    except Exception:   # noqa: BLE001 - no such device API: the host's budget instead
        return None


def _table_budget(device: str = "cpu") -> int:
    """Bytes of tables a process keeps on ``device``.  On the host a quarter of its memory shared by
    the test processes (pytest-xdist workers), between 256 MiB and 4 GiB: a campaign draws
    131,072-row tables of many widths, and a budget that holds too few of them rebuilds one every few
    examples.  On an accelerator an eighth of its memory shared by the test processes, between 64 MiB
    and 1 GiB: there a table pushed out is one copy from the host's, and the device may be shared
    with another run (a suite beside a campaign), whose tests need the memory more than this memo."""
    import os
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    on_device = _device_memory(device)
    if on_device is not None:
        return int(min(1 << 30, max(64 << 20, on_device // (8 * workers))))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 << 30
    return int(min(4 << 30, max(256 << 20, memory // (4 * workers))))


_TABLES = _TableMemo(budget=_table_budget)
# Copies of tables lent to implementations and returned unchanged (build_rotation_pair), kept apart:
# they must not push the tables themselves out (a device table pushed out is copied again).
_LENT = _TableMemo(budget=lambda device: _table_budget(device) // 4)


def _float32_table(base: float, rotary_dim: int, rows: int) -> torch.Tensor:
    """The float32 cos/sin rows 0..rows-1 (rope.cache's recipe), timed as a profile entry: mapped
    from the host's table store where another process built it (rope.harness.table_store), else
    built and stored."""
    started = time.perf_counter()
    table = table_store.load(base, rotary_dim, rows)
    if table is not None:
        profiling.add("table_loads", time.perf_counter() - started)
        return table
    table = cos_sin_cache(RopeSpec(rotary_dim, rotary_dim, base=base, max_position=rows), torch.float32, "cpu")
    table_store.save(base, table)
    profiling.add("table_builds", time.perf_counter() - started)
    return table


@functools.lru_cache(maxsize=1)
def _rows_are_position_independent() -> bool:
    """Whether this machine's cos/sin give row p the same bits in a table of any length (checked
    once per process against fresh builds).  Then a table of fewer rows is a prefix of a longer
    one, and one build of 131,072 rows serves every shorter table of the same base and width."""
    for rotary_dim, base in ((2, 10000.0), (80, 1e6), (126, 5e5)):
        long = cos_sin_cache(RopeSpec(rotary_dim, rotary_dim, base=base, max_position=4099))
        for rows in (1, 7, 300, 4096):
            if not torch.equal(long[:rows], cos_sin_cache(RopeSpec(rotary_dim, rotary_dim, base=base,
                                                                   max_position=rows))):
                return False
    return True


def _table_key(spec: RopeSpec, dtype: torch.dtype, device) -> tuple:
    return (spec.effective_base, spec.rotary_dim, spec.max_position, spec.scaling, dtype, str(device))


def shared_table(spec: RopeSpec, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """The spec's cache on ``device``, bit-identical to ``rope.cache.cos_sin_cache(spec, dtype)``
    and memoized on what it depends on (base, rotary_dim, length, scaling, dtype).  Shared: the harness
    reads it, and it is never handed to an implementation.  A scaled spec's table is built whole
    (its frequencies depend on its length: dynamic NTK, LongRoPE), never as a prefix of another."""
    dev = torch_device(device)
    base, width, rows = spec.effective_base, spec.rotary_dim, spec.max_position
    key = _table_key(spec, dtype, dev)
    if dev.type != "cpu":
        return _TABLES.get(key, lambda: shared_table(spec, dtype, "cpu").to(dev))
    if spec.scaling is not None:
        return _TABLES.get(key, lambda: cos_sin_cache(spec, dtype, "cpu"))
    if not _rows_are_position_independent():
        return _TABLES.get(key, lambda: _float32_table(base, width, rows).to(dtype))
    # Every table of this base and width is a prefix of the longest float32 table built so far.
    prefix_key = (base, width, "float32 prefix", "cpu")
    longest = _TABLES.get(prefix_key, lambda: _float32_table(base, width, rows))
    if longest.shape[0] < rows:
        _TABLES.take(prefix_key)
        longest = _TABLES.get(prefix_key, lambda: _float32_table(base, width, rows))
    if dtype == torch.float32:
        return longest[:rows]
    return _TABLES.get(key, lambda: longest[:rows].to(dtype, copy=True))


def make_positions(spec: RopeSpec, num_tokens: int, kind: str, draws) -> torch.Tensor:
    """int64 [T] or [num_dims, T] with values in [0, spec.max_position), on the draws' device.
    ``draws``: a source of rope.harness.seeded (a ``torch.Generator`` is drawn from on the host)."""
    check_choice("positions_kind", kind, POSITION_KINDS)
    if isinstance(draws, torch.Generator):
        draws = HostDraws(draws)
    shape = (spec.num_dims, num_tokens)
    return position_pattern(spec, num_tokens, kind, torch_device(str(draws.device)),
                            pick=lambda index, low, high: draws.scalar(low, high),
                            drawn=lambda: draws.integers(shape, 0, spec.max_position),
                            replaced=lambda: draws.uniform(shape) < 0.5)


def position_pattern(spec: RopeSpec, num_tokens: int, kind: str, dev, *, pick, drawn, replaced) -> torch.Tensor:
    """The positions of ``kind`` on ``dev`` from a source's draws, taken in this order: ``pick(index,
    low, high)`` an int (the pattern's index-th scalar), ``drawn()`` a fresh [num_dims, T] tensor of
    positions, ``replaced()`` a bool [num_dims, T] mask of the positions the last row replaces."""
    rows, limit = spec.num_dims, spec.max_position
    if kind == "uniform":
        pos = drawn()
    elif kind == "text":        # all rows equal, consecutive from a random start
        start = pick(0, 0, max(1, limit - num_tokens + 1))
        pos = (start + torch.arange(num_tokens, device=dev)).remainder(limit).expand(rows, num_tokens).clone()
    elif kind == "grid":        # one image-like block: t-major, then h, then w from a common base
        w = pick(0, 1, 6)
        h = pick(1, 1, 6)
        j = torch.arange(num_tokens, device=dev)
        coords = [j // (h * w), (j // w) % h, j % w, j]
        base = pick(2, 0, limit)
        pos = torch.stack([(base + coords[d]) for d in range(rows)]).remainder(limit)
    else:                       # "last_row": the last cache row, mixed with random rows
        pos = drawn()
        pos.masked_fill_(replaced(), limit - 1)
        if num_tokens:
            pos[:, -1] = limit - 1
    pos = pos.to(torch.int64)
    return pos[0].contiguous() if spec.num_dims == 1 else pos


@dataclass
class RotationInputs:
    positions: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor | None
    cache: torch.Tensor
    storage: torch.Tensor        # the tensor q and k live in (packed qkv, the flat buffer of a VIEWS layout, or q)
    pristine_cache: torch.Tensor | None = None   # the shared table ``cache`` was copied from (same device)
    lent_key: tuple | None = None   # ``cache`` is a lent copy (:func:`build_rotation_pair`), to return once checked


def inject_nonfinite(t: torch.Tensor, gen: torch.Generator) -> None:
    """Plant NaN, +inf and -inf at 1 + numel/50 drawn elements of ``t`` (a CPU tensor or view),
    rotary and pass-through channels alike.  Drawn after every finite value, so the finite
    elements are those of the same case without them."""
    rows, cols = t.shape
    if not t.numel():
        return
    count = _planted(t.numel())
    flat = torch.randint(0, t.numel(), (count,), generator=gen)
    values = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=t.dtype)
    t[flat // cols, flat % cols] = values[torch.randint(0, 3, (count,), generator=gen)]


def _generate(case: RotationCase) -> RotationInputs:
    """The case's tensors on the CPU, from its seed (the cache: the shared table, not a copy)."""
    if case.generator == "counter":
        return _counter_many([case], "cpu")[0]
    spec, hs = case.spec, case.spec.head_size
    dtype = DTYPES[case.dtype]
    gen = torch.Generator().manual_seed(case.seed)
    positions = make_positions(spec, case.num_tokens, case.positions_kind, gen)
    q_width, k_width = case.num_q_heads * hs, case.num_kv_heads * hs
    if case.packed_qkv:
        storage = torch.randn(case.num_tokens, q_width + 2 * k_width, generator=gen).to(dtype)
        query, key = storage[:, :q_width], storage[:, q_width:q_width + k_width] if k_width else None
    else:
        query = torch.randn(case.num_tokens, q_width, generator=gen).to(dtype)
        key = torch.randn(case.num_tokens, k_width, generator=gen).to(dtype) if k_width else None
        storage = query
    if case.nonfinite:
        for t in (query, key):
            if t is not None:
                inject_nonfinite(t, gen)
    if case.view != "contiguous":
        storage, query, key = lay_out(case.view, query, key, hs, lambda n: torch.randn(n, generator=gen))
    return RotationInputs(positions, query, key, shared_table(spec, DTYPES[case.table_dtype], "cpu"), storage)


# --------------------------------------------------------------------------- counter cases
# Each tensor of a counter case is its own stream of the seed (rope.harness.seeded).
_POSITIONS, _ROWS_KEPT, _QUERY, _KEY, _QKV, _PLANTED_Q, _PLANTED_K, _BUFFER = range(8)


def _planted(n: int) -> int:
    """How many NaN/inf a tensor of ``n`` elements gets (inject_nonfinite's count)."""
    return 1 + n // 50 if n else 0


def _counter_requests(case: RotationCase) -> list[Request]:
    """The draws a counter case's tensors come from, in the order :func:`_counter_assemble` takes them."""
    spec, seed, t = case.spec, case.seed, case.num_tokens
    q_width, k_width = case.num_q_heads * spec.head_size, case.num_kv_heads * spec.head_size
    out = []
    if case.positions_kind in ("uniform", "last_row"):
        out.append(Request(seed, _POSITIONS, spec.num_dims * t, 0, spec.max_position))
    if case.positions_kind == "last_row":
        out.append(Request(seed, _ROWS_KEPT, spec.num_dims * t, 0, 2))
    if case.packed_qkv:
        out.append(Request(seed, _QKV, t * (q_width + 2 * k_width)))
    else:
        out += [Request(seed, _QUERY, t * q_width), Request(seed, _KEY, t * k_width)]
    if case.nonfinite:
        out += [Request(seed, stream, _planted(t * width), 0, max(1, t * width))
                for stream, width in ((_PLANTED_Q, q_width), (_PLANTED_K, k_width))]
    if case.view != "contiguous":
        out.append(Request(seed, _BUFFER, view_layout(case.view, t, q_width, k_width, spec.head_size)[0]))
    return out


# Position patterns made from the seed's scalars alone (no drawn tensor): a batch makes them on the host
# and carries them to a GPU in one transfer, where each would be a handful of launches on the device.
_SCALAR_PATTERNS = ("text", "grid")


def _counter_positions(case: RotationCase, drawn, dev: torch.device) -> torch.Tensor:
    """make_positions' patterns from the counter, its draws made with the batch's others in one pass
    (make_positions with a CounterDraws would draw per case: a dozen launches each on a GPU)."""
    shape = (case.spec.num_dims, case.num_tokens)
    return position_pattern(case.spec, case.num_tokens, case.positions_kind, dev,
                            pick=lambda index, low, high: scalar(case.seed, _POSITIONS, index, low, high),
                            drawn=lambda: next(drawn).reshape(shape).clone(),     # its own allocation
                            replaced=lambda: next(drawn).reshape(shape) == 0)


@functools.lru_cache(maxsize=None)
def _nonfinite_values(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[NaN, +inf, -inf] in ``dtype`` on ``device``, made once: a tensor from a list is a copy from
    pageable host memory, which waits for everything queued on the device before it."""
    return torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=dtype, device=device)


def _plant(x: torch.Tensor | None, flat: torch.Tensor) -> None:
    """NaN, +inf or -inf at the drawn flat indices of ``x``: which one is the index's own (index mod 3),
    so an index drawn twice gets one value whatever order a device writes in."""
    if x is None or not flat.numel():
        return
    values = _nonfinite_values(x.dtype, x.device)[flat % 3]
    if x.is_contiguous():          # row-major: the flat index is the element's own
        x.view(-1).index_put_((flat,), values)
    else:                          # a row-strided slice of packed qkv
        x[flat // x.shape[1], flat % x.shape[1]] = values


def _counter_assemble(case: RotationCase, drawn, dev: torch.device, positions: torch.Tensor | None,
                      table: torch.Tensor) -> RotationInputs:
    """A counter case's tensors on ``dev`` from its draws (``drawn``: an iterator over them, in
    :func:`_counter_requests`' order), each an allocation of its own (the draws of a batch are views
    of one buffer); the cache is ``table``, the shared table, not a copy.  ``positions``: the case's
    where made already (on the host), else None: made here from its draws."""
    spec, hs, dtype = case.spec, case.spec.head_size, DTYPES[case.dtype]
    t, q_width, k_width = case.num_tokens, case.num_q_heads * hs, case.num_kv_heads * hs
    if positions is None:
        positions = _counter_positions(case, drawn, dev)
    if case.packed_qkv:
        storage = next(drawn).reshape(t, q_width + 2 * k_width).to(dtype, copy=True)
        query, key = storage[:, :q_width], storage[:, q_width:q_width + k_width] if k_width else None
    else:
        query, key = next(drawn).reshape(t, q_width).to(dtype, copy=True), next(drawn)     # k's is empty without k
        key = key.reshape(t, k_width).to(dtype, copy=True) if k_width else None
        storage = query
    if case.nonfinite:
        for x in (query, key):
            _plant(x, next(drawn))
    if case.view != "contiguous":
        filler = next(drawn)
        storage, query, key = lay_out(case.view, query, key, hs, lambda n: filler)
    return RotationInputs(positions, query, key, table, storage)


def _counter_many(cases, device: str) -> list[RotationInputs]:
    """The tensors of counter cases on ``device``, every case's draws made in one pass
    (rope.harness.seeded.draw_many); the same bits on every device."""
    dev = torch_device(device)
    requests = [_counter_requests(c) for c in cases]
    drawn = iter(draw_many([r for rs in requests for r in rs], dev))
    # The same integers on the host as on any device: made there, carried together (not waited for).
    on_host = [i for i, c in enumerate(cases) if c.positions_kind in _SCALAR_PATTERNS] if dev.type != "cpu" else []
    made = _to_device_together([_counter_positions(cases[i], None, torch.device("cpu")) for i in on_host], dev)
    positions = dict(zip(on_host, made))
    tables: dict = {}               # a batch's cases share their table: looked up once
    for c in cases:
        if (c.spec, c.table_dtype) not in tables:
            tables[c.spec, c.table_dtype] = shared_table(c.spec, DTYPES[c.table_dtype], str(dev))
    return [_counter_assemble(c, iter([next(drawn) for _ in rs]), dev, positions.get(i), tables[c.spec, c.table_dtype])
            for i, (c, rs) in enumerate(zip(cases, requests))]


def view_layout(view: str, num_tokens: int, q_width: int, k_width: int, head_size: int):
    """(elements of the flat buffer, (size, stride, offset) of q, of k or None) of a VIEWS layout other
    than contiguous and packed-qkv: the numbers :func:`lay_out` builds the views from."""
    t, gap = num_tokens, head_size
    k = None
    if view == "row-gaps":           # [gap | q row] x T, then [gap | k row] x T, then a last gap
        q_stride, k_stride = q_width + gap, k_width + gap
        q = ((t, q_width), (q_stride, 1), gap)
        if k_width:
            k = ((t, k_width), (k_stride, 1), gap + t * q_stride)
        total = gap + t * q_stride + (t * k_stride if k_width else 0)
    elif view == "heads-major":      # [(Hq + 2 Hkv) * D, T]: q's channels, k's, V's; tokens fastest
        q = ((t, q_width), (1, t), 0)
        if k_width:
            k = ((t, k_width), (1, t), q_width * t)
        total = (q_width + 2 * k_width) * t
    elif view == "same-buffer":      # per row: gap | k | gap | q | gap
        row = k_width + q_width + (3 if k_width else 2) * gap
        q = ((t, q_width), (row, 1), (k_width + 2 * gap) if k_width else gap)
        if k_width:
            k = ((t, k_width), (row, 1), gap)
        total = t * row
    else:
        raise ValueError(f"view={view!r}: must be one of {VIEWS[2:]} here")
    return total, q, k


def lay_out(view: str, query: torch.Tensor, key: torch.Tensor | None, head_size: int, filler) -> tuple:
    """(flat buffer, q view, k view) holding ``query`` and ``key``'s values in the ``view`` layout
    (:func:`view_layout`); every other element of the buffer (V's heads, gaps) is ``filler(total)``'s."""
    k_width = key.shape[1] if key is not None else 0
    total, q_at, k_at = view_layout(view, query.shape[0], query.shape[1], k_width, head_size)
    storage = filler(total).to(query.dtype, copy=True)
    q_view = storage.as_strided(*q_at)
    q_view.copy_(query)
    k_view = None
    if key is not None:
        k_view = storage.as_strided(*k_at)
        k_view.copy_(key)
    return storage, q_view, k_view


def _place(case: RotationCase, x: RotationInputs, device: str, lend: bool = False) -> RotationInputs:
    """:func:`_copied` with a private copy of the cache (:func:`_own_cache`)."""
    return _own_cache(case, _copied(case, x, device), device, lend)


def _copied(case: RotationCase, x: RotationInputs, device: str) -> RotationInputs:
    """A private copy of the tensors of ``x`` on ``device`` with the same strides (q and k as views
    of one packed tensor where the case packs them); the cache is ``x``'s."""
    dev = torch_device(device)
    q_width, k_width = case.num_q_heads * case.spec.head_size, case.num_kv_heads * case.spec.head_size
    if case.packed_qkv:
        storage = x.storage.to(dev, copy=True)
        query = storage[:, :q_width]
        key = storage[:, q_width:q_width + k_width] if k_width else None
    elif case.view != "contiguous":     # the same views into a copy of the flat buffer
        storage = x.storage.to(dev, copy=True)
        query = storage.as_strided(x.query.shape, x.query.stride(), x.query.storage_offset())
        key = storage.as_strided(x.key.shape, x.key.stride(), x.key.storage_offset()) if k_width else None
    else:
        query = x.query.to(dev, copy=True)
        key = x.key.to(dev, copy=True) if x.key is not None else None
        storage = query
    return RotationInputs(x.positions.to(dev, copy=True), query, key, x.cache, storage)


def _own_cache(case: RotationCase, x: RotationInputs, device: str, lend: bool = False) -> RotationInputs:
    """``x`` (tensors of the caller's own on ``device``) with a private copy of the cache: the memoized
    table must not be writable by the implementation.  ``lend``: the copy may be one an earlier case
    returned unchanged (:func:`return_lent_cache`) instead of a fresh clone of the table (a clone of
    up to 128 MiB per case, then a comparison)."""
    dtype = DTYPES[case.table_dtype]
    lent_key = _table_key(case.spec, dtype, torch_device(device)) if lend else None
    cache = _LENT.take(lent_key) if lend else None
    fresh, pristine = _private_table(case, device, cache is None)
    return RotationInputs(x.positions, x.query, x.key, fresh if cache is None else cache, x.storage, pristine,
                          lent_key)


def _private_table(case: RotationCase, device: str, copy: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(a clone of the case's shared table on ``device``, or None without ``copy``; the shared table)."""
    pristine = shared_table(case.spec, DTYPES[case.table_dtype], device)
    return (pristine.clone() if copy else None), pristine


def return_lent_cache(inputs: RotationInputs) -> None:
    """Keep ``inputs.cache``, a copy lent by :func:`build_rotation_pair`, for the next case of the
    same table: call it only once the copy was found equal to its table after the implementation's
    call (rope.harness.rotation.check.read_only_problems).  A copy never returned (the check failed, the
    call hung or raised past the check) is dropped, and the next case gets a fresh clone."""
    if inputs.lent_key is not None:
        _LENT.get(inputs.lent_key, lambda: inputs.cache)
        inputs.lent_key = None


def build_rotation_inputs(case: RotationCase, device: str = "cpu") -> RotationInputs:
    """Regenerate the case's tensors bit-identically on ``device`` (a counter case there, a torch-cpu
    case on the CPU and then copied): every tensor, the cache included, is the caller's own."""
    if case.generator == "counter":
        return _own_cache(case, _counter_many([case], device)[0], device)
    return _place(case, _generate(case), device)


def build_rotation_inputs_many(cases, device: str = "cpu", *, one_table_copy: bool = False) -> list[RotationInputs]:
    """:func:`build_rotation_inputs` of every case (the same tensors bit for bit, each the caller's
    own).  The counter cases are made on the device together (one pass of draws for all of them).
    The torch-cpu cases' q, k and positions are carried to a GPU together: one transfer per dtype from
    pinned memory, then a device copy per tensor, where one case at a time makes three transfers from
    pageable memory, each of which waits for the device (contiguous and packed-qkv cases; the strided
    views go one at a time).  ``one_table_copy``: the cases of one table share one private copy of it
    (a batch's calls, made one after another; rope.harness.rotation.batch checks the copy once after
    them) instead of a clone each, which a batch of large tables would hold all at once."""
    cases = list(cases)
    out: list[RotationInputs | None] = [None] * len(cases)
    table_copy = _table_copies(device, one_table_copy)
    counter = [i for i, c in enumerate(cases) if c.generator == "counter"]
    for i, x in zip(counter, _counter_many([cases[i] for i in counter], device)):
        out[i] = _with_table(x, *table_copy(cases[i]))
    host = [i for i in range(len(cases)) if out[i] is None]
    for i, x in zip(host, _carried_many([cases[i] for i in host], device, table_copy)):
        out[i] = x
    return out


def _with_table(x: RotationInputs, cache: torch.Tensor, pristine: torch.Tensor) -> RotationInputs:
    return RotationInputs(x.positions, x.query, x.key, cache, x.storage, pristine)


def _table_copies(device: str, shared: bool):
    """(case) -> (a private copy of the case's table on ``device``, the shared table it copies): a fresh
    clone each, or with ``shared`` one clone per table for every case asking."""
    copies: dict = {}

    def copy_for(case: RotationCase) -> tuple[torch.Tensor, torch.Tensor]:
        if not shared:
            return _private_table(case, device)
        key = (case.spec, case.table_dtype)
        if key not in copies:
            copies[key] = _private_table(case, device)
        return copies[key]
    return copy_for


def _carried_many(cases, device: str, table_copy) -> list[RotationInputs]:
    """Torch-cpu cases' tensors made on the CPU and carried to ``device`` (together where they can be);
    ``table_copy``: :func:`_table_copies`' function."""
    cases = list(cases)
    cpu = [_generate(c) for c in cases]
    dev = torch_device(device)
    if dev.type == "cpu" or len(cases) < 2 or any(c.view != "contiguous" for c in cases):
        placed = [_copied(c, x, device) for c, x in zip(cases, cpu)]
        return [_with_table(x, *table_copy(c)) for c, x in zip(cases, placed)]
    moved = []          # per case: the tensors it needs on the device (packed storage, or q and k), positions last
    for c, x in zip(cases, cpu):
        tensors = [x.storage] if c.packed_qkv else [x.query] + ([x.key] if x.key is not None else [])
        moved.append([t.contiguous() for t in tensors] + [x.positions.contiguous()])
    placed = iter(_to_device_together([t for ts in moved for t in ts], dev))
    out = []
    for c, x, ts in zip(cases, cpu, moved):
        own = [next(placed) for _ in ts]
        q_width, k_width = c.num_q_heads * c.spec.head_size, c.num_kv_heads * c.spec.head_size
        if c.packed_qkv:
            storage = own[0]
            query, key = storage[:, :q_width], (storage[:, q_width:q_width + k_width] if k_width else None)
        else:
            query, key, storage = own[0], (own[1] if x.key is not None else None), own[0]
        out.append(_with_table(RotationInputs(own[-1], query, key, None, storage), *table_copy(c)))
    return out


def _to_device_together(tensors: list[torch.Tensor], dev: torch.device) -> list[torch.Tensor]:
    """Contiguous CPU ``tensors`` as private contiguous copies on ``dev``, same shapes and dtypes:
    those of one dtype are packed into one pinned buffer and carried in one transfer."""
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for dtype in {t.dtype for t in tensors}:
        group = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        flat = torch.cat([tensors[i].reshape(-1) for i in group]).pin_memory().to(dev, non_blocking=True)
        start = 0
        for i in group:
            n = tensors[i].numel()
            # Its own allocation, with the source's strides: a view would give a dimension of size 0
            # or 1 another stride than torch gives the same shape made contiguous (positions of no
            # token: (0, 1) where build_rotation_inputs has (1, 1)).
            out[i] = flat[start:start + n].clone().as_strided(tensors[i].shape, tensors[i].stride())
            start += n
    return out


def build_rotation_pair(case: RotationCase, device: str) -> tuple[RotationInputs, RotationInputs]:
    """(inputs on ``device`` for an implementation, untouched CPU tensors with the same values and
    strides) from one generation.  The CPU side's cache is the shared table: the harness reads it
    and never hands it on.  The device side's cache is a lent copy: the caller checks it against
    ``pristine_cache`` after the call and returns it (:func:`return_lent_cache`)."""
    if case.generator == "counter" and torch_device(device).type != "cpu":
        made = _counter_many([case], device)[0]              # made on the device, copied to the host
        cpu = _copied(case, made, "cpu")
        cpu.cache = shared_table(case.spec, DTYPES[case.table_dtype], "cpu")
        return _own_cache(case, made, device, lend=True), cpu
    cpu = _generate(case)
    return _place(case, cpu, device, lend=True), cpu
