"""Progress bars for long command-line work (convert, inspect --verify, bench): tqdm on
stderr, with rate and ETA, when stderr is a terminal and tqdm is installed (``pip install
tqdm``, in stoker's ``[convert]`` and ``[bench]`` extras); silent otherwise, so logs and
pipes stay clean."""

from __future__ import annotations

import sys
from typing import Any, Optional

_MININTERVAL = 0.1  # seconds between redraws


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """``update(n)`` / ``set(done)`` as work is done; ``close()`` (or a ``with`` block) at
    the end. Without a terminal or without tqdm every call does nothing.

    Args:
        total: units of work in all (None: unknown, the bar shows the rate only).
        desc: what is being done (``"stoker convert npy"``).
        unit: the unit counted; ``unit_scale`` for bytes (kB, MB, ...).
        enabled: False turns it off (``--quiet``).
    """

    def __init__(self, total: Optional[float] = None, desc: str = "", unit: str = "it",
                 unit_scale: bool = False, enabled: bool = True):
        self._bar = None
        self._done = 0.0
        tqdm = _tqdm() if enabled and sys.stderr.isatty() else None
        if tqdm is not None:
            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale,
                             file=sys.stderr, dynamic_ncols=True, leave=False,
                             mininterval=_MININTERVAL)

    @property
    def active(self) -> bool:
        """Whether a bar is drawn."""
        return self._bar is not None

    def update(self, n: float = 1) -> None:
        self._done += n
        if self._bar is not None:
            self._bar.update(n)

    def set(self, done: float) -> None:
        """Moves the bar to `done` units (an absolute count)."""
        if done > self._done:
            self.update(done - self._done)

    def note(self, text: str) -> None:
        """A short status shown after the bar (the current item, bytes so far)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def write(self, text: str, file: Any = None) -> None:
        """Prints a line (to stdout, or `file`) without breaking the bar."""
        file = sys.stdout if file is None else file
        if self._bar is not None:
            self._bar.write(text, file=file)
            file.flush()
        else:
            print(text, file=file, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
