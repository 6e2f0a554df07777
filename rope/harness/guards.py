"""Out-of-bounds detection without a GPU: guard regions around every input, and a memory tracer
for Triton's interpreter.

Two detectors, for two kinds of evidence:

1. **Guard regions** (any implementation, any device).  Every tensor an implementation receives
   is a view into a larger allocation; the elements around it (rows before and after, and the
   padding after every row, so the rows are strided) hold a fill: NaN for float tensors, a
   sentinel for int tensors.  A stray *read* whose value reaches the output shows up as NaN (or
   as sentinel-derived garbage that the reference comparison rejects); a stray *write* shows up
   as a changed guard element.  Positions are guarded with ``sentinel = number of cache rows``,
   so a stray position read in a pointer-arithmetic kernel indexes the NaN row right after the
   cache, and in torch indexing raises an IndexError.

2. **The interpreter memory tracer** (Triton kernels under TRITON_INTERPRET=1, CPU tensors).
   :func:`trace_memory` wraps the interpreter's masked load and store, and checks the address of
   every *active* lane (mask on) before the access happens:

   * inside a guarded allocation but not on one of its valid elements: an out-of-bounds read or
     write of a guard, reported with the row and column in the guarded layout, even when the value
     read never reaches the output;
   * a write to a valid element of a read-only input (positions, the cache);
   * outside the storage of every tensor argument of the launch (and of every guarded
     allocation): a *wild* access, the kind compute-sanitizer reports.  Wild lanes are masked off
     before the access (loads return ``other``, stores are dropped), so a broken kernel cannot
     corrupt or crash the test process.

   Only ``tl.load``/``tl.store`` are traced (not atomics or tensor descriptors).

What neither can see: a stray access that lands on *another valid element* (e.g. a read of the
next cache row, or of the sin half of the same row) is in bounds for both; only the padding
between rows turns an overrun into a guard access, so the pad widths below bound what is caught
(the cache pad is ``max(8, rotary_dim/2)`` elements: any overrun of a row by less than that hits
NaN).  On a GPU the tracer does not exist (compiled kernels); guards still catch stray writes
and stray reads whose value reaches the output, and compute-sanitizer is needed for the rest.

The guarded inputs of each checked thing are its slice's (rope.harness.rotation.guards,
rope.harness.position_step.guards); this module holds the primitives they share.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch

from rope.devices import is_interpreter, torch_device

FLOAT_FILL = float("nan")
INT_SENTINEL = -999_983       # int guard of position-step inputs: garbage if it reaches `out`
ROW_GUARDS = 1                # guard rows before the first and after the last valid row
CACHE_ROWS_AFTER = 2          # NaN rows after the last cache row (positions == rows index the first)
OUT_ROW_PAD = 320             # > the positions kernel's BLOCK (256): a whole unmasked tile stays inside
_MAX_EXAMPLES = 3             # locations quoted per violation
# How a failure message marks the detector that saw it: the plain comparison, or the one on guarded inputs.
PLAIN, GUARDED = "[plain inputs]", "[guarded inputs]"


# --------------------------------------------------------------------------- guarded allocations
@dataclass
class Guarded:
    """One guarded allocation: ``buffer`` is the whole allocation, ``[total_rows, row_stride]``;
    its valid elements are rows ``[rows[0], rows[1])`` x the column ranges ``columns``; every other
    element is guard and holds ``fill``."""
    name: str
    buffer: torch.Tensor
    rows: tuple[int, int]
    columns: tuple[tuple[int, int], ...]
    fill: float | int
    writable: bool

    @property
    def row_stride(self) -> int:
        return self.buffer.shape[1]

    def locate(self, element: int) -> str:
        """'row r, column c' with r counted from the first valid row (-1: the guard row before)."""
        row, col = divmod(int(element), self.row_stride)
        return f"row {row - self.rows[0]}, column {col}"

    def layout(self) -> str:
        cols = ", ".join(f"[{a}, {b})" for a, b in self.columns)
        return (f"valid rows [0, {self.rows[1] - self.rows[0]}) x columns {cols} of a "
                f"{self.row_stride}-element row stride")

    def valid_elements(self, elements: np.ndarray) -> np.ndarray:
        row, col = np.divmod(elements, self.row_stride)
        ok_col = np.zeros(elements.shape, dtype=bool)
        for a, b in self.columns:
            ok_col |= (col >= a) & (col < b)
        return (elements >= 0) & (row >= self.rows[0]) & (row < self.rows[1]) & ok_col

    def _guard_blocks(self):
        """(row offset, 2-D slice) of every guard part: whole rows outside the valid rows, and the
        column gaps of the valid rows."""
        buf = self.buffer.detach().cpu()
        r0, r1 = self.rows
        yield 0, 0, buf[:r0]
        yield r1, 0, buf[r1:]
        at = 0
        for a, b in sorted(self.columns) + [(self.row_stride, self.row_stride)]:
            if a > at:
                yield r0, at, buf[r0:r1, at:a]
            at = max(at, b)

    def modified(self) -> list[str]:
        """Guard elements that no longer hold the fill (out-of-bounds writes)."""
        nan_fill = isinstance(self.fill, float) and self.fill != self.fill
        count, first = 0, []
        for row0, col0, block in self._guard_blocks():
            if block.numel() == 0:
                continue
            changed = ~torch.isnan(block) if nan_fill else block != self.fill
            hits = changed.nonzero()
            count += hits.shape[0]
            for r, c in hits[:_MAX_EXAMPLES - len(first)].tolist():
                first.append((row0 + r) * self.row_stride + col0 + c)
        if not count:
            return []
        first.sort()
        where = "; ".join(f"offset {e} ({self.locate(e)})" for e in first)
        return [f"{self.name}: guard modified at {count} element(s), first at {where}; {self.layout()} "
                f"(out-of-bounds write)"]


def guard_tensor(name: str, values: torch.Tensor, *, fill, writable: bool, device: str = "cpu",
                 row_pad: int = 8, lead: int = 0, rows_before: int = ROW_GUARDS,
                 rows_after: int = ROW_GUARDS, invalid_columns: tuple[tuple[int, int], ...] = ()):
    """Copy ``values`` ([R, C] or [N]) into a guarded allocation; returns (view, Guarded).

    The view has the values' shape and unit last stride; its rows are ``lead + C + row_pad``
    elements apart, with ``rows_before``/``rows_after`` guard rows around them.  Columns in
    ``invalid_columns`` (e.g. the value slice of a packed qkv tensor) are set to the fill and
    count as guard.
    """
    one_d = values.dim() == 1
    vals = values.detach().cpu()[None] if one_d else values.detach().cpu()
    if vals.dim() != 2:
        raise ValueError(f"{name}.shape={tuple(values.shape)}: must be 1-D or 2-D")
    num_rows, num_cols = vals.shape
    stride = lead + num_cols + row_pad
    buffer = torch.empty((rows_before + num_rows + rows_after, stride), dtype=vals.dtype)
    buffer[:rows_before] = fill
    buffer[rows_before + num_rows:] = fill
    buffer[rows_before:rows_before + num_rows, :lead] = fill
    buffer[rows_before:rows_before + num_rows, lead + num_cols:] = fill
    buffer[rows_before:rows_before + num_rows, lead:lead + num_cols] = vals
    cuts = sorted(invalid_columns)
    valid, at = [], 0
    for a, b in cuts:
        buffer[rows_before:rows_before + num_rows, lead + a:lead + b] = fill
        if a > at:
            valid.append((lead + at, lead + a))
        at = max(at, b)
    if num_cols > at:
        valid.append((lead + at, lead + num_cols))
    buffer = buffer.to(torch_device(device))
    view = buffer[rows_before:rows_before + num_rows, lead:lead + num_cols]
    guarded = Guarded(name, buffer, (rows_before, rows_before + num_rows), tuple(valid), fill, writable)
    return (view[0] if one_d else view), guarded


# --------------------------------------------------------------------------- interpreter tracer
@dataclass
class _Region:
    name: str
    base: int
    nbytes: int
    itemsize: int
    guarded: Guarded | None       # None: a launch argument's storage, every byte valid


@dataclass
class MemoryTracer:
    """Accesses seen by the interpreter; ``messages()`` lists the violations."""
    active: bool = False
    regions: list[_Region] = field(default_factory=list)
    events: dict = field(default_factory=dict)     # (kind, name) -> [count, [examples]]
    touched: dict = field(default_factory=dict)    # guarded name -> active lanes that hit its allocation
    launches: int = 0

    def add(self, guarded: Guarded) -> None:
        buf = guarded.buffer
        if buf.device.type == "cpu":
            self.regions.append(_Region(guarded.name, buf.data_ptr(), buf.numel() * buf.element_size(),
                                        buf.element_size(), guarded))

    def _record(self, kind: str, name: str, count: int, examples) -> None:
        entry = self.events.setdefault((kind, name), [0, []])
        entry[0] += int(count)
        entry[1].extend(examples[:_MAX_EXAMPLES - len(entry[1])])

    def check(self, access: str, addresses: np.ndarray, itemsize: int, extra: list[_Region]) -> np.ndarray:
        """Classify active lanes; returns the mask of wild lanes (outside every known allocation)."""
        wild = np.ones(addresses.shape, dtype=bool)
        for region in self.regions + extra:
            rel = addresses.astype(np.int64) - region.base
            inside = wild & (rel >= 0) & (rel + itemsize <= region.nbytes)
            if not inside.any():
                continue
            wild &= ~inside
            g = region.guarded
            if g is None:
                continue
            self.touched[g.name] = self.touched.get(g.name, 0) + int(inside.sum())
            rel_in = rel[inside]
            misaligned = rel_in % region.itemsize != 0
            if misaligned.any():
                self._record(f"misaligned-{access}", g.name, misaligned.sum(),
                             [f"byte {int(b)}" for b in rel_in[misaligned][:_MAX_EXAMPLES]])
            elements = rel_in // region.itemsize
            ok = g.valid_elements(elements)
            if (~ok).any():
                self._record(f"guard-{access}", g.name, (~ok).sum(),
                             [g.locate(e) for e in elements[~ok][:_MAX_EXAMPLES]])
            if access == "write" and not g.writable and ok.any():
                self._record("read-only-write", g.name, ok.sum(), [g.locate(e) for e in elements[ok][:_MAX_EXAMPLES]])
        if wild.any():
            self._record(f"wild-{access}", "memory", wild.sum(),
                         [f"address {hex(int(a))}" for a in addresses[wild][:_MAX_EXAMPLES]])
        return wild

    def messages(self) -> list[str]:
        out = []
        for (kind, name), (count, examples) in sorted(self.events.items()):
            where = "; ".join(examples)
            g = next((r.guarded for r in self.regions if r.guarded is not None and r.guarded.name == name), None)
            layout = f"; {g.layout()}" if g is not None else ""
            if kind.startswith("guard-"):
                what = kind.split("-")[1]
                out.append(f"{name}: {count} out-of-bounds {what}(s) of guard elements (traced), first at "
                           f"{where}{layout}")
            elif kind == "read-only-write":
                out.append(f"{name}: {count} write(s) to a read-only input (traced), first at {where}")
            elif kind.startswith("wild-"):
                what = kind.split("-")[1]
                out.append(f"{count} wild {what}(s) outside every argument's storage (traced, suppressed), "
                           f"first at {where}")
            else:
                out.append(f"{name}: {count} {kind} access(es) (traced), first at {where}")
        return out


def _masking_wrapper(orig, access: str, active_lanes):
    """Wrap the interpreter's ``create_masked_load``/``create_masked_store``: the same call, with the
    mask narrowed to the lanes that are not wild.  The signatures differ between Triton releases
    (3.6-3.8: ``load(ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)``,
    ``store(ptrs, value, mask, cache_modifier, eviction_policy)``; 3.9: one ``cache_policy`` in place
    of the two), and the interpreter passes the trailing ones by position or by name, so the wrapper
    forwards ``*args, **kwargs`` and finds ``ptrs`` and ``mask`` by their names in the signature of
    the method it wraps."""
    params = list(inspect.signature(orig).parameters)[1:]          # without self
    if "mask" not in params:
        raise RuntimeError(f"trace_memory: Triton {triton_version()}'s interpreter {orig.__qualname__}{params} "
                           f"has no 'mask' parameter; the tracer does not know this signature")
    ptrs_name = "ptrs" if "ptrs" in params else params[0]
    at_ptrs, at_mask = params.index(ptrs_name), params.index("mask")

    def wrapper(self, *args, **kwargs):
        ptrs = args[at_ptrs] if len(args) > at_ptrs else kwargs[ptrs_name]
        if len(args) > at_mask:
            args = args[:at_mask] + (active_lanes(ptrs, args[at_mask], access),) + args[at_mask + 1:]
        else:
            kwargs["mask"] = active_lanes(ptrs, kwargs.get("mask"), access)
        return orig(self, *args, **kwargs)

    wrapper.__wrapped__ = orig
    return wrapper


def triton_version() -> str:
    import triton
    return getattr(triton, "__version__", "?")


@contextlib.contextmanager
def trace_memory(guards=()):
    """Trace every load and store of Triton kernels launched inside the block (interpreter only).

    Yields a :class:`MemoryTracer`; ``tracer.active`` is False (and nothing is traced) when the
    kernels do not run under the interpreter.  Not reentrant.
    """
    tracer = MemoryTracer(active=is_interpreter())
    for g in guards:
        tracer.add(g)
    if not tracer.active:
        yield tracer
        return
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder_cls, executor_cls = interp.InterpreterBuilder, interp.GridExecutor
    orig_load, orig_store, orig_call = (builder_cls.create_masked_load, builder_cls.create_masked_store,
                                        executor_cls.__call__)
    launch_regions: list[_Region] = []

    def itemsize_of(ptrs) -> int:
        return interp._get_np_dtype(ptrs.get_element_ty()).itemsize

    def active_lanes(ptrs, mask, access):
        addresses = np.asarray(ptrs.data)
        on = np.ones(addresses.shape, dtype=bool) if mask is None else \
            np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        wild = tracer.check(access, addresses[on], itemsize_of(ptrs), launch_regions)
        if not wild.any():
            return mask
        keep = on.copy()
        keep[on] = ~wild
        return interp.TensorHandle(keep, tl.int1 if mask is None else mask.dtype)

    load = _masking_wrapper(orig_load, "read", active_lanes)
    store = _masking_wrapper(orig_store, "write", active_lanes)

    def call(self, *args, **kwargs):
        tracer.launches += 1
        known = [(r.base, r.base + r.nbytes) for r in tracer.regions]
        launch_regions.clear()
        for arg in list(args) + list(kwargs.values()):
            t = interp._unwrap_tensor(arg)          # TensorWrapper -> tensor
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
                if not any(a <= lo and hi <= b for a, b in known):
                    launch_regions.append(_Region("argument", lo, hi - lo, t.element_size(), None))
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            launch_regions.clear()

    builder_cls.create_masked_load, builder_cls.create_masked_store = load, store
    executor_cls.__call__ = call
    try:
        yield tracer
    finally:
        builder_cls.create_masked_load, builder_cls.create_masked_store = orig_load, orig_store
        executor_cls.__call__ = orig_call
