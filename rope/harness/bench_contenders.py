"""What ``rope-harness bench`` races: our kernels, and the peers a kernel engineer would pick instead.

A contender is bound to one input set before it is timed: ``bind(spec, positions, q, k, cache)``
returns a function of no arguments that runs exactly the timed work and returns ``(q_out, k_out)``,
so the check against the float64 reference runs the very call that is timed.  What an engine does
once per model rather than per call (building vLLM's or SGLang's rotary op, FlashInfer's float32
cache, compiling a graph) happens in ``bind``, as it does in the engine.  Per call, each peer does
what its engine does per call:

* ``vllm-cuda``: vLLM's ``MRotaryEmbedding.forward_cuda``: the cos/sin gather, then ``triton_mrope``;
* ``liger``: Liger's M-RoPE with the gather into its ``[3, 1, T, rotary_dim]`` cos/sin included (a
  model patched with Liger gathers per call), and ``liger-pregathered``: the kernel alone, cos/sin
  gathered once outside the timed call;
* ``flashinfer``: ``apply_rope_with_cos_sin_cache`` (1-D RoPE only);
* ``sglang-triton``: SGLang's ``MRotaryEmbedding.forward_triton`` (fused gather and rotation);
* ``torch-compile``: the native rotation compiled whole (``fullgraph=True``: a graph break is an
  error, not a silent eager fallback), one graph per shape, its Dynamo graph count reported;
* ``native``: the same plain torch ops, eager; ``transformers``: transformers' ``apply_rotary_pos_emb``.

Ours are ``triton`` (the unchecked launch an engine would call), ``triton-public`` (the documented
entry, its checks included) and ``triton-bare`` (the same compiled kernel launched the way Triton's
documentation does, ``kernel[grid](*args, **constexprs)``, grid and arguments computed once: the
yardstick of the host path).  A peer whose package is not installed is listed as absent.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from rope.devices import triton_runs_on
from rope.native import apply_rotation, rotate_native_unchecked
from rope.implementation import Implementation
from rope.registry import get_implementation, unsupported_reason, working_precision
from rope.spec import RopeSpec

Bind = Callable[..., Callable[[], tuple]]


@dataclass(frozen=True)
class Contender:
    name: str
    ours: bool
    bind: Bind
    working_precision: str
    reason: Callable[[RopeSpec, torch.dtype, str], str | None] = lambda spec, dtype, device: None
    triton: bool = False     # a Triton kernel: under the CPU interpreter it is checked, never timed
    graphs: Callable[[], int] | None = None    # Dynamo graphs compiled so far (torch-compile)


def _call_with(fn) -> Bind:
    return lambda spec, positions, q, k, cache: functools.partial(fn, spec, positions, q, k, cache)


def _reason(name: str, fn) -> Callable:
    """Why ``fn`` does not run a combination (unsupported or a known fault), as the suite says it."""
    return lambda spec, dtype, device: unsupported_reason(name, fn, spec, dtype, device)


# ------------------------------------------------------------------------------------ ours
def _ours() -> list[Contender]:
    triton_fn = get_implementation("triton")
    reason = _reason("triton", triton_fn)
    public_reason = lambda spec, dtype, device: (   # noqa: E731
        "the public entry's device-side checks are what it adds on a GPU" if device == "cpu" else reason(spec, dtype, device))
    bare_reason = lambda spec, dtype, device: (   # noqa: E731
        "Triton's own launch path is the host-time yardstick of a GPU" if device == "cpu" else reason(spec, dtype, device))
    return [Contender("triton", True, _call_with(triton_fn.unchecked), "float32", reason, triton=True),
            Contender("triton-public", True, _call_with(triton_fn), "float32", public_reason, triton=True),
            Contender("triton-bare", True, triton_fn.bare_launch, "float32", bare_reason, triton=True)]


# Ours launched without programmatic dependent launch: back to back under a graph, each call of the
# default launch overlaps the one before where it is launched with PDL (up to PDL_MAX_TOKENS tokens
# and across the one-wave band: rope/triton/rotary_plan.py); no peer's does, so the race times ours
# this way too, where PDL exists (rope.harness.bench.race).
NO_OVERLAP = "triton-no-pdl"


def no_overlap_contender() -> Contender:
    triton_fn = get_implementation("triton")
    bind = lambda spec, positions, q, k, cache: functools.partial(   # noqa: E731
        triton_fn.unchecked, spec, positions, q, k, cache, pdl=False)
    return Contender(NO_OVERLAP, True, bind, "float32", _reason("triton", triton_fn), triton=True)


# ------------------------------------------------------------------------------------ plain torch
def rotate_for_the_compiler(spec: RopeSpec, positions, query, key, cos_sin_cache, freq_rows):
    """The rotation in plain torch, written the way a compiler can fuse it: each frequency's cos/sin
    read straight from the cache at its position row (``freq_rows[f]``: the axis of frequency f), an
    indexed load per output element instead of gathering ``[rows, T, rotary_dim]`` and selecting from
    it (native's formulation, which Inductor turns into three passes over the gathered rows)."""
    half = spec.rotary_dim // 2
    pos = positions.reshape(-1, positions.shape[-1])[freq_rows].t()      # [T, half]: row of each frequency
    freqs = torch.arange(half, device=positions.device)
    cache = cos_sin_cache.to(query.dtype)
    cos, sin = cache[pos, freqs], cache[pos, freqs + half]              # [T, half] each
    return apply_rotation(spec, query, cos, sin), (apply_rotation(spec, key, cos, sin) if key is not None else None)


def _compiled() -> Contender:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.config.recompile_limit = 256     # one graph per model x size (dynamic=False)
    compiled = torch.compile(rotate_for_the_compiler, fullgraph=True, dynamic=False)

    def bind(spec, positions, q, k, cache):
        # The frequency-to-row map goes in as a tensor held by the caller, as an engine holds its
        # section masks (a cached lookup inside would be a graph break).
        freq_rows = torch.tensor(spec.axis_map(), device=cache.device)
        return lambda: compiled(spec, positions, q, k, cache, freq_rows)
    return Contender("torch-compile", False, bind, "activation",
                     graphs=lambda: int(counters["stats"]["unique_graphs"]))


def _transformers() -> Contender | None:
    """transformers' own NeoX rotation (apply_rotary_pos_emb on [T, H, D] with cat(f, f) cos/sin)."""
    try:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb
    except ImportError:
        return None
    from rope.native import select_cos_sin

    def hf(spec, positions, query, key, cache):
        cos, sin = select_cos_sin(spec, positions, cache.to(query.dtype))
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        t = query.shape[0]
        q = query.view(t, -1, spec.head_size)
        k = key.view(t, -1, spec.head_size)
        rd = spec.rotary_dim
        q_rot, k_rot = apply_rotary_pos_emb(q[..., :rd], k[..., :rd], cos, sin, unsqueeze_dim=1)
        return (torch.cat((q_rot, q[..., rd:]), -1).view(t, -1), torch.cat((k_rot, k[..., rd:]), -1).view(t, -1))
    return Contender("transformers", False, _call_with(hf), "activation",
                     lambda spec, dtype, device: None if spec.is_neox_style else "apply_rotary_pos_emb pairs NeoX-style only")


# ------------------------------------------------------------------------------------ engines
def _engine(name: str, module: str, *, bind_kwargs: dict | None = None, label: str | None = None) -> Contender:
    """An engine's adapter: its ``engine_call`` is the bound call, its registry entry the reasons.
    Raises ImportError where the engine is not installed."""
    import importlib
    fn = get_implementation(name)          # ValueError naming the package where it is missing
    engine_call = importlib.import_module(module).engine_call
    kwargs = bind_kwargs or {}
    reason = _reason(name, fn)
    if name == "vllm-cuda":
        reason = _vllm_reason(reason)
    return Contender(label or name, False, lambda *args: engine_call(*args, **kwargs), working_precision(fn),
                     reason, triton=name != "flashinfer")


def _vllm_reason(reason):
    """vLLM's CUDA path for 1-D positions is its compiled ``rotary_embedding`` op (``vllm._C``); where
    that is not importable (a trimmed carry: lab/offline/vllm_carry.sh) forward_cuda falls back to torch
    ops, which is not what vLLM runs, so 1-D is not raced there."""
    import importlib.util
    compiled = importlib.util.find_spec("vllm._C") is not None

    def why(spec, dtype, device):
        if spec.num_dims == 1 and not compiled:
            return "vLLM's 1-D CUDA path is its compiled op (vllm._C), not importable here"
        return reason(spec, dtype, device)
    return why


ENGINES = (("vllm-cuda", "rope.backends.vllm.rotation", None, None),
           ("liger", "rope.backends.liger", None, None),
           ("liger", "rope.backends.liger", {"pregathered": True}, "liger-pregathered"),
           ("sglang-triton", "rope.backends.sglang.rotation", None, None),
           ("flashinfer", "rope.backends.flashinfer", None, None))

CONTENDERS = ("triton", "triton-public", "triton-bare", "vllm-cuda", "liger", "liger-pregathered", "sglang-triton",
              "flashinfer", "torch-compile", "native", "transformers")


def contenders(only=CONTENDERS, extra: list[str] = ()) -> tuple[list[Contender], dict[str, str]]:
    """The contenders in ``only`` that can run here, and why each of the others cannot (absent
    package).  ``extra``: implementations named by the user (registry names or import paths), timed
    as peers through their ``unchecked`` entry where they have one."""
    found: list[Contender] = []
    absent: dict[str, str] = {}
    found += [c for c in _ours() if c.name in only]
    for name, module, kwargs, label in ENGINES:
        if (label or name) not in only:
            continue
        try:
            found.append(_engine(name, module, bind_kwargs=kwargs, label=label))
        except (ImportError, ValueError) as exc:
            absent[label or name] = str(exc).splitlines()[0]
    if "torch-compile" in only:
        found.append(_compiled())
    if "native" in only:
        found.append(Contender("native", False, _call_with(rotate_native_unchecked), "activation"))
    if "transformers" in only:
        hf = _transformers()
        if hf is None:
            absent["transformers"] = "transformers is not installed"
        else:
            found.append(hf)
    for name in extra:
        fn = get_implementation(name)
        record = Implementation.of(name, fn)
        found.append(Contender(name, False, _call_with(record.unchecked or fn), record.working_precision,
                               _reason(name, fn)))
    return found, absent


def timed_here(contender: Contender, device: str) -> bool:
    """Whether the contender's time means something on ``device``: a Triton kernel on the CPU runs
    under the interpreter (checked, not timed)."""
    return not (contender.triton and device == "cpu")


def runs_here(contender: Contender, device: str) -> bool:
    return not contender.triton or triton_runs_on(device)

