"""A stand-in for a user's package: CI installs the built wheel into a fresh environment and checks
these two implementations with it, from a directory outside the repository."""
