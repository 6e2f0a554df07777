"""Dispatch: the platform dispatch of the built-in operations (which path each device takes)."""
