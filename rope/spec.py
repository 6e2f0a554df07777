"""The contract every implementation and the reference share: RopeSpec, the static description of
one rotary embedding (docs/spec.md §1-§3), the checks of a rotation call's inputs, and the checks of
a runner position-step call (§5).

A spec says *which* rotation to apply: head size, how many channels rotate,
how they pair (NeoX halves or GPT-J neighbours), which position row drives each
frequency (sections + layout), the base and the cache length.  It validates
itself at construction, so every later stage can trust it.

Error messages follow ``<field>=<value>: <rule> (<actual>)``.
"""

from __future__ import annotations

import dataclasses
import math
import os

import torch
from dataclasses import dataclass

from rope import row_maps
from rope.overlap import check_no_overlap
from rope.row_maps import CUSTOM, LAYOUT_ROWS, LAYOUTS
from rope.spec_scaling import RopeScaling

MAX_NUM_DIMS = 4
# Limits of a spec (documented in docs/spec.md §1): the widest heads of real models are 256 wide,
# the longest catalogued cache has 4 x 262,144 rows; past these a cache is not worth allocating and
# a position overflows the kernels' 32-bit row offsets long before.
MAX_HEAD_SIZE = 1024
MAX_POSITION = 1 << 24


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, repr=False)
class RopeSpec:
    """One rotary embedding configuration.

    Attributes:
        head_size: channels per head.
        rotary_dim: leading channels of each head that rotate (even, <= head_size);
            the rest pass through unchanged (partial rotary).
        is_neox_style: True pairs (i, i + rotary_dim/2), False pairs (2i, 2i+1) (GPT-J).
        sections: None for 1-D RoPE; else positive ints summing to rotary_dim/2, one per position
            row (3 rows for M-RoPE, 3 or 4 for XD-RoPE, 2 for HunyuanImage-3.0): the layout's
            parameters as the model's config writes them (for chunked, custom and two-row maps the
            rows' frequency counts; Ernie-4.5-VL writes (s_h, s_w, s_t)).
        layout: the map from frequencies to position rows (docs/spec.md §2; rope/row_maps.py):
            "chunked" (row d owns a contiguous run), "interleaved" (Qwen3-VL: T H W T H W ...,
            bounded by 3*s), "glm_round_robin" (SGLang's GLM map), "ernie45" (Ernie-4.5-VL),
            "two_row_interleaved" (HunyuanImage-3.0: y x y x ...), or "custom" (``freq_rows``).
            The named constructors (:meth:`chunked`, :meth:`interleaved`, :meth:`glm_round_robin`,
            :meth:`ernie45`, :meth:`two_row_interleaved`, :meth:`from_map`) build each.
        base: rope_theta.
        max_position: cache length; every position must be < max_position.
        ntk_alpha: XD-RoPE dynamic NTK-alpha; the effective base becomes
            base * ntk_alpha ** (rotary_dim / (rotary_dim - 2)).
        freq_rows: layout "custom" only: the position row of each of the rotary_dim/2 frequencies
            (every row 0 .. len(sections) - 1 drives sections[row] of them).
        scaling: None for the plain table (docs/spec.md §1), else the rope config's scaling
            (``RopeScaling``: linear, dynamic, ntk, yarn, deepseek_yarn, llama3, longrope,
            proportional), with sections too (YaRN on M-RoPE).  A mapping is read as
            ``RopeScaling.from_dict``; rope_type "default" is stored as None.  Proportional RoPE
            (Gemma 4) rotates the whole head: rotary_dim == head_size, the frequencies past its
            partial_rotary_factor zero.
    """

    head_size: int
    rotary_dim: int
    is_neox_style: bool = True
    sections: tuple[int, ...] | None = None
    layout: str = "chunked"
    base: float = 10000.0
    max_position: int = 4096
    ntk_alpha: float | None = None
    freq_rows: tuple[int, ...] | None = None
    scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        for name in ("sections", "freq_rows"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                if isinstance(value, (str, bytes, dict, set, frozenset)):     # no order, or characters
                    raise ValueError(f"{name}={value!r}: must be a sequence of ints or None")
                try:
                    object.__setattr__(self, name, tuple(value))
                except TypeError:
                    raise ValueError(f"{name}={value!r}: must be a sequence of ints or None") from None
        if self.scaling is not None:
            scaling = RopeScaling.from_dict(self.scaling)
            object.__setattr__(self, "scaling", None if scaling.rope_type == "default" else scaling)
        self._validate()

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if not (f.name in ("freq_rows", "scaling") and getattr(self, f.name) is None)]
        return f"RopeSpec({', '.join(shown)})"

    # ------------------------------------------------------------ constructors
    @classmethod
    def chunked(cls, head_size: int, rotary_dim: int, sections=None, **fields) -> "RopeSpec":
        """Row d owns a contiguous run of sections[d] frequencies (sections None: 1-D RoPE)."""
        return cls(head_size, rotary_dim, sections=sections, layout="chunked", **fields)

    @classmethod
    def interleaved(cls, head_size: int, rotary_dim: int, sections, **fields) -> "RopeSpec":
        """Qwen3-VL's map of sections (s_t, s_h, s_w): T H W T H W ..., H below 3*s_h, W below 3*s_w."""
        return cls(head_size, rotary_dim, sections=sections, layout="interleaved", **fields)

    @classmethod
    def glm_round_robin(cls, head_size: int, rotary_dim: int, sections, **fields) -> "RopeSpec":
        """SGLang's GLM map of sections (s_t, s_h, s_w): row i % 3, or the next with room."""
        return cls(head_size, rotary_dim, sections=sections, layout="glm_round_robin", **fields)

    @classmethod
    def ernie45(cls, head_size: int, rotary_dim: int, sections, **fields) -> "RopeSpec":
        """Ernie-4.5-VL's map of its config's sections (s_h, s_w, s_t), s_h == s_w: H and W
        alternate over the first s_h + s_w frequencies, T takes the last s_t (rows T, H, W)."""
        return cls(head_size, rotary_dim, sections=sections, layout="ernie45", **fields)

    @classmethod
    def two_row_interleaved(cls, head_size: int, rotary_dim: int, **fields) -> "RopeSpec":
        """HunyuanImage-3.0's 2-D map over rows (y, x): even frequencies y, odd ones x."""
        if not _is_int(rotary_dim):
            raise ValueError(f"rotary_dim={rotary_dim!r}: must be a positive int")
        return cls(head_size, rotary_dim, sections=row_maps.two_row_sections(rotary_dim // 2),
                   layout="two_row_interleaved", **fields)

    @classmethod
    def from_map(cls, freq_rows, *, head_size: int, num_dims: int | None = None, **fields) -> "RopeSpec":
        """Any map: ``freq_rows[i]`` is the position row of frequency i (rotary_dim = 2 x its
        length; num_dims: the rows, default the highest used + 1; each row must drive at least one
        frequency).  A map that is chunked comes back as the chunked spec (the same rotation)."""
        if isinstance(freq_rows, (str, bytes)) or not hasattr(freq_rows, "__len__"):
            raise ValueError(f"freq_rows={freq_rows!r}: must be a sequence of ints")
        rows = tuple(freq_rows)
        if not rows:
            raise ValueError("freq_rows=(): must give the row of at least one frequency")
        for i, r in enumerate(rows):
            if not _is_int(r) or not 0 <= r < MAX_NUM_DIMS:
                raise ValueError(f"freq_rows[{i}]={r!r}: must be a row index in [0, {MAX_NUM_DIMS})")
        if num_dims is None:
            num_dims = max(rows) + 1
        if not _is_int(num_dims) or not 1 <= num_dims <= MAX_NUM_DIMS:
            raise ValueError(f"num_dims={num_dims!r}: must be an int in [1, {MAX_NUM_DIMS}]")
        sections = row_maps.row_counts(rows, num_dims)
        if 0 in sections:
            raise ValueError(f"freq_rows: row {sections.index(0)} of num_dims={num_dims} drives no frequency "
                             f"(every row must drive at least one)")
        fields.setdefault("rotary_dim", 2 * len(rows))
        if rows == row_maps.chunked(sections):
            return cls(head_size, sections=None if num_dims == 1 else sections, layout="chunked", **fields)
        return cls(head_size, sections=sections, layout=CUSTOM, freq_rows=rows, **fields)

    # ------------------------------------------------------------------ checks
    def _validate(self) -> None:
        hs, rd = self.head_size, self.rotary_dim
        if not _is_int(hs) or hs <= 0:
            raise ValueError(f"head_size={hs!r}: must be a positive int")
        if hs > MAX_HEAD_SIZE:
            raise ValueError(f"head_size={hs}: must be at most {MAX_HEAD_SIZE}")
        if not _is_int(rd) or rd <= 0:
            raise ValueError(f"rotary_dim={rd!r}: must be a positive int")
        if rd % 2:
            raise ValueError(f"rotary_dim={rd}: must be even (got odd)")
        if rd > hs:
            raise ValueError(f"rotary_dim={rd}: must be <= head_size (head_size={hs})")
        if not isinstance(self.is_neox_style, bool):
            raise ValueError(f"is_neox_style={self.is_neox_style!r}: must be a bool")
        if not isinstance(self.layout, str) or self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r}: must be one of {LAYOUTS}")
        if self.freq_rows is not None and self.layout != CUSTOM:
            raise ValueError(f"freq_rows: given with layout={self.layout!r}, which derives the map from sections "
                             f"(freq_rows goes with layout='custom')")
        if self.sections is None:
            if self.layout != "chunked":
                raise ValueError(f"layout={self.layout!r}: needs sections (1-D RoPE has sections=None)")
        else:
            s = self.sections
            if not 1 <= len(s) <= MAX_NUM_DIMS:
                raise ValueError(f"sections={s}: must have 1 to {MAX_NUM_DIMS} rows (got {len(s)})")
            for x in s:
                if not _is_int(x) or x <= 0:
                    raise ValueError(f"sections={s}: every entry must be a positive int (got {x!r})")
            if sum(s) != rd // 2:
                raise ValueError(f"sections={s}: must sum to rotary_dim/2 = {rd // 2} (got {sum(s)})")
            want = LAYOUT_ROWS.get(self.layout)
            if want is not None and len(s) != want:
                raise ValueError(f"sections={s}: layout={self.layout!r} needs exactly {want} rows (got {len(s)})")
            rule = row_maps.layout_rule_error(self.layout, s)
            if rule:
                raise ValueError(f"sections={s}: {rule}")
            if self.layout == CUSTOM:
                self._validate_freq_rows()
        if isinstance(self.base, bool) or not isinstance(self.base, (int, float)) or not math.isfinite(self.base) or self.base <= 1:
            raise ValueError(f"base={self.base!r}: must be a finite number > 1")
        if not _is_int(self.max_position) or self.max_position <= 0:
            raise ValueError(f"max_position={self.max_position!r}: must be a positive int")
        if self.max_position > MAX_POSITION:
            raise ValueError(f"max_position={self.max_position}: must be at most {MAX_POSITION} "
                             f"(a cos/sin cache of {self.max_position} x {rd} elements is not allocated)")
        if self.ntk_alpha is not None:
            a = self.ntk_alpha
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a <= 0:
                raise ValueError(f"ntk_alpha={a!r}: must be a finite number > 0 or None")
            if self.sections is None:
                raise ValueError(f"ntk_alpha={a}: is XD-RoPE's, which has sections (1-D RoPE has sections=None)")
            if rd <= 2:
                raise ValueError(f"ntk_alpha={a}: needs rotary_dim > 2 (got rotary_dim={rd})")
            try:
                base = self.effective_base
            except OverflowError:
                base = math.inf
            if not math.isfinite(base) or base <= 1:
                raise ValueError(f"ntk_alpha={a}: makes the effective base {base:.3g} (base * ntk_alpha ** "
                                 f"(rotary_dim / (rotary_dim - 2))), which must be a finite number > 1, or the "
                                 f"cos/sin cache is not finite")
        if self.scaling is not None:
            self._validate_scaling()

    def _validate_scaling(self) -> None:
        """What a scaling's parameters mean for this spec's width (RopeScaling checks the values)."""
        s, rd, kind = self.scaling, self.rotary_dim, self.scaling.rope_type
        if self.ntk_alpha is not None:
            raise ValueError(f"scaling: rope_type={kind!r} given with ntk_alpha={self.ntk_alpha}, XD-RoPE's own "
                             f"base scaling: give one of them")
        for name in ("short_factor", "long_factor"):
            values = getattr(s, name)
            if values is not None and len(values) != self.num_freqs:
                raise ValueError(f"scaling.{name}: has {len(values)} entries, must have rotary_dim/2 = "
                                 f"{self.num_freqs} (one per frequency)")
        if kind == "proportional":
            if rd != self.head_size:
                raise ValueError(f"rotary_dim={rd}: proportional RoPE rotates the whole head, pairs (i, i + "
                                 f"head_size/2) (must equal head_size={self.head_size}; the rotating share is "
                                 f"scaling.partial_rotary_factor)")
            if int(s.partial_rotary_factor * self.head_size // 2) < 1:
                raise ValueError(f"scaling.partial_rotary_factor={s.partial_rotary_factor:g}: leaves no frequency "
                                 f"of head_size={self.head_size} rotating")
        if kind == "dynamic":
            if rd <= 2:
                raise ValueError(f"scaling: rope_type='dynamic' needs rotary_dim > 2 (got rotary_dim={rd})")
            length = max(self.max_position, s.original_max_position)
            try:
                grown = self.base * (s.factor * length / s.original_max_position - (s.factor - 1)) ** (rd / (rd - 2))
            except OverflowError:
                grown = math.inf
            if not grown <= torch.finfo(torch.float32).max:        # the cache raises it to a power in float32
                raise ValueError(f"scaling.factor={s.factor:g}: makes dynamic NTK's base at max_position="
                                 f"{self.max_position} overflow float32 (the cos/sin cache would not be finite)")

    def _validate_freq_rows(self) -> None:
        rows, secs = self.freq_rows, self.sections
        if rows is None:
            raise ValueError("freq_rows=None: layout='custom' needs the row of every frequency "
                             "(RopeSpec.from_map builds one from a map)")
        if len(rows) != self.num_freqs:
            raise ValueError(f"freq_rows: has {len(rows)} entries, must have rotary_dim/2 = {self.num_freqs}")
        for i, r in enumerate(rows):
            if not _is_int(r) or not 0 <= r < len(secs):
                raise ValueError(f"freq_rows[{i}]={r!r}: must be a row index in [0, {len(secs)}) "
                                 f"(sections has {len(secs)} rows)")
        counts = row_maps.row_counts(rows, len(secs))
        if counts != secs:
            raise ValueError(f"sections={secs}: must be the rows' frequency counts in freq_rows {counts} "
                             f"(every row drives at least one frequency)")

    # ------------------------------------------------------------- derived
    @property
    def num_dims(self) -> int:
        """Number of position rows: 1 for 1-D RoPE, else len(sections)."""
        return 1 if self.sections is None else len(self.sections)

    @property
    def num_freqs(self) -> int:
        return self.rotary_dim // 2

    @property
    def effective_base(self) -> float:
        """The base the cache is built from (dynamic NTK-alpha applied for XD-RoPE)."""
        if self.ntk_alpha is None:
            return float(self.base)
        rd = self.rotary_dim
        return float(self.base) * float(self.ntk_alpha) ** (rd / (rd - 2))

    def axis_map(self) -> tuple[int, ...]:
        """Row of the positions that drives each frequency i (length rotary_dim/2). docs/spec.md §2."""
        if self.sections is None or len(self.sections) == 1:
            return (0,) * self.num_freqs
        if self.layout == CUSTOM:
            return self.freq_rows
        return row_maps.named_map(self.layout, self.sections)

    def variant(self) -> str:
        """Short name of the variant, used in test ids and reports: ``interleaved-neox-partial``."""
        if self.sections is None:
            kind = "1d"
        elif self.layout in ("chunked", CUSTOM):
            kind = f"{self.layout}{self.num_dims}"
        else:
            kind = _VARIANT_KINDS[self.layout]
        parts = [kind, "neox" if self.is_neox_style else "gptj"]
        if self.rotary_dim < self.head_size:
            parts.append("partial")
        return "-".join(parts)

    def to_dict(self) -> dict:
        out = {
            "head_size": self.head_size,
            "rotary_dim": self.rotary_dim,
            "is_neox_style": self.is_neox_style,
            "sections": list(self.sections) if self.sections is not None else None,
            "layout": self.layout,
            "base": self.base,
            "max_position": self.max_position,
            "ntk_alpha": self.ntk_alpha,
        }
        if self.freq_rows is not None:      # layout "custom" only: older readers see no new key otherwise
            out["freq_rows"] = list(self.freq_rows)
        if self.scaling is not None:        # likewise: a plain spec's dictionary is what it always was
            out["scaling"] = self.scaling.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "RopeSpec":
        known = {"head_size", "rotary_dim", "is_neox_style", "sections", "layout", "base", "max_position", "ntk_alpha",
                 "freq_rows", "scaling"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"spec: unknown fields {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_hf_config(cls, config, layer_type: str | None = None, *, is_neox_style: bool | None = None,
                       layout: str | None = None, max_position: int | None = None) -> "RopeSpec":
        """The spec of a transformers config object or a config.json dict (rope/spec_hf.py says what
        is read): rope_parameters or rope_scaling, rope_theta, partial_rotary_factor, the head,
        mrope_section / mrope_interleaved, a multimodal model's text config.  ``layer_type``
        selects the layer type of a config that gives each its own rope parameters (Gemma 3's
        sliding_attention vs full_attention; a ValueError naming layer_type if it is needed and
        absent).  max_position: the positions the engine admits (max_position_embeddings, scaled
        where the rope type extends it) unless given; is_neox_style and layout override what the
        config implies (most configs do not state the pairing)."""
        from rope.spec_hf import spec_fields   # noqa: PLC0415 - rope.spec_hf reads configs; the spec does not need it
        return cls(**spec_fields(config, layer_type, is_neox_style=is_neox_style, layout=layout,
                                 max_position=max_position))


_VARIANT_KINDS = {"interleaved": "interleaved", "glm_round_robin": "glmrr", "ernie45": "ernie45",
                  "two_row_interleaved": "tworow"}


_POSITION_DTYPES = (torch.int64, torch.int32)

# Checks of tensor *values* (position ranges, request slots, lengths) read the values on the host.
# On the CPU they are there already; on a GPU reading them synchronizes with the device (about
# 130 us a call on an H200) and makes the call impossible to capture in a CUDA graph, so there the
# public entries check shapes, dtypes, devices and aliasing only, and the kernels stay in bounds
# whatever the values (docs/implementations.md).  ROPE_CHECK_VALUES=1 (the debug switch) checks the
# values on every device; 0 skips them on the CPU too.  Callers that pass check_values=True (the
# reference, native, the external adapters) check them whatever the switch says.
VALUE_CHECKS_ENV = "ROPE_CHECK_VALUES"


def checks_values(t: torch.Tensor) -> bool:
    """Whether a public entry validates the values of ``t`` (True on the CPU; on an accelerator
    only under ``ROPE_CHECK_VALUES=1``; never on meta tensors, which have none)."""
    kind = t.device.type
    if kind == "meta":
        return False
    switch = os.environ.get(VALUE_CHECKS_ENV, "")
    if switch:
        return switch not in ("0", "off", "false", "no")
    return kind == "cpu"


def check_rotation_inputs(spec: RopeSpec, positions, query, key, cos_sin_cache,
                          *, may_write: bool = True, check_values: bool | None = None) -> tuple[int, int, int]:
    """Validate the arguments of a rotation call; return (num_tokens, num_q_heads, num_kv_heads).

    Shared by the reference and every built-in implementation so that bad input is a
    ``ValueError`` naming the field, raised before any arithmetic or kernel launch.  With
    ``may_write`` (every implementation: the contract lets them rotate in place) query and key
    must not overlap themselves, each other, positions or the cache; the reference, which
    writes nothing, passes False and stays correct on aliased inputs.  ``check_values``: whether
    the position range is checked (it reads the positions on the host); None: :func:`checks_values`.
    """
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec={spec!r}: must be a RopeSpec")
    for name, t in (("positions", positions), ("query", query), ("cos_sin_cache", cos_sin_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}={type(t).__name__}: must be a torch.Tensor")
    if key is not None and not isinstance(key, torch.Tensor):
        raise ValueError(f"key={type(key).__name__}: must be a torch.Tensor or None")

    if positions.dtype not in _POSITION_DTYPES:
        raise ValueError(f"positions.dtype={positions.dtype}: must be torch.int64 or torch.int32")
    if spec.num_dims == 1:
        if positions.dim() != 1:
            raise ValueError(
                f"positions.shape={tuple(positions.shape)}: must be [num_tokens] for 1-D RoPE (got {positions.dim()} dims)")
    elif positions.dim() != 2 or positions.shape[0] != spec.num_dims:
        raise ValueError(
            f"positions.shape={tuple(positions.shape)}: must be [{spec.num_dims}, num_tokens] "
            f"for sections={spec.sections} (got {positions.dim()} dims)")
    num_tokens = positions.shape[-1]

    if not query.dtype.is_floating_point:
        raise ValueError(f"query.dtype={query.dtype}: must be floating point")
    if query.dim() != 2:
        raise ValueError(f"query.shape={tuple(query.shape)}: must be [num_tokens, num_q_heads * head_size]")
    if query.shape[0] != num_tokens:
        raise ValueError(f"query.shape={tuple(query.shape)}: must have num_tokens={num_tokens} rows like positions")
    if query.shape[1] == 0 or query.shape[1] % spec.head_size:
        raise ValueError(
            f"query.shape={tuple(query.shape)}: last dim must be a positive multiple of head_size={spec.head_size}")
    num_kv_heads = 0
    if key is not None:
        if key.dtype != query.dtype:
            raise ValueError(f"key.dtype={key.dtype}: must equal query.dtype={query.dtype}")
        if key.dim() != 2 or key.shape[0] != num_tokens:
            raise ValueError(f"key.shape={tuple(key.shape)}: must be [num_tokens={num_tokens}, num_kv_heads * head_size]")
        if key.shape[1] == 0 or key.shape[1] % spec.head_size:
            raise ValueError(
                f"key.shape={tuple(key.shape)}: last dim must be a positive multiple of head_size={spec.head_size}")
        num_kv_heads = key.shape[1] // spec.head_size

    if not cos_sin_cache.dtype.is_floating_point:
        raise ValueError(f"cos_sin_cache.dtype={cos_sin_cache.dtype}: must be floating point")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != spec.rotary_dim or cos_sin_cache.shape[0] == 0:
        raise ValueError(
            f"cos_sin_cache.shape={tuple(cos_sin_cache.shape)}: must be [>= 1, rotary_dim={spec.rotary_dim}]")

    devices = {("positions", positions.device), ("query", query.device), ("cos_sin_cache", cos_sin_cache.device)}
    if key is not None:
        devices.add(("key", key.device))
    if len({d for _, d in devices}) > 1:
        named = ", ".join(f"{n}.device={d}" for n, d in sorted(devices, key=lambda x: x[0]))
        raise ValueError(f"devices: all tensors must be on one device ({named})")
    if may_write:
        check_no_overlap({"query": query, "key": key},
                         {"positions": positions, "cos_sin_cache": cos_sin_cache})

    if check_values is None:
        check_values = checks_values(positions)
    if check_values:
        check_position_range(positions, cos_sin_cache.shape[0])
    return num_tokens, query.shape[1] // spec.head_size, num_kv_heads


def check_position_range(positions: torch.Tensor, rows: int) -> None:
    """Every position in [0, rows), the cache's rows (reads the values: a host sync on a GPU)."""
    if positions.numel():
        lo, hi = torch.stack(torch.aminmax(positions)).tolist()     # one host sync, not two
        if lo < 0 or hi >= rows:
            raise ValueError(
                f"positions=[{lo}..{hi}]: must lie in [0, {rows}) = cos_sin_cache rows (got min {lo}, max {hi})")


# ------------------------------------------------------------------ the runner's position step (§5)
_POSITION_INDEX_DTYPES = (torch.int32, torch.int64)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _check_index_vector(name, t, length=None):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}={type(t).__name__}: must be a torch.Tensor")
    if t.dtype not in _POSITION_INDEX_DTYPES:
        raise ValueError(f"{name}.dtype={t.dtype}: must be torch.int32 or torch.int64")
    if t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = f"[{length}]" if length is not None else "1-D"
        raise ValueError(f"{name}.shape={tuple(t.shape)}: must be {want}")


def check_position_inputs(prefill_positions, prefill_delta, idx_mapping, query_start_loc, prefill_lens,
                          num_computed_tokens, num_dims, *, check_values: bool | None = None) -> int | None:
    """Validate a position-step call; return the number of tokens of the step, or None when
    the values are not checked (``check_values`` False; None: :func:`checks_values`, so an
    accelerator without ROPE_CHECK_VALUES=1 gets shapes, dtypes and devices checked only)."""
    if not isinstance(num_dims, int) or isinstance(num_dims, bool) or not 1 <= num_dims <= 4:
        raise ValueError(f"num_dims={num_dims!r}: must be an int in [1, 4]")
    if not isinstance(prefill_positions, torch.Tensor) or prefill_positions.dtype not in _POSITION_INDEX_DTYPES:
        raise ValueError(f"prefill_positions: must be an int32/int64 tensor (got {getattr(prefill_positions, 'dtype', type(prefill_positions))})")
    if prefill_positions.dim() != 2 or prefill_positions.shape[0] % num_dims:
        raise ValueError(f"prefill_positions.shape={tuple(prefill_positions.shape)}: must be "
                         f"[max_reqs * num_dims, max_model_len] with num_dims={num_dims}")
    max_reqs, max_len = prefill_positions.shape[0] // num_dims, prefill_positions.shape[1]
    _check_index_vector("prefill_delta", prefill_delta, max_reqs)
    _check_index_vector("prefill_lens", prefill_lens, max_reqs)
    _check_index_vector("num_computed_tokens", num_computed_tokens, max_reqs)
    _check_index_vector("idx_mapping", idx_mapping)
    num_reqs = idx_mapping.shape[0]
    _check_index_vector("query_start_loc", query_start_loc, num_reqs + 1)
    devices = {t.device for t in (prefill_positions, prefill_delta, idx_mapping, query_start_loc,
                                  prefill_lens, num_computed_tokens)}
    if len(devices) > 1:
        raise ValueError(f"devices: all tensors must be on one device (got {sorted(map(str, devices))})")
    if not (checks_values(idx_mapping) if check_values is None else check_values):
        return None

    slots = idx_mapping.tolist()
    if any(not 0 <= r < max_reqs for r in slots):
        raise ValueError(f"idx_mapping={slots}: every slot must lie in [0, max_reqs={max_reqs})")
    if len(set(slots)) != len(slots):
        raise ValueError(f"idx_mapping={slots}: must not repeat a slot")
    qsl = query_start_loc.tolist()
    if qsl[0] != 0 or any(b < a for a, b in zip(qsl, qsl[1:])):
        raise ValueError(f"query_start_loc={qsl}: must start at 0 and never decrease")
    lens, computed, deltas = prefill_lens.tolist(), num_computed_tokens.tolist(), prefill_delta.tolist()
    for b, r in enumerate(slots):
        ql = qsl[b + 1] - qsl[b]
        if computed[r] < 0 or lens[r] < 0:
            raise ValueError(f"num_computed_tokens[{r}]={computed[r]}, prefill_lens[{r}]={lens[r]}: must be >= 0")
        if computed[r] < lens[r] and computed[r] + ql > max_len:
            raise ValueError(f"num_computed_tokens[{r}]={computed[r]}: prefill reads columns up to "
                             f"{computed[r] + ql - 1}, past max_model_len={max_len}")
        if computed[r] >= lens[r] and ql:
            # Decode positions nc + i + delta, computed exactly here: one past int64 would wrap.
            low, high = computed[r] + deltas[r], computed[r] + ql - 1 + deltas[r]
            if not (_INT64_MIN <= low and high <= _INT64_MAX):
                raise ValueError(f"prefill_delta[{r}]={deltas[r]}: decode positions {low}..{high} overflow int64")
    return qsl[-1]
