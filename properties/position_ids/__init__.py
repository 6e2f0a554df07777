"""Position ids: the properties a model's position-id implementation (--rope-position-ids-impl) must pass."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["test_position_ids"]
