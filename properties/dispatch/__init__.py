"""Dispatch: the platform dispatch of the built-in operations (which path each device takes)."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["test_dispatch"]
