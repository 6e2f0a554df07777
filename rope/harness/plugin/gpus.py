"""GPUs per test (rope.harness.placement): each GPU test on one visible GPU, round robin, one copy
per test where several GPUs would run the same one, and the shard a runner takes (--rope-shard)."""

from __future__ import annotations

import re

import pytest


def gpu_copy_key(item) -> str:
    """A GPU test's id without its GPU index: the copies of one test on each GPU share it."""
    kind, index = item.get_closest_marker("rope_gpu").args
    return re.sub(rf"(?<![A-Za-z0-9_]){kind}:{index}(?![0-9])", kind, item.nodeid, count=1)


def keep_one_gpu_per_test(items) -> None:
    """Each GPU test was generated once per GPU; keep the copy whose GPU the round robin over the
    collection order assigns (the same in every xdist worker), so tests spread over the GPUs and
    each runs once."""
    from rope.harness import placement
    gpu_items = [item for item in items if item.get_closest_marker("rope_gpu")]
    if not gpu_items:
        return
    by_kind = {}
    for item in gpu_items:
        kind, _ = item.get_closest_marker("rope_gpu").args
        by_kind.setdefault(kind, []).append(item)
    keep = set()
    for kind, group in by_kind.items():
        gpus = sorted({item.get_closest_marker("rope_gpu").args[1] for item in group})
        keys = [gpu_copy_key(item) for item in group]
        assigned = placement.assign_round_robin(keys, gpus)
        keep.update(id(item) for item, key in zip(group, keys)
                    if assigned[key] == item.get_closest_marker("rope_gpu").args[1])
    items[:] = [item for item in items if not item.get_closest_marker("rope_gpu") or id(item) in keep]


def keep_shard(config, items) -> None:
    text = config.getoption("--rope-shard")
    if text is None:
        return
    from rope.harness.sharding import parse_shard, shard_of
    try:
        index, count = parse_shard(text)
    except ValueError as exc:
        raise pytest.UsageError(f"--rope-shard: {exc}") from None
    keep = [item for item in items if shard_of(item.nodeid, count) == index]
    config.hook.pytest_deselected(items=[item for item in items if shard_of(item.nodeid, count) != index])
    items[:] = keep


@pytest.fixture(autouse=True)
def rope_on_assigned_gpu(request):
    """A test assigned to GPU k runs with GPU k as the current device."""
    marker = request.node.get_closest_marker("rope_gpu")
    if marker is None:
        yield
        return
    from rope.harness import placement
    with placement.on_gpu(*marker.args):
        yield
