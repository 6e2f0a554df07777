"""The GPU memory a run's test processes held at their peaks, in the profile a campaign's report shows
(rope.harness.profiling): what a campaign beside another run on the same GPU leaves it."""

from __future__ import annotations

import torch

from rope.harness import profiling

GIB = 2 ** 30


def test_a_process_reports_the_device_where_it_held_the_most(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: [1 * GIB, 3 * GIB][d])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: [4 * GIB, 2 * GIB][d])
    assert profiling.gpu_memory_peaks() == {"allocated": 3 * GIB, "reserved": 4 * GIB}
    assert profiling.snapshot()["gpu_memory"] == {"allocated": 3 * GIB, "reserved": 4 * GIB}


def test_a_process_that_used_no_gpu_reports_no_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert profiling.gpu_memory_peaks() == {}
    assert "gpu_memory" not in profiling.snapshot()


def test_the_run_reports_the_largest_peak_and_the_sum_of_peaks():
    base = {"seconds": {"tests": 10.0, "call": 2.0}, "counts": {"call": 4}}
    combined = profiling.combine([
        {**base, "gpu_memory": {"allocated": 1 * GIB, "reserved": 3 * GIB}},
        {**base, "gpu_memory": {"allocated": 2 * GIB, "reserved": 2 * GIB}},
        base])                                                    # the controller: no GPU
    assert combined["gpu_memory"] == {"processes": 2, "allocated_max": 2 * GIB, "reserved_max": 3 * GIB,
                                      "allocated_sum": 3 * GIB, "reserved_sum": 5 * GIB}
    text = "\n".join(profiling.markdown_rows(combined))
    assert "allocated up to 2.00 GiB, reserved up to 3.00 GiB" in text, text
    assert "the peaks of the 2 processes summed" in text and "reserved 5.00 GiB" in text, text
    assert "gpu_memory" not in profiling.combine([base]) and "GPU memory" not in "\n".join(
        profiling.markdown_rows(profiling.combine([base])))
