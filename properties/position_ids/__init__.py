"""Position ids: the properties a model's position-id implementation (--rope-position-ids-impl) must pass;
the replay of position-id case files (--rope-repro) runs from here too."""

# Its modules (pytest collects the test modules; the others are case modules the tests import).
__all__ = ["known_prompts", "test_position_ids", "test_replay"]
