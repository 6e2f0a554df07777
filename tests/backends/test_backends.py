"""External implementations (rope/backends) against the reference, each one that imports here.

``pytest --rope-impl liger`` runs the whole suite against one adapter; this module is the bounded CI
slice of that for every installed backend at once: the rotation property per (dtype, kind, pairing),
drawing only cases the backend supports (``assume``: a skip inside ``@given`` would end the test at the
first unsupported draw), the known-bug triggers, and adapter-level checks that the layout conversions
are what the external code expects (they can fail: a wrong transpose or cos layout is caught).
A backend whose package is missing is skipped with the import error and the install command.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import reference
from rope.harness.rotation.check import assert_matches_reference
from properties.known_cases import KNOWN_BUG_CASES
from properties.strategies import DTYPE_SHORT, DTYPES, KINDS, MAPPED_LAYOUTS, RotationCase, probe_specs, rotation_cases
from rope.backends import BACKENDS
from rope.backends.known_faults import FLASHINFER_WRONG_SHAPES, flashinfer_wrong
from rope.registry import get_implementation, known_defect, unsupported_reason
from rope.harness.rotation.case_file import load_case
from rope.spec import RopeSpec

pytestmark = pytest.mark.stack      # meets the installed torch and Triton: CI runs it on every stack (.ci/run)

KNOWN_MISMATCH = (
    "known mismatch: transformers HunYuanVL (5.13+) splits the head into blocks of 2*s_i, so the two "
    "channels of a NeoX pair take different position rows for image tokens (docs/spec.md §2; "
    "tests/reference/regressions/hunyuan_vl-block-layout.json)")

NAMES = sorted(BACKENDS)
REGRESSIONS = Path(__file__).parent / "regressions"
CASE_FILES = sorted(REGRESSIONS.glob("*/*.json"))

# Known mismatches of a backend: backend -> the specs it diverges on (KNOWN_MISMATCH).  The property
# then draws text tokens only there (all rows equal: where the layouts agree); the pinned case files
# replay as strict xfail.  transformers runs XD-RoPE (4 rows, or an NTK alpha) through HunYuanVL.
KNOWN_MISMATCHES = {
    "transformers": lambda spec: spec.num_dims == 4 or spec.ntk_alpha is not None,
}
# The adapters declare their measured defects (rope/backends/known_faults.py: FlashInfer's wrong
# shapes, whatever the positions; the 0-token raises below): the property draws around them,
# test_backend_known_wrong_shapes_still_mismatch and test_backend_empty_batch_raises pin them (strict),
# and test_adapters_declare_the_pinned_defects checks that the declarations cover what is pinned.
# forward_native does query.view(num_tokens, -1, head_size): with 0 tokens the -1 is ambiguous and it
# raises (SGLang's forward_cuda returns early on 0 tokens; vLLM's Triton path copes); FlashInfer's
# apply_rope_with_cos_sin_cache reshapes the same way before its kernel.
EMPTY_BATCH_RAISES = {
    "vllm-native": "known mismatch: vLLM 0.33.0 MRotaryEmbedding.forward_native raises on 0 tokens",
    "vllm-cuda": "known mismatch: vLLM 0.33.0 MRotaryEmbedding.forward_cuda ([T] positions) raises on 0 tokens",
    "sglang": "known mismatch: SGLang 0.5.23 MRotaryEmbedding.forward_native raises on 0 tokens",
    "flashinfer": "known mismatch: FlashInfer 0.7.4 apply_rope_with_cos_sin_cache raises on 0 tokens",
}
KNOWN_BUG_XFAIL = {("transformers", "xdrope-4rows-hunyuanocr"): KNOWN_MISMATCH}


def backend_or_skip(name: str):
    try:
        return get_implementation(name)
    except ValueError as exc:
        pytest.skip(f"{name} not installed here: {exc}")


def _probes(kind: str, neox: bool) -> list[RopeSpec]:
    """The plainest specs of a kind (head 64, whole head rotates; kind "mapped": one per layout): a
    backend that runs none of them cannot run the kind."""
    if kind == "mapped":
        return [s for s in probe_specs("mapped", neox) if s.head_size == s.rotary_dim == 64]
    sections = {"1d": None, "chunked1": (32,), "chunked3": (16, 8, 8), "chunked4": (8, 8, 8, 8),
                "interleaved": (12, 10, 10)}[kind]
    return [RopeSpec(64, 64, neox, sections, "interleaved" if kind == "interleaved" else "chunked")]


@pytest.mark.parametrize("is_neox_style", [pytest.param(True, id="neox"), pytest.param(False, id="gptj")])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", list(DTYPES), ids=[DTYPE_SHORT[d] for d in DTYPES])
@pytest.mark.parametrize("backend", NAMES)
@settings(suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data())
def test_backend_rotation_matches_reference(backend, device, dtype, kind, is_neox_style, data):
    impl = backend_or_skip(backend)
    probes = _probes(kind, is_neox_style)
    reasons = {p.layout: unsupported_reason(backend, impl, p, DTYPES[dtype], device) for p in probes}
    if all(reasons.values()):
        pytest.skip("; ".join(dict.fromkeys(reasons.values())))
    layouts = tuple(x for x in MAPPED_LAYOUTS if x in reasons and reasons[x] is None) or MAPPED_LAYOUTS
    case = data.draw(rotation_cases(dtype=dtype, kind=kind, is_neox_style=is_neox_style, nonfinite=True,
                                    layouts=layouts), label="case")
    if KNOWN_MISMATCHES.get(backend, lambda spec: False)(case.spec):
        assume(case.positions_kind == "text")
    assume(known_defect(backend, impl, case.spec, case.num_tokens, DTYPES[dtype], device, num_heads=case.num_q_heads,
                        num_kv_heads=case.num_kv_heads) is None)
    assume(unsupported_reason(backend, impl, case.spec, DTYPES[dtype], device) is None)
    assert_matches_reference(backend, impl, case, device)


@pytest.mark.parametrize("bug", list(KNOWN_BUG_CASES))
@pytest.mark.parametrize("backend", NAMES)
def test_backend_known_bug_triggers(backend, device, bug):
    impl = backend_or_skip(backend)
    case = KNOWN_BUG_CASES[bug]
    why = unsupported_reason(backend, impl, case.spec, DTYPES[case.dtype], device)
    if why:
        pytest.skip(why)
    # A declared defect (rope/backends/known_faults.py) on this trigger is pinned both ways: the call
    # must still fail (an upstream fix shows here), and the test reports the declaration.
    defect = known_defect(backend, impl, case.spec, case.num_tokens, DTYPES[case.dtype], device,
                          num_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads)
    if (backend, bug) in KNOWN_BUG_XFAIL or defect:
        with pytest.raises(AssertionError, match="does not match the reference"):
            assert_matches_reference(backend, impl, case, device)
        pytest.xfail(KNOWN_BUG_XFAIL.get((backend, bug)) or defect)
    assert_matches_reference(backend, impl, case, device)


def test_backend_case_files_load_and_are_filed_right():
    # Every pinned case file loads here (the replay below needs the backend installed), is filed under
    # the implementation it pins, and the FlashInfer ones lie inside the region its predicates call
    # wrong (so the bounded property's assume() keeps off exactly what is pinned).
    from rope.backends import known_faults
    assert {p.parent.name for p in CASE_FILES} >= {"flashinfer", "liger", "sglang-triton", "transformers", "vllm-cuda"}
    for path in CASE_FILES:
        loaded = load_case(path)
        assert loaded.implementation == path.parent.name, path
        if loaded.implementation == "flashinfer":
            assert flashinfer_wrong(loaded.case.spec), path
            assert loaded.device == "cuda" and loaded.case.dtype in ("float16", "bfloat16"), path
        declaration = {"vllm-cuda": known_faults.vllm_triton_mrope_defect,
                       "liger": known_faults.liger_mrope_defect}.get(loaded.implementation)
        if declaration is not None:     # a ptxas defect: inside the declaration, where it was measured
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(known_faults, "cuda_capability", lambda device: (9, 0))
                mp.setattr(known_faults, "triton_ptxas_version", lambda: (12, 8, 93))
                case = loaded.case
                assert declaration(case.spec, case.num_tokens, DTYPES[case.dtype], "cuda",
                                   num_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads), path
            assert loaded.record["versions"]["triton"] == "3.6.0", path


@pytest.mark.parametrize("path", CASE_FILES, ids=[f"{p.parent.name}-{p.stem}" for p in CASE_FILES])
def test_backend_regression_still_mismatches(device, path, monkeypatch, tmp_path):
    # A pinned mismatch of an external implementation (tests/backends/regressions/<backend>/):
    # strict, so an upstream fix fails here and the pin is revisited.  The mismatch is the point:
    # it stays out of the run report (a green run says 0 failed).
    from rope.harness import report
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    monkeypatch.setenv(report.DISABLE_ENV, "1")
    backend = path.parent.name
    impl = backend_or_skip(backend)
    loaded = load_case(path)
    assert loaded.implementation == backend, f"{path}: pins {loaded.implementation}, filed under {backend}"
    why = unsupported_reason(backend, impl, loaded.case.spec, DTYPES[loaded.case.dtype], device)
    if why:
        pytest.skip(why)
    case = loaded.case
    if getattr(impl, "known_defect", None) is not None and not known_defect(
            backend, impl, case.spec, case.num_tokens, DTYPES[case.dtype], device, num_heads=case.num_q_heads,
            num_kv_heads=case.num_kv_heads):
        # A defect that depends on more than the backend's version (vLLM's triton_mrope: the ptxas
        # Triton compiles with, the GPU) replays where its declaration says it holds.
        pytest.skip(f"{path.name}: the pinned defect's conditions do not hold here (declared by the adapter)")
    if loaded.diagnosis.label == "out_of_bounds_read":
        # Right values, reads outside the inputs (e.g. SGLang's padding-lane cos/sin loads, docs/spec.md §7.2):
        # only the interpreter's memory tracer sees them (on a GPU: compute-sanitizer).
        from rope.harness.rotation.guards import assert_matches_reference_traced
        from rope.devices import is_interpreter
        if device != "cpu" or not is_interpreter():
            pytest.skip(f"{path.name} pins an out-of-bounds read: needs the Triton interpreter's memory tracer")
        with pytest.raises(AssertionError, match="does not match the reference(.|\n)*memory violation: .* read"):
            assert_matches_reference_traced(backend, impl, loaded.case, device)
        return
    with pytest.raises(AssertionError, match="does not match the reference"):
        assert_matches_reference(backend, impl, loaded.case, device)


def test_sglang_native_glm_map_is_the_interleaved_one(device):
    # The finding pinned both ways (docs/findings.md): SGLang 0.5.23's forward_native, asked for the
    # GLM round-robin map, rotates exactly by the interleaved map of the same sections, and so
    # differs from the reference wherever the two maps differ ([8, 12, 12]) and agrees where they
    # do not ([24, 20, 20]).  A fix upstream fails the first assertion.
    impl = backend_or_skip("sglang")
    glm = RopeSpec.glm_round_robin(64, 64, (8, 12, 12), max_position=64)
    why = unsupported_reason("sglang", impl, glm, torch.float32, device)
    if why:
        pytest.skip(why)
    case = RotationCase(glm, 7, 2, 1, "float32", "uniform", False, 3)
    with pytest.raises(AssertionError, match="diagnosis: axis_map_wrong: the output matches the reference with "
                                             "layout='interleaved' instead of 'glm_round_robin'"):
        assert_matches_reference("sglang", impl, case, device)
    same = RopeSpec.glm_round_robin(128, 128, (24, 20, 20), max_position=64)
    assert same.axis_map() == RopeSpec.interleaved(128, 128, (24, 20, 20)).axis_map()
    assert_matches_reference("sglang", impl, RotationCase(same, 7, 2, 1, "float32", "uniform", False, 3), device)


@pytest.mark.parametrize("backend", sorted(EMPTY_BATCH_RAISES))
def test_backend_empty_batch_raises(backend, device):
    impl = backend_or_skip(backend)
    spec = RopeSpec(64, 64, True, None)
    dtype = torch.bfloat16 if backend == "flashinfer" else torch.float32
    why = unsupported_reason(backend, impl, spec, dtype, device)
    if why:
        pytest.skip(why)
    from rope.cache import cos_sin_cache
    from rope.devices import torch_device
    cache = cos_sin_cache(spec, torch.float32, torch_device(device))
    empty = torch.empty(0, 64, dtype=dtype, device=torch_device(device))
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        impl(spec, torch.empty(0, dtype=torch.long, device=empty.device), empty, empty.clone(), cache)
    pytest.xfail(EMPTY_BATCH_RAISES[backend])


# ------------------------------------------------------------------------ layout conversions
def _liger_or_skip():
    """rope.backends.liger, or a skip naming the install command.  (pytest.importorskip skips only
    ModuleNotFoundError since pytest 8.2/9; the adapter raises ImportError with the hint.)"""
    try:
        import rope.backends.liger as liger
    except ImportError as exc:
        pytest.skip(f"liger-kernel not installed: {exc}")
    return liger


def test_liger_layout_round_trip():
    liger = _liger_or_skip()
    x = torch.arange(5 * 3 * 8, dtype=torch.float32).reshape(5, 24)       # 5 tokens, 3 heads of 8
    heads = liger.to_liger(x, 8)
    assert heads.shape == (1, 3, 5, 8)
    assert torch.equal(heads[0, 2, 4], x[4, 16:24])                           # head 2 of token 4
    assert heads.transpose(1, 2).is_contiguous()                              # what the kernel indexes
    assert torch.equal(liger.from_liger(heads), x)


def test_liger_cos_sin_are_per_row_cat_halves():
    liger = _liger_or_skip()
    cache = torch.arange(10 * 4, dtype=torch.float32).reshape(10, 4)          # rows p: cos p | sin p
    positions = torch.tensor([[1, 2], [3, 4], [5, 6]])
    cos, sin = liger.liger_cos_sin(cache, positions)
    assert cos.shape == sin.shape == (3, 1, 2, 4)
    assert cos[1, 0, 1].tolist() == [16.0, 17.0, 16.0, 17.0]                  # row h, token 1: position 4
    assert sin[2, 0, 0].tolist() == [22.0, 23.0, 22.0, 23.0]                  # row w, token 0: position 5


def test_a_wrong_layout_conversion_is_caught():
    # The adapter with the tokens and heads of the [B, heads, L, D] view swapped: the property must fail.
    liger = _liger_or_skip()
    from rope.devices import gpu_backend, torch_device
    dev = torch_device(gpu_backend() or "cpu")     # Liger is Triton: the GPU, or the interpreter on the CPU
    spec = RopeSpec(16, 16, True, (4, 2, 2), "chunked", max_position=64)
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 64, (3, 4), generator=g)
    q, k = torch.randn(4, 2 * 16, generator=g), torch.randn(4, 16, generator=g)
    from rope.cache import cos_sin_cache
    cache = cos_sin_cache(spec, torch.float32)
    ref_q, _ = reference.rotate(spec, positions, q, k, cache)
    cos, sin = liger.liger_cos_sin(cache.to(dev), positions.to(dev))
    wrong = q.clone().to(dev).reshape(1, 2, 4, 16)                            # heads-major, not token-major
    out, _ = liger._mrope.liger_multimodal_rotary_pos_emb(wrong, liger.to_liger(k.clone().to(dev), 16), cos, sin,
                                                          [4, 2, 2])
    assert not torch.allclose(out.reshape(4, 32).double().cpu(), ref_q)
    good_q, _ = liger.rotate_liger(spec, positions.to(dev), q.clone().to(dev), k.clone().to(dev), cache.to(dev))
    assert torch.allclose(good_q.double().cpu(), ref_q, atol=1e-5)


def test_missing_backend_names_its_package():
    # The registry's message for an absent package names it and the install command.
    for name in ("flashinfer", "sglang", "vllm-native"):
        try:
            get_implementation(name)
        except ValueError as exc:
            assert "install it with" in str(exc) and name.split("-")[0].split("_")[0] in str(exc).lower()


FLASHINFER_MAP = Path(__file__).parent / "data" / "flashinfer-map-h200-2026-11-29.json"


@pytest.mark.skipif(not FLASHINFER_MAP.is_file(), reason="the H200 map is repository data (tests/backends/data/), not in an installed suite")
def test_flashinfer_predicates_match_the_h200_map():
    # The predicates the properties draw around (faults) and keep the bounded property off (wrong
    # values) against every shape measured on the H200 (lab/bench/flashinfer_probe.py --map: 660 shapes,
    # every head size the properties draw, every even rotary_dim, bf16 and fp16).  A predicate that
    # grew would hide working shapes; one that shrank would crash the worker or fail the property.
    import json
    from rope.backends.known_faults import flashinfer_expected
    records = json.loads(FLASHINFER_MAP.read_text())["records"]
    assert len(records) == 660
    race = {"wrong": 0, "ok": 0}
    for r in records:
        expected = flashinfer_expected(RopeSpec(r["head_size"], r["rotary_dim"], r["style"] == "neox", None))
        where = f"head {r['head_size']} rotary_dim {r['rotary_dim']} {r['style']} {r['dtype']}: {r['detail']}"
        if expected == "race":
            race[r["measured"]] += 1          # a KeyError here: a race that faulted
        else:
            assert r["measured"] == expected, where
    # The race is real both ways on this machine: garbage landed last on some shapes, the copy on others.
    assert race["wrong"] >= 20 and race["ok"] >= 20, race
    for head, rd, neox in FLASHINFER_WRONG_SHAPES:   # the pinned shapes were measured wrong in both dtypes
        assert {r["measured"] for r in records if (r["head_size"], r["rotary_dim"], r["style"] == "neox")
                == (head, rd, neox)} == {"wrong"}, (head, rd, neox)


@pytest.mark.parametrize("shape", FLASHINFER_WRONG_SHAPES, ids=lambda s: f"head{s[0]}-rd{s[1]}-{'neox' if s[2] else 'gptj'}")
def test_backend_known_wrong_shapes_still_mismatch(shape, device):
    # FlashInfer's measured wrong values, through the harness: strict, so a fixed FlashInfer fails
    # here and the pin is revisited.  On a failure the case file lands in ROPE_CASES_DIR (default
    # reports/cases): the file to attach upstream / copy to tests/backends/regressions/flashinfer/.
    impl = backend_or_skip("flashinfer")
    head, rd, neox = shape
    case = RotationCase(spec=RopeSpec(head, rd, neox, None), num_tokens=5, num_q_heads=2, num_kv_heads=1,
                        dtype="bfloat16", positions_kind="uniform")
    why = unsupported_reason("flashinfer", impl, case.spec, DTYPES[case.dtype], device)
    if why:
        pytest.skip(why)
    with pytest.raises(AssertionError, match="does not match the reference"):
        assert_matches_reference("flashinfer", impl, case, device)
    pytest.xfail(f"known mismatch: FlashInfer 0.7.4 returns wrong values for {shape} (docs/upstream-flashinfer-rope-shapes.md)")


def _fake_backend(calls: list):
    from rope.backends import declare

    def fake(spec, positions, query, key, cache):
        calls.append(spec.rotary_dim)
        return query, key

    return declare(fake, working_precision="float32",
                   reason=lambda spec, dtype, device: "1-D only" if spec.num_dims != 1 else None,
                   fault=lambda spec, dtype, device: "faults" if spec.rotary_dim == 40 else None)


def test_known_fault_is_drawn_around_and_reported():
    # A declared fault makes the registry answer like an unsupported combination, marked "known
    # fault" (asked only of what the code claims to support), so a property rejects the draw, counts
    # it for the run report, and never runs it; ``supports`` says no as well (the benchmark's filter).
    from hypothesis import given, settings
    from rope.harness import draws
    from rope.harness.rotation import check as rotation_check
    calls: list = []
    fake = _fake_backend(calls)
    why = unsupported_reason("fake", fake, RopeSpec(128, 40, True, None), torch.bfloat16, "cuda")
    assert why is not None and why.startswith("known fault: fake on ") and why.endswith(": faults")
    unsupported = unsupported_reason("fake", fake, RopeSpec(128, 40, True, (4, 8, 8)), torch.bfloat16, "cuda")
    assert unsupported.startswith("unsupported: fake does not run") and unsupported.endswith("1-D only")
    assert unsupported_reason("fake", fake, RopeSpec(128, 64, True, None), torch.bfloat16, "cuda") is None
    assert not fake.supports(RopeSpec(128, 40, True, None), torch.bfloat16, "cuda")
    assert fake.supports(RopeSpec(128, 64, True, None), torch.bfloat16, "cuda")

    @settings(max_examples=40, database=None, derandomize=True)
    @given(rotary_dim=st.sampled_from([40, 64]))
    def prop(rotary_dim):
        spec = RopeSpec(128, rotary_dim, True, None)
        rotation_check.skip_if_unsupported("fake", fake, spec, "bfloat16", "cuda")
        fake(spec, None, None, None, None)

    draws.REJECTED_DRAWS.clear()
    prop()
    assert calls and set(calls) == {64}, calls                         # 40 never ran, 64 did
    assert any(reason.startswith("known fault: fake") for reason in draws.REJECTED_DRAWS)
    draws.REJECTED_DRAWS.clear()


def _stubbed_adapters(monkeypatch) -> dict:
    """The FlashInfer, SGLang and vLLM adapters imported with their external packages stubbed (they
    only bind the external code at import): name -> the adapter's rotation function."""
    import importlib
    import sys
    import types
    for name in ("flashinfer", "flashinfer.rope", "sglang", "sglang.srt", "sglang.srt.layers",
                 "sglang.srt.layers.rotary_embedding", "sglang.srt.layers.rotary_embedding.mrope", "vllm",
                 "vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.rotary_embedding",
                 "vllm.model_executor.layers.rotary_embedding.mrope", "vllm.config"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))   # the vLLM adapter may set it
    adapters = {}
    for module in ("flashinfer", "sglang.rotation", "vllm.rotation"):
        # The stubbed adapter must not outlive the test (a later get_implementation would get it):
        # what was there before, the real adapter or nothing, is put back in sys.modules and on its package.
        name = f"rope.backends.{module}"
        parent, _, leaf = name.rpartition(".")
        monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.setattr(importlib.import_module(parent), leaf, None, raising=False)
        adapters[module.split(".")[0]] = importlib.import_module(name)
        del sys.modules[name]
    return {"flashinfer": adapters["flashinfer"].rotate_flashinfer, "sglang": adapters["sglang"].rotate_sglang,
            "sglang-triton": adapters["sglang"].rotate_sglang_triton,
            "vllm-native": adapters["vllm"].rotate_vllm_native, "vllm-cuda": adapters["vllm"].rotate_vllm_cuda}


def test_flashinfer_adapter_declares_its_faults(monkeypatch):
    # The adapter is wired to the measured predicate (no GPU needed: the external module is stubbed).
    from rope.backends.known_faults import flashinfer_fault
    rotate_flashinfer = _stubbed_adapters(monkeypatch)["flashinfer"]
    assert rotate_flashinfer.known_fault is flashinfer_fault
    why = unsupported_reason("flashinfer", rotate_flashinfer, RopeSpec(128, 40, True, None), torch.bfloat16, "cuda")
    assert why.startswith("known fault: flashinfer")
    # What it does not support is said so, not blamed on a fault.
    why = unsupported_reason("flashinfer", rotate_flashinfer, RopeSpec(128, 40, True, None), torch.float32, "cuda")
    assert why.startswith("unsupported: flashinfer") and "float16/bfloat16" in why


def test_sglang_triton_declares_its_padding_lane_fault_on_gpus(monkeypatch):
    # Measured on an H200: the qwen35 trigger (head 256, rotary 64, interleaved) and the suite's
    # interleaved draws faulted with an illegal address; chunked and padding-free shapes run.
    # (No SGLang needed: its module is stubbed; the adapter only binds it.)
    from rope.backends.known_faults import sglang_triton_fault
    rotate_sglang_triton = _stubbed_adapters(monkeypatch)["sglang-triton"]
    assert rotate_sglang_triton.known_fault is sglang_triton_fault
    qwen35 = RopeSpec(256, 64, True, (11, 11, 10), layout="interleaved")
    why = unsupported_reason("sglang-triton", rotate_sglang_triton, qwen35, torch.bfloat16, "cuda")
    assert why.startswith("known fault: sglang-triton") and "padding lanes 32..127" in why
    assert sglang_triton_fault(qwen35, torch.bfloat16, "cpu") is None           # the interpreter: traced, not run
    assert sglang_triton_fault(RopeSpec(128, 128, True, (24, 20, 20), layout="interleaved"),
                               torch.bfloat16, "cuda") is None                 # Qwen3-VL: no padding lanes
    assert sglang_triton_fault(RopeSpec(80, 80, False, (14, 13, 13), layout="interleaved"),
                               torch.float32, "cuda") is not None              # head 80 pads to 128
    assert sglang_triton_fault(RopeSpec(128, 64, False, (8, 12, 12)), torch.bfloat16, "cuda") is None   # chunked


HEADS = {"num_heads": 4, "num_kv_heads": 2}


def test_adapters_declare_the_pinned_defects(monkeypatch):
    # What test_backend_empty_batch_raises and the FlashInfer pins measure is what the adapters
    # declare (so --rope-known-defects avoid keeps off exactly that, and nothing else): the 0-token
    # raise where it is pinned (vLLM's forward_cuda: only its [T] path), FlashInfer's wrong shapes.
    fns = _stubbed_adapters(monkeypatch)
    one_d, rows = RopeSpec(64, 64, True, None), RopeSpec(64, 64, True, (16, 8, 8))
    for name, fn in fns.items():
        spec = one_d if unsupported_reason(name, fn, one_d, torch.bfloat16, "cuda") is None else rows
        empty = known_defect(name, fn, spec, 0, torch.bfloat16, "cuda", **HEADS)
        assert (empty is not None) == (name in EMPTY_BATCH_RAISES), (name, empty)
        assert empty is None or (empty.startswith(f"known defect: {name} on ") and "raises on 0 tokens" in empty)
        assert known_defect(name, fn, spec, 5, torch.bfloat16, "cuda", **HEADS) is None, name
    assert known_defect("vllm-cuda", fns["vllm-cuda"], rows, 0, torch.bfloat16, "cuda", **HEADS) is None   # triton_mrope copes
    for head, rd, neox in FLASHINFER_WRONG_SHAPES:
        why = known_defect("flashinfer", fns["flashinfer"], RopeSpec(head, rd, neox, None), 7, torch.bfloat16, "cuda",
                           **HEADS)
        assert why is not None and "wrong values" in why, (head, rd, neox)
    assert known_defect("flashinfer", fns["flashinfer"], RopeSpec(128, 128, True, None), 7, torch.bfloat16,
                        "cuda", **HEADS) is None


def test_vllm_declares_the_ptxas_spill_on_the_measured_launches_only(monkeypatch):
    # vLLM's triton_mrope under ptxas 12.8 (Triton 3.6.0's): wrong keys measured on the H200 for GPT-J
    # head 128, sections 3/1/60, one token, 28 or 32 query heads with 28 key heads, bf16; right for
    # every neighbour measured, and with ptxas 12.9 or 13.0.  The declaration is that, and only that.
    from rope.backends import known_faults
    vllm_cuda = _stubbed_adapters(monkeypatch)["vllm-cuda"]
    spec = RopeSpec(128, 128, False, (3, 1, 60))
    monkeypatch.setattr(known_faults, "cuda_capability", lambda device: (9, 0))
    monkeypatch.setattr(known_faults, "triton_ptxas_version", lambda: (12, 8, 93))

    def declared(spec=spec, tokens=1, dtype=torch.bfloat16, device="cuda:0", heads=(28, 28)):
        return known_defect("vllm-cuda", vllm_cuda, spec, tokens, dtype, device, num_heads=heads[0],
                            num_kv_heads=heads[1])

    for heads in ((28, 28), (32, 28)):
        why = declared(heads=heads)
        assert why is not None and "ptxas 12.8.93" in why and "key heads 16-23" in why, why
    assert declared(tokens=2) is None and declared(heads=(8, 8)) is None and declared(heads=(28, 4)) is None
    assert declared(spec=RopeSpec(128, 128, False, (16, 24, 24))) is None
    assert declared(spec=RopeSpec(128, 128, True, (3, 1, 60))) is None
    assert declared(dtype=torch.float16) is None and declared(device="cpu") is None
    monkeypatch.setattr(known_faults, "cuda_capability", lambda device: (10, 0))
    assert declared() is None                                      # measured on sm_90 only
    monkeypatch.setattr(known_faults, "cuda_capability", lambda device: (9, 0))
    for fixed in ((12, 9, 86), (13, 0, 88), None):
        monkeypatch.setattr(known_faults, "triton_ptxas_version", lambda fixed=fixed: fixed)
        assert declared() is None, fixed


def test_liger_declares_the_ptxas_spill_on_the_measured_launches_only(monkeypatch):
    # Liger's M-RoPE kernel under ptxas 12.8 (Triton 3.6.0's): every lane reads lane 0's cos/sin for
    # float32, one token, 96 query / 41 key heads, head 160 (measured on the H200; 96/42 and head 192
    # from the same SASS offline), not for the neighbours compiled, nor with ptxas 13 (Triton 3.9's
    # pipeline).  The declaration is that, and only that.
    from rope.backends import known_faults
    monkeypatch.setattr(known_faults, "cuda_capability", lambda device: (9, 0))
    monkeypatch.setattr(known_faults, "triton_ptxas_version", lambda: (12, 8, 93))

    def declared(head=160, sections=(1, 1, 78), tokens=1, dtype=torch.float32, device="cuda:0", heads=(96, 41)):
        return known_faults.liger_mrope_defect(RopeSpec(head, head, True, sections), tokens, dtype, device,
                                               num_heads=heads[0], num_kv_heads=heads[1])

    for head, heads in ((160, (96, 41)), (160, (96, 42)), (192, (96, 41))):
        why = declared(head=head, sections=(1, 1, head // 2 - 2), heads=heads)
        assert why is not None and "ptxas 12.8.93" in why and "f % 4" in why, why
    assert declared(sections=(16, 24, 40)) is not None               # any sections: the shared-memory read
    assert declared(tokens=2) is None and declared(heads=(97, 41)) is None and declared(heads=(96, 40)) is None
    assert declared(head=144, sections=(1, 1, 70)) is None
    assert declared(dtype=torch.bfloat16) is None and declared(dtype=torch.float16) is None
    assert declared(device="cpu") is None
    monkeypatch.setattr(known_faults, "cuda_capability", lambda device: (10, 0))
    assert declared() is None                                      # measured on sm_90 only
    monkeypatch.setattr(known_faults, "cuda_capability", lambda device: (9, 0))
    for fixed in ((13, 4, 59), None):
        monkeypatch.setattr(known_faults, "triton_ptxas_version", lambda fixed=fixed: fixed)
        assert declared() is None, fixed
    liger = _liger_or_skip()
    assert liger.rotate_liger.known_defect is known_faults.liger_mrope_defect


@pytest.mark.parametrize("mode", ["check", "avoid"])
def test_known_defects_are_checked_unless_avoided(mode, monkeypatch, tmp_path):
    # By default a declared defect is checked like every call (an upstream fix shows, and the
    # property fails on it); --rope-known-defects avoid rejects those draws, lists them for the
    # report, and searches on.
    from hypothesis import given, settings
    from rope.backends import declare
    from rope.harness import draws, report
    from rope.harness.rotation import check as rotation_check
    from rope.native import rotate_native
    monkeypatch.setenv(rotation_check.KNOWN_DEFECTS_ENV, mode)
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    monkeypatch.setenv(report.DISABLE_ENV, "1")
    calls: list = []

    def broken(spec, positions, query, key, cache):
        calls.append(query.shape[0])
        q, k = rotate_native(spec, positions, query, key, cache)
        return (q + 1 if query.shape[0] == 3 else q), k
    broken = declare(broken, working_precision="activation", reason=lambda spec, dtype, device: None,
                     defect=lambda spec, n, dtype, device, **heads: "wrong on 3 tokens" if n == 3 else None)

    @settings(max_examples=30, database=None, derandomize=True, deadline=None)
    @given(tokens=st.sampled_from([3, 5]))
    def prop(tokens):
        case = RotationCase(RopeSpec(64, 64, True, None), tokens, 1, 0, "float32", "uniform", False, 1)
        assert_matches_reference("broken", broken, case, "cpu")

    draws.REJECTED_DRAWS.clear()
    try:
        if mode == "check":
            with pytest.raises(AssertionError, match="does not match the reference"):
                prop()
            assert 3 in calls
        else:
            prop()
            assert calls and set(calls) == {5}, calls
            assert any(r.startswith("known defect: broken on ") and r.endswith("wrong on 3 tokens")
                       for r in draws.REJECTED_DRAWS)
    finally:
        draws.REJECTED_DRAWS.clear()


@pytest.mark.needs_no_gpu          # a pytest session pinned to the CPU
def test_known_defects_mode_is_validated(monkeypatch, tmp_path):
    from tests.fresh_runs import run_pytest
    from rope.harness import draws
    from rope.harness.rotation import check as rotation_check
    monkeypatch.setenv(rotation_check.KNOWN_DEFECTS_ENV, "skip")
    with pytest.raises(ValueError, match="ROPE_KNOWN_DEFECTS='skip'"):
        rotation_check.known_defects_mode()
    # A run with the bad value ends before any test, with a usage error naming it.
    run = run_pytest(["-q", "--pyargs", "properties.rotation.test_rotation", "-k", "known_bug_triggers_match_reference and native-cpu-gptj-paired-neox-glm41v", "--rope-device", "cpu"], tmp_path)
    assert run.returncode == 4 and "ROPE_KNOWN_DEFECTS='skip'" in run.stderr + run.stdout, run.stdout[-2000:]
