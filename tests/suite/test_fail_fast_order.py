"""The order a run that stops at its first failure takes through the suite (properties/conftest.py):
known-bug triggers, then the prefill boundaries, then the searches, then the sweeps and prefill
batches, and the properties that call the implementation inside torch.compile last (a Dynamo
trace per drawn spec: an eager bug must not wait behind it).  A full run keeps file order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _collected(*options: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "properties/rotation/test_modes.py",
                           "properties/rotation/test_prefill.py", "properties/rotation/test_rotation.py",
                           "--rope-impl", "native", *options],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


@pytest.mark.needs_no_gpu
def test_a_fail_fast_run_takes_the_traced_property_last_and_a_full_run_keeps_file_order():
    fail_fast = _collected("-x")
    traced = [i for i, t in enumerate(fail_fast) if "under_compile" in t]
    prefill = [i for i, t in enumerate(fail_fast) if "test_prefill.py::test_prefill_batches_match_reference" in t
               or "test_prefill.py::test_token_head_products" in t]
    searches = [i for i, t in enumerate(fail_fast) if "test_rotation.py::test_rotation_matches_reference" in t]
    boundaries = [i for i, t in enumerate(fail_fast) if "test_power_of_two_boundaries" in t]
    assert traced and prefill and searches and boundaries, fail_fast[:20]
    # The first pass (round0: 3 examples of every search): the searches, then the prefill batches
    # (not a search in rounds: one pass), then the traced property; the profile's own round after.
    first = [i for i in traced if "round0" in fail_fast[i]]
    assert max(i for i in searches if "round0" in fail_fast[i]) < min(prefill) < max(prefill) < min(first)
    assert max(first) < min(i for i in searches if "round1" in fail_fast[i])
    assert max(boundaries) < min(searches)
    full = _collected()
    # File order: test_modes.py (the traced property among it) before test_prefill.py.
    assert min(i for i, t in enumerate(full) if "under_compile" in t) < \
        min(i for i, t in enumerate(full) if "test_prefill.py" in t)
