"""Rope ops in the serving-engine pattern (docs/spec.md §6): one forward per platform, chosen once.

A serving engine wraps a layer in a ``CustomOp``: it has ``forward_native`` (plain torch, what a
graph compiler traces) and one method per platform.  At construction, and never again, it picks:

    custom ops on  (eager)   cuda -> forward_cuda   rocm -> forward_hip
                             xpu  -> forward_xpu    cpu  -> forward_cpu
    custom ops off (graph)   forward_native

Platform and mode are constructor arguments here, so every platform can be simulated on the CPU.

The ops, and what each method runs (the dispatch matrix):

    op                    positions     native   cuda / hip                 xpu / cpu
    RotaryEmbeddingOp     [T]           native   generic 1-D kernel         generic 1-D kernel
    MRotaryEmbeddingOp    [3, T]        native   Triton (else native)       native
    XDRotaryEmbeddingOp   [3 | 4, T]    native   Triton (else native)       native

"Triton (else native)": the Triton kernel where Triton runs on the tensors' device
(:func:`rope.devices.triton_runs_on`), the native path otherwise.  The multi-row ops subclass the
1-D op, as vLLM's did, so each platform method they do not override is the 1-D op's, whose kernel
rejects ``[3|4, T]`` positions (docs/spec.md §7.4: vllm#24724, #27800, #52174).  They override all four.

Every op computes cos/sin from the positions of the call it serves; nothing per call is kept on it
(docs/spec.md §7.7).  ``forward`` validates first (ValueError naming the field, before any launch) and
returns ``(query, key)`` like the registry contract; the platform kernels may work in place.
"""

from __future__ import annotations

import torch

from rope.cache import cos_sin_cache
from rope.devices import DEVICE_NAMES, device_name, gpu_backend, torch_device, triton_runs_on
from rope.native import rotate_native
from rope.spec import RopeSpec, check_rotation_inputs
from rope.triton.rotary import rotate_triton

PLATFORMS = ("cuda", "rocm", "xpu", "cpu")
MODES = {"eager": True, "graph": False}        # mode -> custom ops enabled
PLATFORM_METHODS = {"cuda": "forward_cuda", "rocm": "forward_hip", "xpu": "forward_xpu", "cpu": "forward_cpu"}

# The generic kernel's errors, worded like the C++ kernel's checks (docs/spec.md §6).
BATCH_SEQ_MISMATCH = "query, key and positions must have the same batch_size and seq_len"
TOKEN_MISMATCH = "query, key and positions must have the same number of tokens"
POSITIONS_RANK = "positions must have shape [num_tokens] or [batch_size, seq_len]"


def current_platform() -> str:
    """The platform this process runs on: the GPU backend if any, else 'cpu'."""
    return gpu_backend() or "cpu"


# --------------------------------------------------------------------------- generic 1-D kernel
def rotary_embedding_1d(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                        head_size: int, cos_sin_cache: torch.Tensor, is_neox_style: bool):
    """The generic 1-D platform kernel: a serving engine's C++ rotary kernel, in torch.

    Contract (vLLM's ``_C.rotary_embedding``):
        positions: [num_tokens] with query [num_tokens, H * head_size],
                   or [batch, seq_len] with query [batch, seq_len, H * head_size]; key alike or None.
        cos_sin_cache: [L, rot_dim], cos | sin, rot_dim <= head_size; channels >= rot_dim pass through.
    The checks raise RuntimeError, as the kernel's TORCH_CHECKs do.  With 2-D positions the sizes
    are read as [batch, seq_len], so M-RoPE / XD-RoPE positions [3|4, T] always fail the check.
    Computes in float32, rounds to the activation dtype at the store; rotates in place.

    Returns:
        (query, key): the same tensors, rotated.
    """
    if positions.dim() == 1:
        num_tokens = positions.shape[0]
        if query.shape[0] != num_tokens or (key is not None and key.shape[0] != num_tokens):
            raise RuntimeError(TOKEN_MISMATCH)
    elif positions.dim() == 2:
        batch_seq = tuple(positions.shape)
        if tuple(query.shape[:2]) != batch_seq or (key is not None and tuple(key.shape[:2]) != batch_seq):
            raise RuntimeError(BATCH_SEQ_MISMATCH)
    else:
        raise RuntimeError(POSITIONS_RANK)
    rot_dim = cos_sin_cache.shape[1]
    if rot_dim > head_size:
        raise RuntimeError("rot_dim must be <= head_size")
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)     # [*positions.shape, rot_dim/2]
    for x in (query, key):
        if x is not None:
            _rotate_in_place(x, cos, sin, head_size, rot_dim, is_neox_style)
    return query, key


def _rotate_in_place(x, cos, sin, head_size, rot_dim, is_neox_style) -> None:
    # (1) View the heads: [..., H, head_size] (a view, so the stores below land in x).
    heads = x.unflatten(-1, (-1, head_size))
    # (2) Pairs: NeoX (i, i + rot_dim/2), GPT-J (2i, 2i + 1).
    if is_neox_style:
        a, b = heads[..., : rot_dim // 2], heads[..., rot_dim // 2: rot_dim]
    else:
        a, b = heads[..., 0:rot_dim:2], heads[..., 1:rot_dim:2]
    # (3) fp32 arithmetic, one rounding to x's dtype at each store (copy_ rounds to nearest even).
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = a.float(), b.float()
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    a.copy_(o1)
    b.copy_(o2)


rotary_embedding_1d.working_precision = "float32"


# --------------------------------------------------------------------------- CustomOp
class CustomOp(torch.nn.Module):
    """Chooses its forward once, at construction, from the platform and the mode.

    Args:
        platform: one of PLATFORMS; default the platform this process runs on.
        custom_ops: True (eager: the platform's method) or False (graph: forward_native).
    Changing ``platform`` or ``custom_ops`` afterwards changes nothing: the choice is made.
    """

    def __init__(self, *, platform: str | None = None, custom_ops: bool = True):
        super().__init__()
        platform = current_platform() if platform is None else platform
        if platform not in PLATFORMS:
            raise ValueError(f"platform={platform!r}: must be one of {PLATFORMS}")
        if not isinstance(custom_ops, bool):
            raise ValueError(f"custom_ops={custom_ops!r}: must be a bool (True: eager, False: graph)")
        self.platform = platform
        self.custom_ops = custom_ops
        self._forward_method = self.dispatch_forward()

    def dispatch_forward(self):
        if not self.custom_ops:
            return self.forward_native
        return getattr(self, PLATFORM_METHODS[self.platform])

    @property
    def method(self) -> str:
        """Name of the forward chosen at construction (``forward_cuda``, ...)."""
        return self._forward_method.__name__

    def forward(self, *args, **kwargs):
        return self._forward_method(*args, **kwargs)

    # Defaults of the pattern: hip runs the cuda path, xpu and cpu the native one.
    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_cuda(self, *args, **kwargs):
        raise NotImplementedError

    def forward_hip(self, *args, **kwargs):
        return self.forward_cuda(*args, **kwargs)

    def forward_xpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_cpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)


# --------------------------------------------------------------------------- rope ops
class RotaryEmbeddingOp(CustomOp):
    """1-D RoPE, positions [T].  Its platform methods call the generic 1-D kernel.

    Args:
        spec: the rotation; its cos/sin cache is built at construction in ``dtype`` on ``device``.
        dtype: the activation dtype (query and key must have it).
        platform, custom_ops: see :class:`CustomOp`.
    """

    NUM_DIMS: tuple[int, ...] = (1,)                  # position rows the op takes (spec.num_dims)
    LAYOUTS: tuple[str, ...] = ("chunked",)

    def __init__(self, spec: RopeSpec, dtype: torch.dtype = torch.float32, *, platform: str | None = None,
                 custom_ops: bool = True, device="cpu"):
        self.check_spec(spec)
        super().__init__(platform=platform, custom_ops=custom_ops)
        self.spec = spec
        self.dtype = dtype
        device = torch_device(device) if device in DEVICE_NAMES else torch.device(device)
        self.register_buffer("cos_sin_cache", cos_sin_cache(spec, dtype, device), persistent=False)

    @classmethod
    def check_spec(cls, spec: RopeSpec) -> None:
        if not isinstance(spec, RopeSpec):
            raise ValueError(f"spec={spec!r}: must be a RopeSpec")
        if spec.num_dims not in cls.NUM_DIMS:
            raise ValueError(f"sections={spec.sections}: {cls.__name__} takes {' or '.join(map(str, cls.NUM_DIMS))} "
                             f"position rows (got {spec.num_dims})")
        if spec.layout not in cls.LAYOUTS:
            raise ValueError(f"layout={spec.layout!r}: {cls.__name__} supports {cls.LAYOUTS} (got {spec.layout!r})")

    def check_inputs(self, positions, query, key) -> None:
        """ValueError naming the field for anything the op cannot take; nothing is launched."""
        if not isinstance(query, torch.Tensor):
            raise ValueError(f"query={type(query).__name__}: must be a torch.Tensor")
        if query.dtype != self.dtype:
            raise ValueError(f"query.dtype={query.dtype}: must be the op's dtype ({self.dtype})")
        check_rotation_inputs(self.spec, positions, query, key, self._cache_for(query))

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        """Validate, then run the method chosen at construction; returns (query, key)."""
        self.check_inputs(positions, query, key)
        return super().forward(positions, query, key)

    def _cache_for(self, query: torch.Tensor) -> torch.Tensor:
        return self.cos_sin_cache.to(query.device)

    def _generic_kernel(self, positions, query, key):
        return rotary_embedding_1d(positions, query, key, self.spec.head_size, self._cache_for(query),
                                   self.spec.is_neox_style)

    def forward_native(self, positions, query, key=None):
        return rotate_native(self.spec, positions, query, key, self._cache_for(query))

    # A serving engine's 1-D platform kernels (_C on cuda and cpu, IPEX on xpu, AITER or _C on rocm).
    def forward_cuda(self, positions, query, key=None):
        return self._generic_kernel(positions, query, key)

    def forward_hip(self, positions, query, key=None):
        return self._generic_kernel(positions, query, key)

    def forward_xpu(self, positions, query, key=None):
        return self._generic_kernel(positions, query, key)

    def forward_cpu(self, positions, query, key=None):
        return self._generic_kernel(positions, query, key)


class _MultiRowRotaryOp(RotaryEmbeddingOp):
    """Positions [num_dims, T]: no platform method may reach the 1-D kernel."""

    def forward_cuda(self, positions, query, key=None):
        if triton_runs_on(device_name(query.device)):
            return rotate_triton(self.spec, positions, query, key, self._cache_for(query))
        return self.forward_native(positions, query, key)

    def forward_hip(self, positions, query, key=None):
        return self.forward_cuda(positions, query, key)

    def forward_xpu(self, positions, query, key=None):      # vllm#24724 (M-RoPE), vllm#52174 (XD-RoPE)
        return self.forward_native(positions, query, key)

    def forward_cpu(self, positions, query, key=None):      # vllm#24712, #27800
        return self.forward_native(positions, query, key)


class MRotaryEmbeddingOp(_MultiRowRotaryOp):
    """M-RoPE (Qwen2-VL chunked, Qwen3-VL interleaved), positions [3, T]."""

    NUM_DIMS = (3,)
    LAYOUTS = ("chunked", "interleaved")


class XDRotaryEmbeddingOp(_MultiRowRotaryOp):
    """XD-RoPE (HunyuanOCR), positions [3 | 4, T], chunked sections."""

    NUM_DIMS = (3, 4)
    LAYOUTS = ("chunked",)
