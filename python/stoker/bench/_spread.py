"""Repeated measurements: a median with its spread, and whether two differ beyond it.

A benchmark on a shared machine moves from run to run (batch 64 of one sweep measured
6,356 then 11,477 samples/s), so one run proves nothing. Every figure the benchmarks print
is the median of its runs with their range, and a difference is called real only when it is
larger than that range: the two ranges are apart, by more than the wider of them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, List, Sequence

__all__ = ["Runs", "change_text", "differs", "share_text"]


@dataclass
class Runs:
    """The values of one figure over repeated runs."""

    values: List[float] = field(default_factory=list)

    def add(self, v: float) -> None:
        self.values.append(float(v))

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0

    @property
    def lo(self) -> float:
        return min(self.values) if self.values else 0.0

    @property
    def hi(self) -> float:
        return max(self.values) if self.values else 0.0

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def relative(self) -> float:
        """The range as a fraction of the median (0 for one run)."""
        return self.width / self.median if self.median else 0.0

    def text(self, fmt: Callable[[float], str] = "{:,.0f}".format, unit: str = "") -> str:
        """``"330,000 samples/s (300,000-350,000, 3 runs)"``; one run says so."""
        unit = f" {unit}" if unit else ""
        if self.n <= 1:
            return f"{fmt(self.median)}{unit} (1 run: spread unknown)"
        return f"{fmt(self.median)}{unit} ({fmt(self.lo)}-{fmt(self.hi)}, {self.n} runs)"


def differs(a: Runs, b: Runs) -> bool:
    """Whether `a` and `b` differ beyond their spread: at least 2 runs each, ranges apart,
    and the gap between the medians larger than the wider range."""
    if a.n < 2 or b.n < 2:
        return False
    apart = a.lo > b.hi or b.lo > a.hi
    return apart and abs(a.median - b.median) > max(a.width, b.width)


def change_text(before: float, after: float) -> str:
    """The change from `before` to `after` as a signed percentage, rounded so that it never
    reads as another sign or as no change: ``"+12%"``, ``"-4.6%"``, ``"-0.3%"``, ``"0%"``
    (a two-digit change to the percent, a smaller one to a tenth)."""
    pct = 100 * (after / max(before, 1e-12) - 1)
    if round(pct, 1) == 0:
        return "0%"
    return f"{pct:+.0f}%" if abs(pct) >= 9.5 else f"{pct:+.1f}%"


def share_text(name: str, shares: Sequence[float]) -> str:
    """``"decode 71% (68-74%)"`` of per-run fractions."""
    r = Runs(list(shares))
    if r.n <= 1:
        return f"{name} {100 * r.median:.0f}%"
    return f"{name} {100 * r.median:.0f}% ({100 * r.lo:.0f}-{100 * r.hi:.0f}%)"
