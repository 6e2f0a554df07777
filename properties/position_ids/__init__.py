"""Position ids: the properties a model's position-id implementation (--rope-position-ids-impl) must pass."""
