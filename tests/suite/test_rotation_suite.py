"""The rotation properties (properties/rotation/test_rotation.py; their bodies: properties/rotation/checks.py)
as a user meets them: they hold a second kernel of an implementation to the reference, draw only the shapes
and kinds it runs (skipping the others before drawing), and catch state an implementation keeps per shape."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rope.harness import report
from rope.harness.draws import skip_if_none_supported
from rope.registry import get_implementation
from properties.rotation.checks import check_text_tokens_reduce_to_1d, one_shape_many_batches_match_reference
from properties.strategies import KINDS, RotationCase, probe_specs, rotation_cases, supported_shapes


@pytest.mark.parametrize("broken_path", ["rows", "1d"])
def test_a_separate_1d_kernel_is_still_held_to_the_reference(broken_path, monkeypatch, tmp_path):
    # An implementation declaring separate_1d_kernel escapes the bit-for-bit comparison, not the
    # check: a wrong kernel on either path fails the text-token property.
    from hypothesis import settings
    from properties.mutants.broken_rotations import neox_for_gptj
    from rope.native import rotate_native
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    monkeypatch.setenv(report.DISABLE_ENV, "1")     # deliberate mismatches: not findings of the run

    def two_kernels(spec, positions, query, key, cache):
        broken = (positions.dim() == 2) == (broken_path == "rows")
        return (neox_for_gptj if broken else rotate_native)(spec, positions, query, key, cache)
    two_kernels.working_precision = "activation"
    two_kernels.separate_1d_kernel = True

    @settings(max_examples=40, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(case=rotation_cases(dtype="float32", kind="chunked3", min_tokens=1))
    def text_tokens(case):
        case = RotationCase(**{**case.__dict__, "positions_kind": "text"})
        check_text_tokens_reduce_to_1d("two_kernels", two_kernels, case, "cpu")

    with pytest.raises(AssertionError, match="does not match the reference"):
        text_tokens()


def test_a_kind_the_implementation_never_runs_is_skipped_before_drawing():
    # Up-front skip only when no probed shape is supported; one supported head size keeps the test.
    from properties.strategies import HEAD_SIZES

    def neox_only(spec, positions, query, key, cache):
        raise AssertionError("never called")
    neox_only.supports = lambda spec, dtype, device: spec.is_neox_style
    with pytest.raises(pytest.skip.Exception, match="does not run chunked3-gptj"):
        skip_if_none_supported("neox_only", neox_only, probe_specs("chunked3", False), "float32", "cpu")
    skip_if_none_supported("neox_only", neox_only, probe_specs("chunked3", True), "float32", "cpu")
    neox_only.supports = lambda spec, dtype, device: spec.head_size == 96 and spec.rotary_dim < 96
    skip_if_none_supported("neox_only", neox_only, probe_specs("interleaved", False), "float32", "cpu")
    for kind in KINDS:
        assert {s.head_size for s in probe_specs(kind, True)} == set(HEAD_SIZES)


def test_draws_keep_to_the_shapes_the_implementation_runs():
    # An engine's kernel that pairs NeoX-style only and rotates whole heads of 64 and 128 gets
    # draws of exactly those (every draw was rejected or run before: most of a search rejected);
    # the harness's own kernels get the full strategy, unchanged; a kind run on no probe is None.
    from hypothesis import HealthCheck, settings
    from rope.backends import declare

    def whole_heads(spec, positions, query, key, cache):
        raise AssertionError("not called")
    whole_heads = declare(whole_heads, working_precision="activation", reason=lambda spec, dtype, device: (
        None if spec.rotary_dim == spec.head_size and spec.head_size in (64, 128) and spec.is_neox_style else "no"))
    narrowed = supported_shapes("whole_heads", whole_heads, "chunked3", True, "float32", "cpu")
    assert narrowed == {"head_sizes": (64, 128), "full_rotary_only": True}
    assert supported_shapes("whole_heads", whole_heads, "chunked3", False, "float32", "cpu") is None
    assert supported_shapes("native", get_implementation("native"), "chunked3", False, "float32", "cpu") == {}
    seen = set()

    @settings(max_examples=60, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=rotation_cases(kind="chunked3", is_neox_style=True, **narrowed))
    def draws(case):
        assert case.spec.rotary_dim == case.spec.head_size and case.spec.head_size in (64, 128), case.spec
        seen.add(case.spec.head_size)
    draws()
    assert seen == {64, 128}


_FIRST_POSITIONS: dict = {}


def positions_kept_per_shape(spec, positions, query, key, cache):
    """A stand-in for an engine that keeps a buffer per shape (captured once, as for a CUDA graph)
    and refreshes it only when a batch outgrows it: a smaller batch reads the first batch's positions."""
    from rope.native import rotate_native
    kept = _FIRST_POSITIONS.get(spec)
    if kept is None or kept.shape[-1] < positions.shape[-1]:
        kept = _FIRST_POSITIONS[spec] = positions.clone()
    return rotate_native(spec, kept[..., :positions.shape[-1]].contiguous(), query, key, cache)


positions_kept_per_shape.working_precision = "activation"


def test_one_shape_many_batches_catches_state_kept_per_shape(monkeypatch, tmp_path):
    # The one-shape property runs batches through one shape back to back: state an implementation
    # keeps per shape is caught there, where independent draws rarely meet the same shape twice.
    from rope.harness import report
    monkeypatch.setenv("ROPE_CASES_DIR", str(tmp_path))
    monkeypatch.setenv(report.DISABLE_ENV, "1")     # a deliberate mismatch: not a finding of the run
    _FIRST_POSITIONS.clear()
    # The property's own body under a fixed search (the suite's dev profile draws 20 random examples:
    # two batches of one shape whose positions differ are not certain among them).
    search = settings(max_examples=200, derandomize=True, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))(
        given(data=st.data())(one_shape_many_batches_match_reference))
    with pytest.raises(AssertionError, match="does not match the reference"):
        search(impl_name=f"{__name__}:positions_kept_per_shape", device="cpu", dtype="float32")
