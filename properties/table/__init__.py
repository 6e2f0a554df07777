"""The cos/sin table: the properties a table implementation (--rope-table-impl) must pass; the replay of
table case files (--rope-repro) runs from here too."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["strategies", "test_replay", "test_table"]
