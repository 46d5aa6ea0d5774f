"""The version of the source tree (pyproject.toml's; a test keeps the two the same)."""

__version__ = "0.1.0"
