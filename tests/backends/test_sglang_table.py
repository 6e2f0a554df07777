"""SGLang's cos/sin table adapter (rope/backends/sglang/table.py): how a spec becomes get_rope's call
and which rows of SGLang's op it returns (no SGLang needed: its factory is stubbed), and, where SGLang
imports, its tables held to the reference: the catalogued models' match, and each divergence is
pinned both ways (SGLang's table fails the check where ours passes, and what SGLang builds is asserted)."""

from __future__ import annotations

import importlib
import math
import sys
import types

import pytest
import torch
from hypothesis import example, given

from properties.table.strategies import table_cases
from rope.harness.table.cases import TableCase
from rope.harness.table.check import check
from rope.models import load_models
from rope.spec import RopeSpec

MODELS = load_models()
SCALED = sorted(k for k, m in MODELS.items() if m.spec.scaling is not None)
_FACTORY = "sglang.srt.layers.rotary_embedding.factory"
_ADAPTER = "rope.backends.sglang.table"
# Phi-3-style LongRoPE at a small width: original length 4096, factor 2 (max_position_embeddings 8192).
LONGROPE = {"rope_type": "longrope", "factor": 2.0, "original_max_position": 4096,
            "short_factor": [1.0] * 4, "long_factor": [2.0, 3.0, 4.0, 5.0]}


def _import_stubbed():
    """(a fresh copy of the adapter imported with SGLang's factory stubbed, that stub factory): the
    adapter binds the factory at import only, so the modules, the package's ``table`` attribute and
    SGLang's CPU switch are restored at once and the real-SGLang tests import the real one."""
    import rope.backends.sglang as package
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(package, "table", None, raising=False)       # the import below rebinds it
        for name in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.rotary_embedding", _FACTORY):
            mp.setitem(sys.modules, name, types.ModuleType(name))
        factory = sys.modules[_FACTORY]
        mp.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
        mp.delitem(sys.modules, _ADAPTER, raising=False)
        module = importlib.import_module(_ADAPTER)
        del sys.modules[_ADAPTER]
    return module, factory


@pytest.fixture(scope="module")
def stubbed():
    return _import_stubbed()[0]


def test_a_spec_becomes_the_call_a_decoder_makes(stubbed):
    call = stubbed.sglang_rope_call
    assert call(MODELS["gpt-oss-120b"].spec) == {
        "rotary_dim": 64, "max_position": 131072, "base": 150000.0, "is_neox_style": True, "partial_rotary_factor": 1.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}}
    # Linear and dynamic: SGLang admits max_position_embeddings x factor, so the config held the quotient.
    assert call(MODELS["gemma-3-27b-full"].spec)["max_position"] == 131072 // 8
    dynamic = RopeSpec(128, 96, max_position=8192, scaling={"rope_type": "dynamic", "factor": 2.0,
                                                            "original_max_position": 4096})
    assert call(dynamic)["max_position"] == 4096 and call(dynamic)["rotary_dim"] == 96
    # M-RoPE with YaRN (Qwen3.5's) goes to YaRNScalingMRotaryEmbedding, its map as the config names it.
    qwen = call(MODELS["qwen3.5-27b-yarn"].spec)
    assert qwen["rope_scaling"]["mrope_section"] == [11, 11, 10] and qwen["rope_scaling"]["mrope_interleaved"] is True
    assert qwen["rotary_dim"] == 64 and qwen["rope_scaling"]["rope_type"] == "yarn"
    # Proportional (Gemma 4): the type alone, the whole head, the rotating share as partial_rotary_factor.
    gemma = call(MODELS["gemma-4-26b-a4b-full"].spec)
    assert gemma["rope_scaling"] == {"rope_type": "proportional"}
    assert (gemma["rotary_dim"], gemma["partial_rotary_factor"]) == (512, 0.25)
    # LongRoPE: max_position_embeddings = original x factor (SGLang derives the attention factor from it).
    assert call(MODELS["phi-3.5-mini"].spec)["max_position"] == 4096 * 32
    # The plain table, and a plain M-RoPE one (MRotaryEmbedding).
    assert call(RopeSpec(64, 64, max_position=4096))["rope_scaling"] is None
    assert call(RopeSpec(128, 128, sections=(16, 24, 24), max_position=4096))["rope_scaling"] == {
        "rope_type": "default", "mrope_section": [16, 24, 24]}


def _with_examples(test):
    """Every catalogued scaled model, a plain M-RoPE spec, vLLM's NTK (a reason) and LongRoPE one past
    its original length as explicit examples."""
    for key in SCALED:
        test = example(case=TableCase(MODELS[key].spec, MODELS[key].spec.max_position))(test)
    for spec in (RopeSpec(128, 128, sections=(16, 24, 24), max_position=4096),
                 RopeSpec(128, 128, max_position=16384, scaling={"rope_type": "ntk", "factor": 4.0}),
                 RopeSpec(8, 8, max_position=4097, scaling=LONGROPE)):
        test = example(case=TableCase(spec, spec.max_position))(test)
    return test


@given(case=table_cases())
@_with_examples
def test_every_drawn_spec_is_a_call_sglang_reads_back_or_a_reason(stubbed, case):
    """What get_rope reads of the call gives back the spec: the width, the base, the pairs, the length
    SGLang admits, every scaling parameter under SGLang's name, the map for 3-row M-RoPE only."""
    spec, s = case.spec, case.spec.scaling
    if stubbed.cos_sin_table_sglang.unsupported_reason(spec, case.dtype, "cpu") is not None:
        return
    call = stubbed.sglang_rope_call(spec)
    scaling = call["rope_scaling"] or {}
    proportional = scaling.get("rope_type") == "proportional"
    rotating = int(spec.head_size * s.partial_rotary_factor) if proportional else spec.rotary_dim
    assert int(call["rotary_dim"] * call["partial_rotary_factor"]) == rotating
    assert (call["base"], call["is_neox_style"]) == (spec.base, spec.is_neox_style)
    kind = "default" if s is None else s.rope_type
    if kind in ("linear", "dynamic"):
        assert call["max_position"] * s.factor == spec.max_position
    elif kind == "longrope":
        assert call["max_position"] == s.original_max_position * s.factor >= spec.max_position
    else:
        assert call["max_position"] == spec.max_position
    if kind not in ("default", "proportional"):
        names = {"original_max_position": "original_max_position_embeddings"}
        assert {names.get(k, k): list(v) if isinstance(v, tuple) else v
                for k, v in s.to_dict().items()}.items() <= scaling.items()
    three_rows = spec.sections is not None and len(spec.sections) == 3 and spec.layout in ("chunked", "interleaved")
    assert ("mrope_section" in scaling) == three_rows


def test_what_get_rope_cannot_build_is_unsupported_with_the_reason(stubbed):
    reason = stubbed.cos_sin_table_sglang.unsupported_reason
    f32 = torch.float32
    assert "no 'ntk' rope type" in reason(RopeSpec(64, 64, max_position=8192, scaling={
        "rope_type": "ntk", "factor": 2.0}), f32, "cpu")
    assert "no max_position_embeddings gives 10001" in reason(RopeSpec(128, 128, max_position=10001, scaling={
        "rope_type": "linear", "factor": 4.0}), f32, "cpu")
    assert "not original_max_position = 2048" in reason(RopeSpec(64, 64, max_position=8192, scaling={
        "rope_type": "dynamic", "factor": 2.0, "original_max_position": 2048}), f32, "cpu")
    assert "NeoX" in reason(RopeSpec(8, 8, False, max_position=8192, scaling=LONGROPE), f32, "cpu")
    assert "past max_position_embeddings" in reason(RopeSpec(8, 8, max_position=8193, scaling=LONGROPE), f32, "cpu")
    assert "short_mscale" in reason(RopeSpec(8, 8, max_position=8192, scaling={**LONGROPE, "attention_factor": 1.2}),
                                    f32, "cpu")
    assert "factor 1 only" in reason(RopeSpec(64, 64, max_position=8192, scaling={
        "rope_type": "proportional", "factor": 8.0}), f32, "cpu")
    assert "TypeError" in reason(RopeSpec(128, 128, sections=(16, 24, 24), max_position=16384, scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position": 4096, "mscale": 1.0, "mscale_all_dim": 1.0}),
        f32, "cpu")
    assert "XD-RoPE" in reason(MODELS["hunyuan-ocr"].spec, f32, "cpu")
    for key in SCALED:
        assert reason(MODELS[key].spec, f32, "cpu") is None, key
    with pytest.raises(ValueError, match="unsupported by SGLang's get_rope"):
        stubbed.cos_sin_table_sglang(RopeSpec(64, 64, max_position=8192, scaling={"rope_type": "ntk", "factor": 2.0}),
                                     16, f32)


class _Op:
    """A stand-in op: ``cos_sin_cache`` row p is p in every column; the extension appends rows."""

    def __init__(self, rows: int, width: int):
        self.cos_sin_cache = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, width).clone()
        self.reserved = None

    def _ensure_cos_sin_cache_length(self, needed_max_pos: int):
        self.reserved = needed_max_pos
        rows, width = self.cos_sin_cache.shape
        if needed_max_pos >= rows:
            extra = torch.arange(rows, needed_max_pos + 1, dtype=torch.float32)[:, None].expand(-1, width)
            self.cos_sin_cache = torch.cat((self.cos_sin_cache, extra))


class _LongRope:
    """A stand-in LongRoPE op: short rows hold -1 - p, long rows p."""

    def __init__(self, original: int, rows: int, width: int):
        self.original_max_position_embeddings = original
        short = -1.0 - torch.arange(original, dtype=torch.float32)
        long = torch.arange(rows, dtype=torch.float32)
        self.long_short_cos_sin_cache = torch.cat((short, long))[:, None].expand(-1, width).clone()


@pytest.fixture
def fake_get_rope():
    """A fresh stubbed adapter whose get_rope returns ``ops[-1]``, recording its calls."""
    adapter, factory = _import_stubbed()
    calls, ops = [], []

    def get_rope(head_size, **kwargs):
        calls.append((head_size, kwargs))
        return ops[-1]
    factory.get_rope, factory._ROPE_DICT = get_rope, {}
    return adapter, calls, ops


def test_the_table_is_the_ops_cache_extended_as_the_runner_extends_it(fake_get_rope):
    adapter, calls, ops = fake_get_rope
    table = adapter.cos_sin_table_sglang
    spec = RopeSpec(64, 64, max_position=4096, scaling={"rope_type": "linear", "factor": 4.0})
    ops.append(_Op(4096, 64))
    got = table(spec, 100, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (100, 64) and got[:, 0].tolist() == list(range(100))
    assert calls == [(64, {"dtype": torch.bfloat16, **adapter.sglang_rope_call(spec)})]
    assert ops[-1].reserved == 4095                       # the context: the admitted length
    ops.append(_Op(4096, 64))      # asked for more rows than admitted: the runner's reserve to that context
    got = table(spec, 6000, torch.float32)
    assert ops[-1].reserved == 5999 and got.shape == (6000, 64) and got[-1, 0] == 5999


@pytest.mark.parametrize("served, offset", [(4096, 0), (4097, 0), (4098, 4096), (8192, 4096)])
def test_longrope_rows_are_those_a_batch_reaching_the_served_length_reads(fake_get_rope, served, offset):
    """Phi3LongRoPEScaledRotaryEmbedding.forward offsets by the short rows when a position > original."""
    adapter, _, ops = fake_get_rope
    ops.append(_LongRope(4096, 8192, 8))
    got = adapter.cos_sin_table_sglang(RopeSpec(8, 8, max_position=served, scaling=LONGROPE), served, torch.float32)
    assert got.shape == (served, 8)
    expected = torch.cat((-1.0 - torch.arange(4096.0), torch.arange(8192.0)))[offset:offset + served]
    assert torch.equal(got[:, 0], expected)


# ---- SGLang itself (skipped where it does not import: scripts/sglang_cpu_site.sh on a CPU box) ----


def _sglang():
    """(SGLang's table implementation, its factory); the adapter first, as it sets SGLang's CPU switch."""
    pytest.importorskip(_ADAPTER, exc_type=ImportError,
                        reason="SGLang is not installed: pip install sglang, or PYTHONPATH=SITE after "
                               "scripts/sglang_cpu_site.sh SITE on a CPU box")
    from rope.registry import get_table_implementation
    return get_table_implementation("sglang"), importlib.import_module(_FACTORY)


def _ours():
    from rope.registry import get_table_implementation
    return get_table_implementation("ours")


@pytest.mark.parametrize("key", SCALED)
def test_sglang_tables_of_catalogued_models_match(key):
    fn, _ = _sglang()
    spec = MODELS[key].spec
    result = check(fn, TableCase(spec, spec.max_position, torch.float32), "cpu")
    assert result.ok, result


def _pinned(case: TableCase, label: str):
    """SGLang's table of the case fails with ``label`` where ours passes; SGLang's table returned."""
    fn, _ = _sglang()
    assert check(_ours(), case, "cpu").ok
    result = check(fn, case, "cpu")
    assert not result.ok and result.mismatch.label == label, result
    return fn(case.spec, case.max_position, case.dtype, "cpu")


def test_sglang_longrope_at_one_past_the_original_length_reads_short_rows_and_long_row_0():
    """A batch whose largest position is the original length L0 takes no offset (SGLang switches on
    p > L0, transformers on p + 1 > L0): rows 0 .. L0 - 1 are the short table's and row L0 is the
    long table's row 0, angle 0 at the attention factor."""
    spec = RopeSpec(8, 8, max_position=4097, scaling=LONGROPE)
    table = _pinned(TableCase(spec, 4097, torch.float32), "frequencies_wrong")
    m = math.sqrt(1 + math.log(2.0) / math.log(4096))
    short = RopeSpec(8, 8, max_position=4096, scaling=LONGROPE)
    assert torch.equal(table[:4096], _sglang()[0](short, 4096, torch.float32))
    torch.testing.assert_close(table[4096], torch.tensor([m] * 4 + [0.0] * 4), rtol=0, atol=0)
    assert check(_sglang()[0], TableCase(RopeSpec(8, 8, max_position=4098, scaling=LONGROPE), 4098), "cpu").ok


def test_sglang_yarn_drops_the_configs_attention_factor():
    """get_rope passes YaRN only extrapolation_factor, attn_factor, beta_*, mscale, mscale_all_dim:
    an attention_factor is dropped and the magnitude is 0.1 ln s + 1."""
    spec = RopeSpec(64, 64, max_position=131072, scaling={"rope_type": "yarn", "factor": 32.0,
                                                          "original_max_position": 4096, "attention_factor": 1.2})
    table = _pinned(TableCase(spec, 131072, torch.float32), "values_wrong")
    assert table[0, 0].item() == pytest.approx(0.1 * math.log(32.0) + 1, rel=1e-6)


def test_sglang_yarn_reads_an_mscale_pair_with_a_zero():
    """YaRNScalingRotaryEmbedding takes the ratio g(s, mscale) / g(s, mscale_all_dim) whenever both are
    given; transformers only when both are non-zero, else g(s, 1)."""
    spec = RopeSpec(64, 64, max_position=131072, scaling={"rope_type": "yarn", "factor": 32.0,
                                                          "original_max_position": 4096, "mscale": 0.707,
                                                          "mscale_all_dim": 0.0})
    table = _pinned(TableCase(spec, 131072, torch.float32), "values_wrong")
    assert table[0, 0].item() == pytest.approx(0.1 * 0.707 * math.log(32.0) + 1, rel=1e-6)


@pytest.mark.parametrize("rope_type", ["linear", "dynamic"])
def test_sglang_extends_linear_and_dynamic_tables_with_unscaled_rows(rope_type):
    """The runner's reserve past the built length (a context set past the config's) appends rows from
    the base class's extension: the plain frequencies, unscaled."""
    fields = {"rope_type": rope_type, "factor": 4.0}
    if rope_type == "dynamic":
        fields["original_max_position"] = 1024
    spec = RopeSpec(64, 64, max_position=4096, scaling=fields)
    assert check(_sglang()[0], TableCase(spec, 4096), "cpu").ok
    table = _pinned(TableCase(spec, 8192, torch.float32), "frequencies_wrong")
    plain = 10000.0 ** -(torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    torch.testing.assert_close(table[5000, :32].double(), (5000 * plain).cos(), rtol=0, atol=1e-3)


def test_sglang_mrope_yarn_refuses_an_mscale_pair():
    """The declared reason: get_rope hands YaRNScalingMRotaryEmbedding mscale, which it does not take."""
    _, factory = _sglang()
    with pytest.raises(TypeError, match="mscale"):
        factory.get_rope(128, 128, 16384, 1e4, True, {"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 4096, "mscale": 1.0,
                                                      "mscale_all_dim": 1.0, "mrope_section": [16, 24, 24]},
                         torch.float32)
    factory._ROPE_DICT.clear()
