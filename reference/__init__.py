"""The float64 pure-PyTorch reference: plain, slow, obvious. Imports only the spec from rope/."""

from reference.rotation import rotate

__all__ = ["rotate"]
