"""Registry of rotation implementations.

An implementation is a callable ``fn(spec, positions, query, key, cos_sin_cache) -> (q, k)`` (or,
for the runner's position step, the signature in docs/implementations.md).  What it may declare
(``working_precision``, ``supports``, ``unsupported_reason``, ``known_fault``, ``unchecked``, ...)
is documented in one place, docs/implementations.md, with a complete example; the registry reads it
into one record, :class:`rope.implementation.Implementation` (:func:`implementation_record`).

Names resolve to built-ins (``native``, ``triton``), to the adapters of external implementations
(``liger``, ``transformers``, ``vllm-native``, ``vllm-cuda``, ``vllm-xd``, ``sglang``, ``flashinfer``:
``rope.backends``; a missing package is a ValueError naming it and how to install it) or to an import
path ``package.module:callable``, so any external kernel can be checked without touching the project.
The position step has the built-ins ``native`` and ``triton`` and the adapter ``vllm`` (vLLM's Model
Runner V2 kernel: ``rope.backends.vllm.position_step``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from typing import Callable

from rope.backends import BACKENDS
from rope.implementation import FUSED_OPS, MAX_SWITCH, WORKING_PRECISIONS, Implementation

_ROTATIONS = {
    "native": "rope.native:rotate_native",
    "triton": "rope.triton.ops:rotate",
    # The same kernel as a differentiable custom op (forward and backward): by name only, never in implementations().
    "triton-autograd": "rope.triton.ops:rotate_with_grad",
    # External implementations (optional packages): by name only, never in implementations().
    **{name: path for name, (path, _, _) in BACKENDS.items()},
}
BUILTIN_ROTATIONS = ("native", "triton")
_POSITIONS = {
    "native": "rope.runner_positions:prepare_positions_native",
    "triton": "rope.triton.positions:prepare_positions_triton",
    # vLLM's Model Runner V2 kernel (optional package): by name only, never in positions_implementations().
    "vllm": "rope.backends.vllm.position_step:prepare_positions_vllm",
}
BUILTIN_POSITIONS = ("native", "triton")
# The cos/sin table, fn(spec, max_position, dtype, device) -> cache (docs/spec.md §1.2).
_TABLES = {
    "ours": "rope.table:cos_sin_table_ours",
    # transformers' ROPE_INIT_FUNCTIONS and rotary-module forward (optional package): by name only.
    "transformers": "rope.backends.transformers.table:cos_sin_table_transformers",
    # vLLM's get_rope for the spec's config (optional package): by name only.
    "vllm": "rope.backends.vllm.table:cos_sin_table_vllm",
    # SGLang's get_rope for the spec's config (optional package): by name only.
    "sglang": "rope.backends.sglang.table:cos_sin_table_sglang",
}
BUILTIN_TABLES = ("ours",)


_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ATTRIBUTE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")     # public names only: no _private, no __dunder__


def resolve(target: str, *, kind: str, builtins: dict[str, str]) -> Callable:
    """Import ``module:callable`` (or a built-in name) and return the callable.

    Every failure is a ValueError naming the target: a malformed path, a module that fails to import
    (whatever it raises), a private or dunder attribute in the chain, and anything that is not a
    plain callable: classes, modules and builtins (``builtins:eval``, ``os:system``) are refused.
    """
    if not isinstance(target, str) or not target:
        raise ValueError(f"{kind}={target!r}: must be a registered name or 'module:callable'")
    path = builtins.get(target, target)
    if ":" not in path:
        raise ValueError(f"{kind}={target!r}: not a registered name ({', '.join(sorted(builtins))}) "
                         f"nor an import path 'package.module:callable'")
    module_name, _, attr = path.partition(":")
    if not _MODULE.match(module_name):
        raise ValueError(f"{kind}={target!r}: {module_name!r} is not an absolute module name")
    parts = attr.split(".")
    if not all(_ATTRIBUTE.match(part) for part in parts):
        raise ValueError(f"{kind}={target!r}: {attr!r} must be a chain of public attribute names "
                         f"(no private or dunder attributes)")
    module = import_user_module(module_name, what=f"{kind}={target!r}")
    fn = module
    for part in parts:
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"{kind}={target!r}: module {module_name!r} has no attribute {attr!r}")
    builtin = inspect.isbuiltin(fn) or (type(fn).__module__ == "builtins" and not inspect.isfunction(fn))
    if inspect.isclass(fn) or inspect.ismodule(fn) or builtin:
        raise ValueError(f"{kind}={target!r}: {attr!r} is a {type(fn).__name__}, not an implementation "
                         f"(a Python function or callable object)")
    if not callable(fn):
        raise ValueError(f"{kind}={target!r}: {attr!r} is not callable")
    return fn


def import_user_module(module_name: str, *, what: str):
    """Import a module a user names, resolving it against the current directory first, as
    ``python -m`` does (the directory is put first on ``sys.path`` and stays there, so the module's
    own imports of its neighbours work too): ``--impl myrope:rotate`` run beside ``myrope.py``
    needs no PYTHONPATH.  The same in the CLI, in every pytest worker (each starts in the run's
    directory) and in a replay.

    A module that cannot be found is a one-line ValueError naming the module, the directories
    searched and the fix; a module that is found but raises while importing names the exception
    and the file."""
    here = os.getcwd()
    searched = [os.path.abspath(p or here) for p in sys.path]
    if here not in searched:
        sys.path.insert(0, here)
        searched.insert(0, here)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            top = module_name.split(".", 1)[0]
            rest = [d for d in dict.fromkeys(searched) if d != here and os.path.isdir(d)]
            raise ValueError(
                f"{what}: cannot import module {module_name!r}: no {missing!r} in the current directory "
                f"({here}) nor on the rest of sys.path ({os.pathsep.join(rest)}); "
                f"run from the directory holding {top}.py (or the package {top}/), or add that directory to "
                f"PYTHONPATH") from None
        raise ValueError(_import_failure(what, module_name, exc)) from exc
    except (Exception, SystemExit) as exc:   # noqa: BLE001 - whatever a module raises at import
        raise ValueError(_import_failure(what, module_name, exc)) from exc


def _import_failure(what: str, module_name: str, exc: BaseException) -> str:
    spec = None
    try:
        spec = importlib.util.find_spec(module_name)
    except (Exception, SystemExit):   # noqa: BLE001 - a parent package that raises
        pass
    where = f" ({spec.origin})" if spec is not None and spec.origin else ""
    message = " ".join(str(exc).split())
    return f"{what}: cannot import module {module_name!r}{where}: it raised {type(exc).__name__}: {message}"


def get_implementation(name: str) -> Callable:
    """A rotation implementation by registered name or import path (its declarations checked:
    :func:`implementation_record` gives them)."""
    fn = resolve(name, kind="impl", builtins=_ROTATIONS)
    try:
        Implementation.of(name, fn)
    except ValueError as exc:
        raise ValueError(f"impl={name!r}: {exc}") from None
    return fn


def implementation_record(name: str, thing: str = "rotation", fn: Callable | None = None) -> Implementation:
    """The :class:`~rope.implementation.Implementation` record of a rotation or position-step
    implementation: by registered name or import path, or of ``fn`` under ``name``."""
    if fn is None:
        fn = get_implementation(name) if thing == "rotation" else get_positions_implementation(name)
    return Implementation.of(name, fn, thing)


def resolve_recorded(name: str, *, source: str, registered, get: Callable, option: str,
                     trusted: tuple[str, ...] = ()) -> Callable:
    """The implementation a case file names, through ``get``.  A case file is data from someone
    else, so only a name in ``registered`` resolves; an import path stored in it is never imported
    (that would run code a data file names): the ValueError shows it, with the option (``option``,
    the pytest one) that runs it on the user's word.  ``trusted`` lists packages whose paths may
    resolve (the suite's own mutants, for its corpus)."""
    if isinstance(name, str) and (name in registered or any(
            name.split(":", 1)[0] == package or name.startswith(package + ".") for package in trusted)):
        return get(name)
    raise ValueError(f"{source}: implementation={name!r} is not a registered name ({', '.join(sorted(registered))}); "
                     f"a replay never imports a module path stored in a case file. To run it, name it yourself: "
                     f"--impl {name} (rope-harness repro) or {option} {name} (pytest)")


def get_recorded_implementation(name: str, *, source: str, trusted: tuple[str, ...] = ()) -> Callable:
    """The rotation implementation a case file names (:func:`resolve_recorded`)."""
    return resolve_recorded(name, source=source, registered=_ROTATIONS, get=get_implementation,
                            option="--rope-impl", trusted=trusted)


def implementations() -> dict[str, Callable]:
    """Every built-in rotation implementation, by name (not the optional external adapters)."""
    return {name: get_implementation(name) for name in BUILTIN_ROTATIONS}


def get_positions_implementation(name: str) -> Callable:
    """A position-step implementation by registered name or import path."""
    return resolve(name, kind="positions_impl", builtins=_POSITIONS)


def get_recorded_positions_implementation(name: str, *, source: str, trusted: tuple[str, ...] = ()) -> Callable:
    """The position-step implementation a case file names (:func:`resolve_recorded`)."""
    return resolve_recorded(name, source=source, registered=_POSITIONS, get=get_positions_implementation,
                            option="--rope-position-step-impl", trusted=trusted)


def positions_implementations() -> dict[str, Callable]:
    """Every built-in position-step implementation, by name (not the optional vLLM adapter)."""
    return {name: get_positions_implementation(name) for name in BUILTIN_POSITIONS}


def get_table_implementation(name: str) -> Callable:
    """A table implementation by registered name (ours, transformers) or import path (its declarations checked)."""
    fn = resolve(name, kind="table_impl", builtins=_TABLES)
    try:
        Implementation.of(name, fn, "table")
    except ValueError as exc:
        raise ValueError(f"table_impl={name!r}: {exc}") from None
    return fn


def table_implementations() -> dict[str, Callable]:
    """Every built-in table implementation, by name (not the optional transformers adapter)."""
    return {name: get_table_implementation(name) for name in BUILTIN_TABLES}


def get_recorded_table_implementation(name: str, *, source: str, trusted: tuple[str, ...] = ()) -> Callable:
    """The table implementation a case file names (:func:`resolve_recorded`)."""
    return resolve_recorded(name, source=source, registered=_TABLES, get=get_table_implementation,
                            option="--rope-table-impl", trusted=trusted)


def positions_unsupported_reason(name: str, fn: Callable, device: str) -> str | None:
    supports = Implementation.of(name, fn, "position_step").supports
    if supports is None or supports(device):
        return None
    return f"unsupported: {name} does not run on {device}"


# The fused ops (docs/spec.md §10), op by op: contract A ``qk_norm_rope``, B ``rope_kv_cache``, C
# ``mla_rope_kv_cache`` (MLA: our Triton kernel only; the unfused sequence has none).
_FUSED = {
    "triton": {"qk_norm_rope": "rope.triton.fused_qk_norm_rope:qk_norm_rope_triton",
               "rope_kv_cache": "rope.triton.rope_kv_cache:rope_kv_cache_triton",
               "mla_rope_kv_cache": "rope.triton.rope_kv_cache:mla_rope_kv_cache_triton"},
    # The sequence an engine runs without the fused op: torch's norm and cache write, our rotation.
    "unfused": {"qk_norm_rope": "rope.triton.unfused:qk_norm_rope_unfused",
                "rope_kv_cache": "rope.triton.unfused:rope_kv_cache_unfused"},
    # FlashInfer's FP8 rope + paged append (CUDA, flashinfer-python), as contracts B and C.
    "flashinfer": {"rope_kv_cache": "rope.backends.flashinfer_fused:rope_kv_cache_flashinfer",
                   "mla_rope_kv_cache": "rope.backends.flashinfer_fused:mla_rope_kv_cache_flashinfer"},
    # FlashInfer's unfused pair: apply_rope_with_cos_sin_cache_inplace, then append_paged_kv_cache (B).
    "flashinfer-unfused": {"rope_kv_cache": "rope.backends.flashinfer_unfused:rope_kv_cache_flashinfer_unfused"},
}
BUILTIN_FUSED = ("triton", "unfused")
# What a run checks when none is named: the fused kernels (the unfused sequence is a bench baseline, by name).
DEFAULT_FUSED = ("triton",)


def get_fused_implementation(name: str, op: str | None = None):
    """A fused implementation by name: a built-in (``triton``, ``unfused``: their ops by contract) or
    an import path ``package.module:callable`` naming one op's callable, which declares its contract
    as ``fused_op`` (one of FUSED_OPS).  With ``op``: that op's callable, or None where the
    implementation has none; without: {op: callable} of every op it implements."""
    if op is not None and op not in FUSED_OPS:
        raise ValueError(f"op={op!r}: must be one of {FUSED_OPS}")
    if name in _FUSED:
        ops = {key: resolve(path, kind="fused_impl", builtins={}) for key, path in _FUSED[name].items()
               if op is None or key == op}     # only the op asked for is imported
    else:
        fn = resolve(name, kind="fused_impl", builtins={})
        declared = Implementation.of(f"fused_impl={name!r}: implementation", fn, "fused").fused_op
        if declared is None:
            raise ValueError(f"fused_impl={name!r}: fused_op=None: must be one of {FUSED_OPS} (the contract "
                             f"it implements, docs/implementations.md)")
        ops = {declared: fn}
    return ops if op is None else ops.get(op)


def get_recorded_fused_implementation(name: str, op: str, *, source: str, trusted: tuple[str, ...] = ()):
    """The fused implementation a case file names (:func:`resolve_recorded`), its ``op``'s callable
    (None where it has none)."""
    return resolve_recorded(name, source=source, registered=_FUSED, get=lambda n: get_fused_implementation(n, op),
                            option="--rope-fused-impl", trusted=trusted)


def fused_implementations() -> dict[str, dict]:
    """The fused implementations a run checks by default, by name: {op: callable}."""
    return {name: get_fused_implementation(name) for name in DEFAULT_FUSED}


MAX_SWITCH_TOKENS = MAX_SWITCH


def switch_tokens(name: str, fn: Callable) -> tuple[int, ...]:
    """The token counts at which ``fn`` declares it switches code paths (its record's
    ``switch_tokens``: each the first token count of a new path), sorted; () when it declares
    none.  A malformed declaration is a ValueError naming the implementation."""
    return Implementation.of(name, fn).switch_tokens


def switch_token_heads(name: str, fn: Callable) -> tuple[int, ...]:
    """The products ``tokens x (query heads + key heads)`` at which ``fn`` declares it switches
    code paths (each the first product of a new path, as fused QK-norm + RoPE kernels choose several
    heads per warp, vllm#51049), sorted; () when it declares none."""
    return Implementation.of(name, fn).switch_token_heads


def working_precision(fn: Callable) -> str:
    return Implementation.of("", fn).working_precision


def unsupported_reason(name: str, fn: Callable, spec, dtype, device: str) -> str | None:
    """None when ``fn`` claims to support the combination, else the reason to skip it: unsupported,
    or a known fault of that code (declared by the adapter: running it would crash the process)."""
    record = Implementation.of(name, fn)
    what = f"{spec.variant()} {str(dtype).replace('torch.', '')} on {device}"
    if record.unsupported_reason is not None:
        why = record.unsupported_reason(spec, dtype, device)
        if why is not None:
            return f"unsupported: {name} does not run {what}: {why}"
    elif record.supports is not None and not record.supports(spec, dtype, device):
        return f"unsupported: {name} does not run {what}"
    # Asked only of what the code claims to support.
    why = record.known_fault(spec, dtype, device) if record.known_fault is not None else None
    return None if why is None else f"known fault: {name} on {what}: {why}"


def known_defect(name: str, fn: Callable, spec, num_tokens: int, dtype, device: str, *, num_heads: int,
                 num_kv_heads: int) -> str | None:
    """Why ``fn`` is known to answer a call of ``num_tokens`` tokens of ``num_heads`` query and
    ``num_kv_heads`` key heads on the combination wrongly (or to raise on it), as its adapter declares
    (``declare(..., defect=...)``: a measured upstream defect), or None.  An implementation that
    declares no ``known_defect`` has every call checked."""
    defect = Implementation.of(name, fn).known_defect
    why = (defect(spec, num_tokens, dtype, device, num_heads=num_heads, num_kv_heads=num_kv_heads)
           if defect is not None else None)
    if why is None:
        return None
    return f"known defect: {name} on {spec.variant()} {str(dtype).replace('torch.', '')} on {device}: {why}"
