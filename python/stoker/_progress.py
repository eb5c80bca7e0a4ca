"""Progress bars for long command-line work (convert, inspect --verify, bench), on stderr
when it is a terminal: tqdm's bar when tqdm is installed (``pip install tqdm``, in stoker's
``[convert]`` and ``[bench]`` extras), else a built-in line with the same figures (done of
total, percentage, rate, ETA); nothing when stderr is not a terminal, so logs and pipes
stay clean."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, Optional

_MININTERVAL = 0.1  # seconds between redraws


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def _amount(n: float, scale: bool) -> str:
    """``1234567`` as ``1.23M`` with ``scale`` (bytes), else as a whole number."""
    if not scale:
        return f"{n:,.0f}"
    for prefix in ("", "k", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.3g}{prefix}" if prefix else f"{n:.0f}"
        n /= 1000
    raise AssertionError


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class _Line:
    """The bar without tqdm: one line, redrawn in place (``\r``) at most every
    ``_MININTERVAL`` seconds, cleared at the end (as tqdm's ``leave=False``)::

        stoker convert imagefolder:  42% 4,210/10,000 img [00:12<00:16, 351 img/s] 88.1 MB
    """

    def __init__(self, total: Optional[float], desc: str, unit: str, unit_scale: bool):
        self.total, self.desc, self.unit, self.scale = total, desc, unit, unit_scale
        self.done = 0.0
        self.postfix = ""
        self.start = self.drawn_at = time.monotonic()
        self.width = 0  # of the line on screen
        self.draw()

    def text(self) -> str:
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        unit = self.unit
        done = _amount(self.done, self.scale)
        if self.total:
            left = (self.total - self.done) / rate if rate > 0 else None
            head = (f"{self.done / self.total:4.0%} {done}/{_amount(self.total, self.scale)} "
                    f"{unit} [{_clock(elapsed)}<{'?' if left is None else _clock(left)}, ")
        else:
            head = f"{done} {unit} [{_clock(elapsed)}, "
        line = f"{self.desc}: {head}{_amount(rate, self.scale)} {unit}/s]"
        return line + (f" {self.postfix}" if self.postfix else "")

    def draw(self) -> None:
        columns = shutil.get_terminal_size((80, 24)).columns
        line = self.text()[:max(columns - 1, 10)]
        sys.stderr.write("\r" + line + " " * max(self.width - len(line), 0))
        sys.stderr.flush()
        self.width = len(line)
        self.drawn_at = time.monotonic()

    def update(self, n: float) -> None:
        self.done += n
        if time.monotonic() - self.drawn_at >= _MININTERVAL or self.done == self.total:
            self.draw()

    def set_postfix_str(self, text: str, refresh: bool = False) -> None:
        self.postfix = text

    def clear(self) -> None:
        sys.stderr.write("\r" + " " * self.width + "\r")
        sys.stderr.flush()
        self.width = 0

    def write(self, text: str, file: Any) -> None:
        self.clear()
        print(text, file=file, flush=True)
        self.draw()

    def close(self) -> None:
        self.clear()


class Progress:
    """``update(n)`` / ``set(done)`` as work is done; ``close()`` (or a ``with`` block) at
    the end. Without a terminal every call does nothing; without tqdm the bar is
    a line of stoker's own.

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
        if not (enabled and sys.stderr.isatty()):
            return
        tqdm = _tqdm()
        if tqdm is not None:
            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale,
                             file=sys.stderr, dynamic_ncols=True, leave=False,
                             mininterval=_MININTERVAL)
        else:
            self._bar = _Line(total, desc, unit, unit_scale)

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
