

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["test_engine_style"]
