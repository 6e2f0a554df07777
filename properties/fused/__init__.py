"""The fused ops: the properties a fused implementation (--rope-fused-impl) must pass, contract by
contract (docs/spec.md §10), with the strategies and the known bugs' fixed cases beside them."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["fused_cases", "test_fused", "test_replay"]
