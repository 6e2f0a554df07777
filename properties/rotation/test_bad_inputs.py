"""Bad input is a ValueError naming the field, raised before any arithmetic or kernel launch,
by the reference and by every implementation (OpInfo-style error inputs)."""

from __future__ import annotations

import pytest
import torch

from properties.rotation.bad_inputs import ERROR_INPUTS, call, good
from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.harness.draws import skip_unless_builtin
from rope.harness.rotation.check import call_rotation
from rope.registry import get_implementation


@pytest.mark.fixed_cases
@pytest.mark.builtins_only
@pytest.mark.parametrize("error", list(ERROR_INPUTS), ids=list(ERROR_INPUTS))
def test_implementation_rejects_bad_input(impl_name, device, error, monkeypatch):
    skip_unless_builtin(impl_name)
    # Position ranges are checked on a GPU only under the debug switch (rope.spec.checks_values;
    # without it the kernel clamps them: test_sync_free_entries.py).
    monkeypatch.setenv("ROPE_CHECK_VALUES", "1")
    make, pattern = ERROR_INPUTS[error]
    args = make(device)
    snapshot = args["query"].clone() if isinstance(args["query"], torch.Tensor) else None
    with pytest.raises(ValueError, match=pattern):
        call(get_implementation(impl_name), args)
    if snapshot is not None:
        assert torch.equal(args["query"], snapshot), "query was modified before the error was raised"


@pytest.mark.fixed_cases
@pytest.mark.builtins_only
def test_mismatched_devices_rejected(impl_name, device):
    skip_unless_builtin(impl_name)
    if device == "cpu":
        pytest.skip("needs a second device to mismatch")
    args = good(device)
    args["positions"] = args["positions"].cpu()
    with pytest.raises(ValueError, match=r"devices: all tensors must be on one device"):
        call(get_implementation(impl_name), args)


@pytest.mark.fixed_cases
def test_strided_1d_positions_are_read_by_value(impl_name, device):
    # A 1-D positions view with stride 2 must be read element by element, not as if contiguous.
    from rope.harness.rotation.check import angle_source, reference_rotation, skip_if_unsupported
    from rope.harness.rotation.bound import compare_rotation
    from rope.registry import working_precision
    from rope.spec import RopeSpec
    spec = RopeSpec(64, 64, True, max_position=64)
    impl = get_implementation(impl_name)
    skip_if_unsupported(impl_name, impl, spec, "float32", device)
    dev = torch_device(device)
    pos = (torch.arange(16) * 3)[::2].to(dev)
    q = torch.randn(8, 128, generator=torch.Generator().manual_seed(1)).to(dev)
    cache = cos_sin_cache(spec, torch.float32, dev)
    out, _ = call_rotation(impl, spec, pos, q.clone(), None, cache)
    dense = pos.cpu().contiguous()
    ref, _ = reference_rotation(impl, spec, dense, q.cpu(), None, cache.cpu())
    result = compare_rotation(spec, dense, q.cpu(), None, cache.cpu(), out.cpu(), None, ref, None,
                              working_precision(impl), angles=angle_source(impl))
    assert result.ok, result.message(f"{impl_name}: strided 1-D positions")
