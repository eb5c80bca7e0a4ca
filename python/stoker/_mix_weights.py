"""The weights of a mixture (:class:`stoker.Mix`, stoker/mix.py): each weight read as an
exact fraction, a source's weights checked and normalised, and constant weights as whole
rows of each source per period (csrc/sampler/mixture.h).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any, List, Mapping, Sequence

# Constant weights become exact fractions m_s / P (csrc/sampler/mixture.h): a float is
# read as the simplest fraction within this denominator (0.7 -> 7/10), and weights whose
# common denominator exceeds the largest period are rounded to it.
_FLOAT_DENOMINATOR = 10**6
_MAX_PERIOD = 1 << 20


def _number(where: str, name: str, value: Any, *, zero_ok: bool) -> Fraction:
    """A weight as an exact fraction (ints and fractions exactly, floats as the simplest
    fraction within 1e-6 relative), or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: the weight of {name!r} must be a number, got {value!r}")
    if isinstance(value, numbers.Rational):
        fr = Fraction(int(value.numerator), int(value.denominator))
    else:
        x = float(value)
        if not math.isfinite(x):
            raise ValueError(f"{where}: the weight of {name!r} must be finite, got {value!r}")
        fr = Fraction(x)
        near = fr.limit_denominator(_FLOAT_DENOMINATOR)
        if near and abs(near - fr) <= abs(fr) * 1e-12:
            fr = near
    if fr < 0 or (fr == 0 and not zero_ok):
        raise ValueError(f"{where}: the weight of {name!r} must be "
                         f"{'>= 0' if zero_ok else 'positive'}, got {value!r}")
    return fr


def _weights(where: str, names: Sequence[str], weights: Any, *, zero_ok: bool) -> List[Fraction]:
    if not isinstance(weights, Mapping):
        raise ValueError(f"{where}: weights must be a dict {{source name: weight}}, got "
                         f"{type(weights).__name__}")
    missing = [n for n in names if n not in weights]
    unknown = [k for k in weights if k not in names]
    if unknown:
        raise ValueError(f"{where}: no source named {unknown[0]!r} (sources: "
                         f"{', '.join(names)})")
    if missing:
        raise ValueError(f"{where}: no weight for source {missing[0]!r}")
    out = [_number(where, n, weights[n], zero_ok=zero_ok) for n in names]
    if sum(out) <= 0:
        raise ValueError(f"{where}: no positive weight")
    total = sum(out)
    return [w / total for w in out]


def rational_counts(weights: Sequence[Fraction]) -> List[int]:
    """Rows of each source per period of constant weights (normalised fractions, each
    positive): exact when their common denominator is at most 2**20, else the largest
    remainders of ``w * 2**20`` (each weight moves by less than 2**-20)."""
    period = 1
    for w in weights:
        period = period * w.denominator // math.gcd(period, w.denominator)
        if period > _MAX_PERIOD:
            break
    if period <= _MAX_PERIOD:
        return [int(w * period) for w in weights]
    exact = [w * _MAX_PERIOD for w in weights]
    counts = [max(1, math.floor(x)) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
    for i in order[: _MAX_PERIOD - sum(counts)]:
        counts[i] += 1
    while sum(counts) > _MAX_PERIOD:  # sources lifted to one row: taken from the largest
        counts[max(range(len(counts)), key=lambda i: (counts[i], -i))] -= 1
    return counts

