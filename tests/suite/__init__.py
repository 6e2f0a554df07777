"""The shipped suite's own ability to fail on broken implementations."""
