"""The cos/sin tables a test process keeps (rope.harness.rotation.cases' memo): each device held to a
budget of its own, an accelerator's from its own memory, not the host's: a GPU shared by a suite and a
campaign beside it must keep room for their tests."""

from __future__ import annotations

import torch

from rope.harness.rotation import cases

GIB, MIB = 2 ** 30, 2 ** 20


def test_an_accelerator_keeps_an_eighth_of_its_memory_shared_by_the_workers(monkeypatch):
    memory = {"cuda:0": 80 * GIB, "cuda:1": 8 * GIB}
    monkeypatch.setattr(cases, "_device_memory", lambda device: memory.get(device))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "16")
    assert cases._table_budget("cuda:0") == 640 * MIB          # 80 GiB / (8 x 16)
    assert cases._table_budget("cuda:1") == 64 * MIB           # the floor
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    assert cases._table_budget("cuda:0") == GIB                # the ceiling
    assert cases._table_budget("cpu") >= 256 * MIB            # the host's own rule


def test_the_host_has_no_accelerator_memory():
    assert cases._device_memory("cpu") is None
    assert cases._device_memory("meta") is None


def test_the_memo_holds_each_device_to_its_own_budget():
    memo = cases._TableMemo(budget=lambda device: 100 if device == "cuda:0" else 1000)
    for device in ("cuda:0", "cpu"):
        for i in range(3):
            memo.get((i, device), lambda: torch.zeros(10))     # 40 bytes each
    kept = sorted(memo.tables)
    assert kept == [(0, "cpu"), (1, "cpu"), (1, "cuda:0"), (2, "cpu"), (2, "cuda:0")], kept
    assert memo.held == {"cuda:0": 80, "cpu": 120}
    assert memo.budget_of("cuda:0") == 100 and memo.budget_of("cpu") == 1000
