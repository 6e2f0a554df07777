"""Bad rotation inputs, each with the message a ValueError must carry (OpInfo-style error inputs): the cases
of properties/rotation/test_bad_inputs.py (a case module: the project's tests of the reference use them too)."""

from __future__ import annotations

import torch

from rope.cache import cos_sin_cache
from rope.devices import torch_device
from rope.spec import RopeSpec

MROPE = RopeSpec(128, 64, False, (8, 12, 12), max_position=64)
T = 5


def good(device="cpu"):
    dev = torch_device(device)
    g = torch.Generator().manual_seed(0)
    return dict(spec=MROPE, positions=torch.randint(0, 64, (3, T), generator=g).to(dev),
                query=torch.randn(T, 2 * 128, generator=g).to(dev), key=torch.randn(T, 128, generator=g).to(dev),
                cos_sin_cache=cos_sin_cache(MROPE, torch.float32, dev))


def with_changes(**changes):
    def make(device):
        args = good(device)
        for name, fn in changes.items():
            args[name] = fn(args)
        return args
    return make


ERROR_INPUTS = {
    # Bug 6: an extra batch dim [3, 1, T] must be rejected, not read as garbage.
    "positions-extra-batch-dim": (with_changes(positions=lambda a: a["positions"].unsqueeze(1)), r"positions.shape=\(3, 1, 5\)"),
    "positions-1d-for-mrope": (with_changes(positions=lambda a: a["positions"][0]), r"positions.shape=\(5,\): must be \[3, num_tokens\]"),
    "positions-4-rows-for-3": (with_changes(positions=lambda a: torch.cat([a["positions"], a["positions"][:1]])), r"positions.shape=\(4, 5\)"),
    "positions-float": (with_changes(positions=lambda a: a["positions"].float()), r"positions.dtype=torch.float32"),
    "positions-past-cache": (with_changes(positions=lambda a: a["positions"] + 64), r"positions=\[\d+\.\.\d+\]: must lie in \[0, 64\)"),
    "positions-negative": (with_changes(positions=lambda a: a["positions"] - 64), r"positions=\[-\d+\.\.-?\d+\]: must lie in"),
    "query-3d": (with_changes(query=lambda a: a["query"].reshape(T, 2, 128)), r"query.shape=\(5, 2, 128\)"),
    "query-not-head-multiple": (with_changes(query=lambda a: a["query"][:, :200]), r"query.shape=\(5, 200\): last dim must be a positive multiple of head_size=128"),
    "query-token-count": (with_changes(query=lambda a: a["query"][:4]), r"query.shape=\(4, 256\): must have num_tokens=5"),
    "query-int": (with_changes(query=lambda a: a["query"].long(), key=lambda a: None), r"query.dtype=torch.int64"),
    "key-token-count": (with_changes(key=lambda a: a["key"][:3]), r"key.shape=\(3, 128\)"),
    "key-dtype": (with_changes(key=lambda a: a["key"].half()), r"key.dtype=torch.float16: must equal query.dtype"),
    "cache-width": (with_changes(cos_sin_cache=lambda a: torch.cat([a["cos_sin_cache"]] * 2, 1)), r"cos_sin_cache.shape=\(64, 128\): must be \[>= 1, rotary_dim=64\]"),
    "spec-not-a-spec": (with_changes(spec=lambda a: MROPE.to_dict()), r"spec=.*must be a RopeSpec"),
    "positions-not-a-tensor": (with_changes(positions=lambda a: a["positions"].tolist()), r"positions=list: must be a torch.Tensor"),
    "key-not-a-tensor": (with_changes(key=lambda a: a["key"].tolist()), r"key=list: must be a torch.Tensor or None"),
    "key-not-head-multiple": (with_changes(key=lambda a: a["key"][:, :100]), r"key.shape=\(5, 100\): last dim must be a positive multiple"),
    "cache-int": (with_changes(cos_sin_cache=lambda a: a["cos_sin_cache"].long()), r"cos_sin_cache.dtype=torch.int64: must be floating point"),
    "cache-empty": (with_changes(cos_sin_cache=lambda a: a["cos_sin_cache"][:0]), r"cos_sin_cache.shape=\(0, 64\)"),
}


def call(fn, args):
    """Call a rotation implementation (or the reference) on the arguments of an error input."""
    return fn(args["spec"], args["positions"], args["query"], args["key"], args["cos_sin_cache"])
