"""Errors of user code in the Python stage: the user's exception, with a note naming
the sample or batch, as it was raised."""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["add_note", "format_exception_summary", "names_itself", "without_locals"]


def add_note(exc: BaseException, note: str) -> BaseException:
    """Adds `note` to `exc` (shown under its traceback from Python 3.11; on 3.9/3.10 it
    is kept in ``exc.__notes__``). The exception stays what it was: ``except
    ValueError`` still catches a ValueError that map raised."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python < 3.11
        notes = getattr(exc, "__notes__", None)
        try:
            if notes is None:
                exc.__notes__ = [note]  # type: ignore[attr-defined]
            else:
                notes.append(note)
        except (AttributeError, TypeError):
            pass
    return exc


def format_exception_summary(exc: BaseException) -> str:
    """One line for a C++-side message: "ValueError: bad box"."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def names_itself(exc: BaseException) -> bool:
    """Errors of stoker's own reads already name the shard file and record."""
    from .. import _core

    return isinstance(exc, _core.Error)


_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # stoker/


def without_locals(e: BaseException) -> BaseException:
    """`e`, the locals of stoker's own finished frames in its traceback (and its
    context's) dropped; the lines it prints stay, and so do a user's frames, for a
    debugger. An error kept past the call that raised it (a failed batch's, raised later
    in the loop, perhaps kept by the user) then holds no batch memory through them, and
    no cycle through the record that keeps it."""
    seen = 0
    x: Optional[BaseException] = e
    while x is not None and seen < 8:
        tb = x.__traceback__
        while tb is not None:
            f = tb.tb_frame
            if f.f_code.co_filename.startswith(_OWN):
                try:
                    f.clear()
                except RuntimeError:  # still running (the frame that keeps it)
                    pass
            tb = tb.tb_next
        x = x.__cause__ or x.__context__
        seen += 1
    return e

