"""Bad input is a ValueError naming the field, raised before any arithmetic or kernel launch,
by the reference and by every implementation (OpInfo-style error inputs)."""

from __future__ import annotations

import pytest
import torch

from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.harness.comparison import call_rotation, skip_unless_builtin
from rope.registry import get_implementation
from rope.spec import RopeSpec

MROPE = RopeSpec(128, 64, False, (8, 12, 12), max_position=64)
T = 5


def good(device="cpu"):
    dev = torch_device(device)
    g = torch.Generator().manual_seed(0)
    return dict(spec=MROPE, positions=torch.randint(0, 64, (3, T), generator=g).to(dev),
                query=torch.randn(T, 2 * 128, generator=g).to(dev), key=torch.randn(T, 128, generator=g).to(dev),
                cos_sin_cache=cos_sin_cache(MROPE, torch.float32, dev))


def _with(**changes):
    def make(device):
        args = good(device)
        for name, fn in changes.items():
            args[name] = fn(args)
        return args
    return make


ERROR_INPUTS = {
    # Bug 6: an extra batch dim [3, 1, T] must be rejected, not read as garbage.
    "positions-extra-batch-dim": (_with(positions=lambda a: a["positions"].unsqueeze(1)), r"positions.shape=\(3, 1, 5\)"),
    "positions-1d-for-mrope": (_with(positions=lambda a: a["positions"][0]), r"positions.shape=\(5,\): must be \[3, num_tokens\]"),
    "positions-4-rows-for-3": (_with(positions=lambda a: torch.cat([a["positions"], a["positions"][:1]])), r"positions.shape=\(4, 5\)"),
    "positions-float": (_with(positions=lambda a: a["positions"].float()), r"positions.dtype=torch.float32"),
    "positions-past-cache": (_with(positions=lambda a: a["positions"] + 64), r"positions=\[\d+\.\.\d+\]: must lie in \[0, 64\)"),
    "positions-negative": (_with(positions=lambda a: a["positions"] - 64), r"positions=\[-\d+\.\.-?\d+\]: must lie in"),
    "query-3d": (_with(query=lambda a: a["query"].reshape(T, 2, 128)), r"query.shape=\(5, 2, 128\)"),
    "query-not-head-multiple": (_with(query=lambda a: a["query"][:, :200]), r"query.shape=\(5, 200\): last dim must be a positive multiple of head_size=128"),
    "query-token-count": (_with(query=lambda a: a["query"][:4]), r"query.shape=\(4, 256\): must have num_tokens=5"),
    "query-int": (_with(query=lambda a: a["query"].long(), key=lambda a: None), r"query.dtype=torch.int64"),
    "key-token-count": (_with(key=lambda a: a["key"][:3]), r"key.shape=\(3, 128\)"),
    "key-dtype": (_with(key=lambda a: a["key"].half()), r"key.dtype=torch.float16: must equal query.dtype"),
    "cache-width": (_with(cos_sin_cache=lambda a: torch.cat([a["cos_sin_cache"]] * 2, 1)), r"cos_sin_cache.shape=\(64, 128\): must be \[>= 1, rotary_dim=64\]"),
    "spec-not-a-spec": (_with(spec=lambda a: MROPE.to_dict()), r"spec=.*must be a RopeSpec"),
    "positions-not-a-tensor": (_with(positions=lambda a: a["positions"].tolist()), r"positions=list: must be a torch.Tensor"),
    "key-not-a-tensor": (_with(key=lambda a: a["key"].tolist()), r"key=list: must be a torch.Tensor or None"),
    "key-not-head-multiple": (_with(key=lambda a: a["key"][:, :100]), r"key.shape=\(5, 100\): last dim must be a positive multiple"),
    "cache-int": (_with(cos_sin_cache=lambda a: a["cos_sin_cache"].long()), r"cos_sin_cache.dtype=torch.int64: must be floating point"),
    "cache-empty": (_with(cos_sin_cache=lambda a: a["cos_sin_cache"][:0]), r"cos_sin_cache.shape=\(0, 64\)"),
}


def _call(fn, args):
    return fn(args["spec"], args["positions"], args["query"], args["key"], args["cos_sin_cache"])


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
        _call(get_implementation(impl_name), args)
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
        _call(get_implementation(impl_name), args)


@pytest.mark.fixed_cases
def test_strided_1d_positions_are_read_by_value(impl_name, device):
    # A 1-D positions view with stride 2 must be read element by element, not as if contiguous.
    from rope.harness.comparison import angle_source, reference_rotation, skip_if_unsupported
    from rope.harness.tolerance import compare_rotation
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
