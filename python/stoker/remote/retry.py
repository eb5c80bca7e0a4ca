"""How the remote layer retries, and how a transfer is cancelled.

:class:`Retry` is the one argument that says how hard a remote dataset tries
(``stoker.Dataset(url, retry=Retry(retries=4, backoff=0.25, deadline=120))``, or a dict of
the same, or an int for ``retries``):

* within one download (or range read, or ``index.json``): a :class:`TransientError`
  (connection error, 5xx/429, a body cut short, a stall) is tried again after
  ``backoff * 2**k`` seconds (with jitter, at most ``max_backoff``), up to ``retries``
  times and never starting an attempt past ``deadline`` seconds after the first; a
  :class:`PermanentError` (404, 403, a range past the end, a complete body whose checksum
  is wrong) fails at once;
* across demands: a shard whose download failed is failed for its readers, then pending
  again after a cool-down (:meth:`Retry.cooldown`: ``backoff * 2**failures`` capped at
  ``max_backoff``), so the next read of it (a later batch with ``on_error="skip"``, the
  next epoch) downloads it anew: an outage longer than the retries costs the reads that
  fell inside it, not the rest of the run.

A :class:`CancelToken` ends transfers at once: ``cancel()`` shuts the sockets of those in
flight (:mod:`.transport`), wakes backoff sleeps, and makes them raise :class:`Cancelled`.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Dict, Optional, TypeVar, Union

__all__ = ["Retry", "CancelToken", "Cancelled"]

T = TypeVar("T")


class Cancelled(Exception):
    """The transfer was cancelled (its dataset was closed)."""


class CancelToken:
    """Cancels the transfers that registered with it (see :mod:`.transport`)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._closers: Dict[int, Callable[[], None]] = {}
        self._next = 0

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raises :class:`Cancelled` once cancelled."""
        if self._event.is_set():
            raise Cancelled()

    def wait(self, seconds: float) -> bool:
        """Sleeps ``seconds`` or until cancelled; whether it was cancelled."""
        return self._event.wait(max(0.0, seconds))

    def on_cancel(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Calls ``fn`` when cancelled (at once if it is already); returns the function
        that unregisters it."""
        with self._lock:
            if not self._event.is_set():
                key = self._next
                self._next += 1
                self._closers[key] = fn

                def remove() -> None:
                    with self._lock:
                        self._closers.pop(key, None)

                return remove
        fn()
        return lambda: None

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            closers = list(self._closers.values())
            self._closers.clear()
        for fn in closers:
            try:
                fn()
            except Exception:  # a socket already gone
                pass


class Retry:
    """The retry budget of a remote dataset (see the module's docstring).

    Args:
        retries: attempts after the first, per download.
        backoff: seconds before the first retry; doubles each time.
        max_backoff: the longest wait between attempts, and the longest cool-down
            before a failed shard may be fetched again.
        deadline: no attempt of one download starts later than this many seconds after
            its first.
    """

    __slots__ = ("retries", "backoff", "max_backoff", "deadline")

    def __init__(self, retries: int = 4, backoff: float = 0.25, max_backoff: float = 30.0,
                 deadline: float = 120.0):
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        for name, v in (("backoff", backoff), ("max_backoff", max_backoff),
                        ("deadline", deadline)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")
        self.retries, self.backoff = retries, float(backoff)
        self.max_backoff, self.deadline = float(max_backoff), float(deadline)

    @classmethod
    def of(cls, value: Union[None, int, Dict[str, Any], "Retry"]) -> "Retry":
        """A Retry from what users pass: None (the defaults), an int (``retries``), a
        dict of the arguments, or a Retry."""
        if value is None:
            return cls()
        if isinstance(value, Retry):
            return value
        if isinstance(value, dict):
            return cls(**value)
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(retries=value)
        raise TypeError(f"retry must be a stoker.remote.Retry, a dict or an int, got {value!r}")

    def replace(self, **kw: Any) -> "Retry":
        d = {k: getattr(self, k) for k in self.__slots__}
        d.update({k: v for k, v in kw.items() if v is not None})
        return Retry(**d)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1, 2, ...), with jitter."""
        base = min(self.backoff * (2 ** (attempt - 1)), self.max_backoff)
        return base * (0.5 + random.random() / 2)

    def cooldown(self, failures: int) -> float:
        """Seconds a shard stays failed after its ``failures``-th failed download in a
        row, before its next read may fetch it again."""
        return min(self.backoff * (2 ** max(0, failures - 1)), self.max_backoff)

    def run(self, attempt: Callable[[], T], what: str, *, transient: type, permanent: type,
            error: type, cancel: Optional[CancelToken] = None,
            on_retry: Optional[Callable[[], None]] = None) -> T:
        """``attempt()`` until it returns, under this budget. ``transient`` exceptions are
        retried, ``permanent`` ones raise ``error(f"{what}: {reason}")`` at once, and so
        does the last transient one, with the number of attempts; :class:`Cancelled`
        passes through."""
        start = time.monotonic()
        last = ""
        tries = 0
        for k in range(self.retries + 1):
            if k:
                if time.monotonic() - start > self.deadline:
                    break
                if on_retry is not None:
                    on_retry()
                delay = self.delay(k)
                if cancel is not None:
                    if cancel.wait(delay):
                        raise Cancelled()
                else:
                    time.sleep(delay)
            tries += 1
            try:
                return attempt()
            except permanent as e:
                raise error(f"{what}: {e}") from None
            except transient as e:
                last = str(e)
        raise error(f"{what}: {last} (after {tries} attempt{'s' if tries != 1 else ''})")

    def __repr__(self) -> str:
        return (f"Retry(retries={self.retries}, backoff={self.backoff:g}, "
                f"max_backoff={self.max_backoff:g}, deadline={self.deadline:g})")
