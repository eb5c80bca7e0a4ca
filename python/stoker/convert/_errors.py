"""The converters' error for bad input data."""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """The input data is bad (not what the arguments ask for): the message names the file
    and the record, line or row. ``stoker`` commands exit with status 1 on it, and with 2
    on a usage error (a plain ``ValueError``, a missing path)."""
