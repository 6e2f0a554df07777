"""The contract layer: the spec, the cos/sin cache, the models catalogue."""
