"""Rotation: the properties a rotation implementation (--rope-impl) must pass, prefill sizes, aliasing, bad input and the regression corpus included."""
