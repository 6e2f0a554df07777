"""Deliberately broken implementations the property suite must reject.

Each is a small, realistic mistake, written as a wrapper or a variant of our own code, so the
suite's ability to fail is itself tested (tests/suite/test_suite_can_fail.py).
"""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["broken_backwards", "broken_position_ids", "broken_positions", "broken_rotations", "broken_tables", "broken_fused", "catalogue", "dispatch",
           "kernel", "searches"]
