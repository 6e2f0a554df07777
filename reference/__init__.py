"""The float64 pure-PyTorch reference: plain, slow, obvious. Imports only the spec from rope/."""

from reference.rotation import rotate
from reference.runner import prepare_positions

__all__ = ["prepare_positions", "rotate"]
