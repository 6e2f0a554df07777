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

The padding-lane bug (docs/spec.md §7.2; mutants ``cos_sin_unmasked*``): lane i >= rotary_dim/2 loads cos
at row element i and sin at element rotary_dim/2 + i.  The q/k loads and stores of those lanes
stay masked, so the values (NaN under guards) never reach the output: the reference comparison
and the NaN check are blind to it, on every device.  The tracer sees the *sin* reads: they run
past the row's end into the NaN padding, for every row (the guarded cache is row-strided), not
only the last.  It cannot see the *cos* reads, which land on the same row's valid sin half.  On
plain contiguous tensors the same sin reads land in the next cache row (valid memory) except at
the last cache row, where they leave the allocation (a wild read: reported and suppressed).  What
matters is the last cache *row* (positions == max_position - 1, any token), not the last token:
our cache is indexed by position.  compute-sanitizer on a GPU, likewise, flags only reads past an
allocation: it needs positions at the last cache row, a plain cache (a guard allocation would
keep the stray read inside it), and PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that the cache is its own
cudaMalloc rather than a slice of the caching allocator's segment.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch

from properties.strategies import OUT_SENTINEL, RaggedBatch, RotationCase, build_rotation_inputs
from rope.devices import is_interpreter, synchronize, torch_device
from rope.harness import case_files, causes
from rope.harness.comparison import (angle_source, call_positions, call_rotation, check_positions, positions_failure,
                                     reference_rotation, skip_if_known_defect)
from rope.harness.diagnosis import Diagnosis, diagnose
from rope.harness.tolerance import Comparison, compare_rotation
from rope.registry import working_precision

FLOAT_FILL = float("nan")
INT_SENTINEL = -999_983       # int guard of position-step inputs: garbage if it reaches `out`
ROW_GUARDS = 1                # guard rows before the first and after the last valid row
CACHE_ROWS_AFTER = 2          # NaN rows after the last cache row (positions == rows index the first)
OUT_ROW_PAD = 320             # > the positions kernel's BLOCK (256): a whole unmasked tile stays inside
_MAX_EXAMPLES = 3             # locations quoted per violation


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


# --------------------------------------------------------------------------- rotation
@dataclass
class GuardedRotationInputs:
    positions: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor | None
    cache: torch.Tensor
    guards: list[Guarded]


def guard_rotation_inputs(case: RotationCase, device: str = "cpu") -> GuardedRotationInputs:
    """The case's tensors (bit-identical to build_rotation_inputs) as views into guarded allocations.

    * cos_sin_cache: rows ``rotary_dim + max(8, rotary_dim/2)`` apart, NaN padding after every row,
      one NaN row before and two after the last valid row.
    * positions: ``[num_dims, T]`` rows ``T + 8`` apart (one guard row before and after) or ``[T]``
      with 8 guard elements either side; the sentinel is the number of cache rows.
    * query, key: rows ``width + head_size`` apart, one NaN row before and after; with packed qkv
      the whole ``[T, (Hq + 2 Hkv) * head_size]`` storage is one guarded allocation whose value slice
      is NaN guard too (a rotation has no business reading or writing it).
    """
    spec, hs = case.spec, case.spec.head_size
    x = build_rotation_inputs(case, "cpu")
    guards = []
    cache, g = guard_tensor("cos_sin_cache", x.cache, fill=FLOAT_FILL, writable=False, device=device,
                            row_pad=max(8, spec.rotary_dim // 2), rows_after=CACHE_ROWS_AFTER)
    guards.append(g)
    sentinel = x.cache.shape[0]
    if x.positions.dim() == 1:
        positions, g = guard_tensor("positions", x.positions, fill=sentinel, writable=False, device=device,
                                    lead=8, row_pad=8, rows_before=0, rows_after=0)
    else:
        positions, g = guard_tensor("positions", x.positions, fill=sentinel, writable=False, device=device)
    guards.append(g)
    q_width, k_width = case.num_q_heads * hs, case.num_kv_heads * hs
    if case.packed_qkv:
        invalid = ((q_width + k_width, q_width + 2 * k_width),) if k_width else ()
        storage, g = guard_tensor("qkv", x.storage, fill=FLOAT_FILL, writable=True, device=device,
                                  row_pad=hs, invalid_columns=invalid)
        guards.append(g)
        query = storage[:, :q_width]
        key = storage[:, q_width:q_width + k_width] if k_width else None
    else:
        query, g = guard_tensor("query", x.query, fill=FLOAT_FILL, writable=True, device=device, row_pad=hs)
        guards.append(g)
        key = None
        if x.key is not None:
            key, g = guard_tensor("key", x.key, fill=FLOAT_FILL, writable=True, device=device, row_pad=hs)
            guards.append(g)
    return GuardedRotationInputs(positions, query, key, cache, guards)


@dataclass
class GuardedRun:
    """``outputs, violations = run_guarded(...)`` unpacks; ``inputs`` are the guarded inputs, and
    ``traced`` says whether the tracer saw a launch (False on a GPU or for torch implementations)."""
    outputs: tuple
    violations: list[str]
    inputs: GuardedRotationInputs
    traced: bool

    def __iter__(self):
        return iter((self.outputs, self.violations))


def _nan_in_output(name: str, out: torch.Tensor | None, head_size: int) -> list[str]:
    if out is None or not out.dtype.is_floating_point:
        return []
    nan = torch.isnan(out.detach().cpu())
    count = int(nan.sum())
    if not count:
        return []
    token, col = nan.nonzero()[0].tolist()
    head, channel = divmod(col, head_size)
    return [f"{name}: NaN in output at {count} element(s), first at token {token}, head {head}, "
            f"channel {channel} (out-of-bounds read?)"]


def run_guarded(fn, case: RotationCase, device: str = "cpu") -> GuardedRun:
    """Run ``fn`` on the case inside guards (and the tracer, under the interpreter on the CPU);
    returns the outputs and every guard violation: NaN in the outputs, guards modified, and the
    traced out-of-bounds or wild accesses."""
    inputs = guard_rotation_inputs(case, device)
    with trace_memory(inputs.guards if device == "cpu" else ()) as tracer:
        q_out, k_out = call_rotation(fn, case.spec, inputs.positions, inputs.query, inputs.key, inputs.cache)
    violations = _nan_in_output("query", q_out, case.spec.head_size) + \
        _nan_in_output("key", k_out, case.spec.head_size)
    for g in inputs.guards:
        violations += g.modified()
    violations += tracer.messages()
    return GuardedRun((q_out, k_out), violations, inputs, tracer.active and tracer.launches > 0)


def compare_case_guarded(impl_name: str, fn, case: RotationCase, device: str = "cpu") -> Comparison:
    """Like rope.harness.comparison.compare_case, on guarded inputs: the reference comparison plus every
    guard violation as a problem."""
    return _compare_guarded(fn, case, device)[0]


def diagnose_guarded(fn, case: RotationCase, device: str = "cpu") -> Diagnosis:
    """rope.harness.diagnosis of ``fn`` on guarded inputs, guard violations included (NaN from a guard
    region, out-of-bounds reads and writes); "match" when it passes under guards."""
    result, run, ref_in = _compare_guarded(fn, case, device)
    q_out, k_out = run.outputs
    return diagnose(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache, q_out, k_out,
                    precision=working_precision(fn), comparison=result)


def _compare_guarded(fn, case: RotationCase, device: str):
    run = run_guarded(fn, case, device)
    ref_in = build_rotation_inputs(case, "cpu")
    # The reference reads only the rows the positions index: give it those (same values, and no
    # float64 copy of a 4 x 262144-row cache).
    cache = ref_in.cache[:int(ref_in.positions.max()) + 1] if case.num_tokens else ref_in.cache
    ref_q, ref_k = reference_rotation(fn, case.spec, ref_in.positions, ref_in.query, ref_in.key, cache)
    q_out, k_out = run.outputs
    result = compare_rotation(case.spec, ref_in.positions, ref_in.query, ref_in.key, cache,
                              q_out, k_out, ref_q, ref_k, working_precision(fn), device=run.inputs.query.device,
                              angles=angle_source(fn))
    result.problems += [f"guard violation: {v}" for v in run.violations]
    return result, run, ref_in


def assert_matches_reference_guarded(impl_name: str, fn, case: RotationCase, device: str = "cpu") -> Comparison:
    """Raise AssertionError when ``fn`` mismatches the reference on guarded inputs or violates a guard:
    the message and the failure's cause (rope.harness.causes) carry the diagnosis.  A run that avoids
    known defects skips a case the adapter declares it answers wrongly, as the unguarded check does."""
    skip_if_known_defect(impl_name, fn, case, device)
    result, run, ref_in = _compare_guarded(fn, case, device)
    if not result.ok:
        q_out, k_out = run.outputs
        try:
            diagnosis = diagnose(case.spec, ref_in.positions, ref_in.query, ref_in.key, ref_in.cache, q_out, k_out,
                                 precision=working_precision(fn), comparison=result)
        except Exception as exc:   # noqa: BLE001 - the mismatch is reported all the same
            diagnosis = Diagnosis("unknown", f"(diagnosis failed: {type(exc).__name__}: {exc})")
        _fail(f"{impl_name} on {device} fails under guards", case, result, diagnosis)
    return result


def _fail(header: str, case: RotationCase, result: Comparison, diagnosis: Diagnosis | None = None):
    """The AssertionError of a guarded or traced check: short lines, the diagnosis first, tagged
    with its cause for the run's grouping."""
    lines = [*(diagnosis.lines() if diagnosis else []), *result.message().splitlines(), *case_files.describe_case(case)]
    message = "\n".join([header, *(piece for line in lines for piece in case_files.wrap(line))])
    cause = diagnosis.label if diagnosis else None
    headline = diagnosis.sentence if diagnosis else None
    raise causes.tag(AssertionError(message), cause=cause, headline=headline, size=case.size, case=case.brief())


def assert_matches_reference_traced(impl_name: str, fn, case: RotationCase, device: str = "cpu") -> Comparison:
    """rope.harness.comparison.compare_case on plain (unguarded) inputs, inside the tracer: wild accesses
    past an argument's storage are reported (and suppressed, so a broken kernel stays harmless)."""
    from rope.harness.comparison import compare_case
    with trace_memory() as tracer:
        result = compare_case(impl_name, fn, case, device)
    result.problems += [f"memory violation: {m}" for m in tracer.messages()]
    if not result.ok:
        _fail(f"{impl_name} on {device} does not match the reference (traced)", case, result)
    return result


# --------------------------------------------------------------------------- the position step
_POSITION_INPUTS = ("prefill_positions", "prefill_delta", "idx_mapping", "query_start_loc", "prefill_lens",
                    "num_computed_tokens")


def guard_position_inputs(batch: RaggedBatch, device: str = "cpu"):
    """(kwargs, out, guards): every int input of a position-step call as a view into a
    guarded allocation (sentinel INT_SENTINEL: rows 8 elements apart for the table, 8 elements
    either side of the vectors), and ``out`` as the ``[num_dims, num_tokens + padding]`` view of an
    OUT_SENTINEL-filled allocation whose writable elements are the first ``num_tokens`` columns;
    the padding columns and OUT_ROW_PAD columns after every row are guard."""
    args = batch.tensors("cpu")
    guards, kwargs = [], {"num_dims": args["num_dims"]}
    for name in _POSITION_INPUTS:
        t = args[name]
        if t.dim() == 1:
            view, g = guard_tensor(name, t, fill=INT_SENTINEL, writable=False, device=device, lead=8, row_pad=8,
                                   rows_before=0, rows_after=0)
        else:
            view, g = guard_tensor(name, t, fill=INT_SENTINEL, writable=False, device=device)
        kwargs[name] = view
        guards.append(g)
    n = batch.num_tokens
    blank = torch.full((batch.num_dims, n + batch.padding), OUT_SENTINEL, dtype=torch.int64)
    out, g = guard_tensor("out", blank, fill=OUT_SENTINEL, writable=True, device=device, row_pad=OUT_ROW_PAD,
                          invalid_columns=((n, n + batch.padding),) if batch.padding else ())
    guards.append(g)
    return kwargs, out, guards


def run_positions_guarded(fn, batch: RaggedBatch, device: str = "cpu"):
    """Run a position-step implementation inside guards; returns (out [num_dims, num_tokens]
    on the CPU, violations)."""
    kwargs, out, guards = guard_position_inputs(batch, device)
    with trace_memory(guards if device == "cpu" else ()) as tracer:
        call_positions(fn, kwargs, out)
        synchronize(device)
    violations = []
    for g in guards:
        violations += g.modified()
    violations += tracer.messages()
    return out[:, :batch.num_tokens].cpu(), violations


def assert_positions_match_guarded(name: str, fn, batch: RaggedBatch, device: str = "cpu") -> None:
    out, violations = run_positions_guarded(fn, batch, device)
    problems = check_positions(name, device, batch.tensors("cpu"), out, [f"guard violation: {v}" for v in violations])
    if problems:
        raise positions_failure(f"{name} on {device} fails under guards", problems + case_files.wrap(f"batch: {batch}"),
                                tokens=batch.num_tokens, requests=len(batch.query_lens))
