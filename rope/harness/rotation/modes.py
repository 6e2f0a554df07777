"""The modes engines call a rotation in, beside the eager call every property makes: the same
inputs twice (the same bits back), under torch.compile, and captured in a CUDA (HIP) graph that is
replayed with new values copied into its inputs.  Free of pytest: each function returns what is
wrong (a list of problems, or the comparisons), the properties turn that into a failure.

Engines do not call a kernel eagerly once: vLLM compiles the model and replays CUDA graphs whose
static buffers are refilled every step.  The bugs that live there pass an eager check: RoPE skipped
only in the compiled model (olmoearth_pretrain#600), a host-side position offset baked into the
captured graph (candle#3728), a kernel that reads a tile still being filled and answers differently
on each call (vllm-ascend#16674).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

# GraphCaptureFailed and mode_words are rope.harness.modes' (shared by the slices), named here for callers.
from rope.harness.modes import GraphCaptureFailed, capture_graph, declared_mode_reason, graph_device, mode_words
from rope.harness.rotation.bound import compare_rotation
from rope.harness.rotation.cases import build_rotation_inputs
from rope.harness.rotation.check import angle_source, reference_rotation
from rope.implementation import Implementation
from rope.spec import RopeSpec

__all__ = ["GraphCaptureFailed", "GraphReplay", "ReplayStep", "StaleReplay", "bit_differences", "compile_backend",
           "compile_unavailable_reason", "compiled_implementation", "graph_case", "graph_replay_steps",
           "mode_unsupported_reason", "replay_in_graph", "stale_replay"]


def mode_unsupported_reason(impl: Implementation, mode: str, device: str) -> str | None:
    """Why ``impl`` is not checked in ``mode`` on ``device`` (None: it is)."""
    reason = declared_mode_reason(impl, mode, device)
    if reason is None and mode == "compile":
        return compile_unavailable_reason(impl, device)
    return reason


def compile_backend(device: str) -> str:
    """inductor on a GPU, as engines compile; on the CPU aot_eager: the same Dynamo trace and
    AOTAutograd graph (where a rotation skipped under compile, or a guard on the wrong input, shows)
    without inductor's C++ code generation, which costs seconds per recompile and every drawn spec
    is one."""
    return "aot_eager" if device == "cpu" else "inductor"


def compiled_implementation(impl: Implementation, device: str) -> Implementation:
    """``impl`` with its callable under torch.compile (dynamic shapes; fullgraph where it declares
    it).  Dynamo's recompile limit is lifted for it and a hit raises: past the limit Dynamo would
    otherwise fall back to running the function eagerly, silently, and an eager pass would stand in
    for the compiled call being checked."""
    fn = torch.compile(impl.fn, dynamic=True, fullgraph=impl.fullgraph, backend=compile_backend(device))

    def under_compile(spec, positions, query, key, cos_sin_cache):
        import torch._dynamo.config as dynamo_config
        with dynamo_config.patch(recompile_limit=1 << 16, accumulated_recompile_limit=1 << 16,
                                 fail_on_recompile_limit_hit=True):
            return fn(spec, positions, query, key, cos_sin_cache)
    under_compile.__name__ = f"compiled_{getattr(impl.fn, '__name__', 'implementation')}"
    return replace(impl, fn=under_compile)


_PROBED: dict = {}


def compile_unavailable_reason(impl: Implementation, device: str) -> str | None:
    """Why ``impl`` cannot be called under torch.compile on this machine at all (None: it can): a
    Triton kernel launched straight from Python runs, without a GPU, in Triton's interpreter, whose
    NumPy pointer arithmetic Dynamo cannot trace.  On a GPU Dynamo traces the kernel itself; a
    kernel behind a torch.library custom op is opaque to it and runs anywhere.  Found by one probe
    call per implementation: a tracing failure inside the interpreter's frames is this, and only
    this; every other failure is the implementation's and is checked like any other."""
    key = (impl.name, id(impl.fn), device)
    if key not in _PROBED:
        _PROBED[key] = _probe_compile(impl, device)
    return _PROBED[key]


def _probe_compile(impl: Implementation, device: str) -> str | None:
    import traceback
    spec = RopeSpec(head_size=64, rotary_dim=64, is_neox_style=True, max_position=16)
    dev = torch.device(device if device != "rocm" else "cuda")
    positions = torch.arange(4, device=dev)
    query = torch.ones(4, 64, device=dev)
    from rope.cache import cos_sin_cache
    cache = cos_sin_cache(spec, dtype=torch.float32, device=dev)
    try:
        compiled_implementation(impl, device)(spec, positions, query, query.clone(), cache)
    except Exception as exc:  # noqa: BLE001 - classified below, never swallowed as a pass
        frames = traceback.extract_tb(exc.__traceback__)
        text = "".join(traceback.format_exception(exc))
        if "triton/runtime/interpreter.py" in text and "torch._dynamo" in text + "".join(f.filename for f in frames):
            return ("Dynamo cannot trace Triton's interpreter (a kernel launched from Python, on a machine "
                    "without a GPU); a GPU checks this implementation under torch.compile")
    return None


def bit_differences(first: torch.Tensor | None, second: torch.Tensor | None, what: str) -> list[str]:
    """Where two outputs of the same call differ bit for bit (NaN payloads included): nothing, or a
    line naming how many elements differ and the first (token, channel)."""
    if first is None and second is None:
        return []
    if first is None or second is None:
        return [f"{what}: one call returned None and the other a tensor"]
    if first.shape != second.shape or first.dtype != second.dtype:
        return [f"{what}: shape/dtype {tuple(first.shape)} {first.dtype} then {tuple(second.shape)} {second.dtype}"]
    a, b = first.detach().cpu().contiguous(), second.detach().cpu().contiguous()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    differ = a.view(ints) != b.view(ints)
    if not bool(differ.any()):
        return []
    where = differ.nonzero()[0].tolist()
    return [f"{what}: {int(differ.sum())} of {differ.numel()} elements differ between two calls on the same inputs "
            f"(first at index {tuple(where)}: {a[tuple(where)].item()!r} then {b[tuple(where)].item()!r})"]


@dataclass
class ReplayStep:
    """One replay's inputs, on the CPU: the first ``num_tokens`` rows are real tokens, the rest
    padding (position 0, as a runner pads a CUDA-graph batch)."""
    positions: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor | None
    num_tokens: int


@dataclass
class GraphReplay:
    """What one replay returned (copied out of the graph's outputs right after it ran)."""
    step: ReplayStep
    q_out: torch.Tensor
    k_out: torch.Tensor | None


def replay_in_graph(fn, spec: RopeSpec, cache: torch.Tensor, steps: list[ReplayStep], device: str,
                    warmups: int = 2) -> list[GraphReplay]:
    """Warm ``fn`` up eagerly on the first step's inputs and capture one call in a CUDA graph on
    static buffers (rope.harness.modes.capture_graph), then for each step copy its inputs into
    those buffers, replay, and copy the outputs out.  The captured call may work in place (its
    outputs then alias the buffers)."""
    dev = graph_device(device)
    first = steps[0]
    positions = first.positions.to(dev).clone()
    query = first.query.to(dev).clone()
    key = None if first.key is None else first.key.to(dev).clone()
    cache = cache.to(dev)

    def fill(step: ReplayStep) -> None:
        positions.copy_(step.positions)
        query.copy_(step.query)
        if key is not None:
            key.copy_(step.key)

    graph, (q_out, k_out) = capture_graph(lambda: fn(spec, positions, query, key, cache), lambda: fill(first),
                                          device, warmups)
    replays = []
    for step in steps:
        fill(step)
        graph.replay()
        torch.cuda.synchronize(dev)
        replays.append(GraphReplay(step, q_out.detach().cpu().clone(),
                                   None if k_out is None else k_out.detach().cpu().clone()))
    return replays


def graph_case(case):
    """The case as the graph property captures it: q and k contiguous (the captured buffers are
    filled by copy), no NaN planted."""
    return replace(case, packed_qkv=False, nonfinite=False)


def graph_replay_steps(case, replay_tokens) -> list[ReplayStep]:
    """The replays of a graph-mode case: replay i runs the inputs of seed + i with its first
    ``replay_tokens[i]`` tokens real and the rest padding (position 0).  A function of the case and
    the token counts alone, so a case file that records them replays the same sequence."""
    steps = []
    for i, real in enumerate(replay_tokens):
        x = build_rotation_inputs(replace(case, seed=case.seed + i), "cpu")
        positions = x.positions.clone()
        positions[..., real:] = 0
        steps.append(ReplayStep(positions, x.query.contiguous(), None if x.key is None else x.key.contiguous(), real))
    return steps


@dataclass
class StaleReplay:
    """The first replay that does not match the reference of its own inputs."""
    index: int
    replays: int
    step: ReplayStep
    comparison: object          # rope.harness.rotation.bound.Comparison

    def sentence(self, num_tokens: int) -> str:
        """What went wrong, in one line (the case had ``num_tokens`` tokens)."""
        return (f"graph replay {self.index} of {self.replays} ({self.step.num_tokens} real tokens of {num_tokens}) "
                f"does not match the reference of that replay's inputs")


def stale_replay(impl: Implementation, case, replay_tokens, device: str) -> tuple[StaleReplay | None, object]:
    """Capture ``impl`` on the graph case's inputs, replay :func:`graph_replay_steps`, and hold each
    replay to the reference of its own inputs: (the first stale replay or None, the last comparison).
    Raises GraphCaptureFailed when the call cannot be captured."""
    steps = graph_replay_steps(case, replay_tokens)
    cache = build_rotation_inputs(case, "cpu").cache
    comparison = None
    for i, replay in enumerate(replay_in_graph(impl.fn, case.spec, cache, steps, device)):
        step = replay.step
        ref_q, ref_k = reference_rotation(impl.fn, case.spec, step.positions, step.query, step.key, cache)
        comparison = compare_rotation(case.spec, step.positions, step.query, step.key, cache, replay.q_out,
                                      replay.k_out, ref_q, ref_k, impl.working_precision, angles=angle_source(impl.fn))
        if not comparison.ok:
            return StaleReplay(i, len(steps), step, comparison), comparison
    return None, comparison
