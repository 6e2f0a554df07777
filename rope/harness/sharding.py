"""Splitting the suite over CI runners or hosts: ``pytest --rope-shard I/N``.

A test belongs to shard ``sha256(test id) mod N``: a partition (every test in exactly one shard)
that depends on nothing but the id, so runners with different hardware, worker counts or
collection order still agree.  Each runner writes its own ``reports/``; ``rope-harness merge``
combines them (rope.harness.report.merge).
"""

from __future__ import annotations

import hashlib
import re


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/8"`` -> ``(2, 8)``; shards are numbered from 0."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if m is None:
        raise ValueError(f"shard={text!r}: must be I/N with integers 0 <= I < N, e.g. 0/4")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or index >= count:
        raise ValueError(f"shard={text!r}: must be I/N with integers 0 <= I < N, e.g. 0/4")
    return index, count


def shard_of(test_id: str, count: int) -> int:
    """The shard (0..count-1) that runs ``test_id``."""
    if count < 1:
        raise ValueError(f"count={count}: must be at least 1")
    return int.from_bytes(hashlib.sha256(test_id.encode()).digest()[:8], "big") % count
