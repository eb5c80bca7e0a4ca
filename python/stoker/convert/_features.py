"""Schemas for converted sources: the ``--features`` override and inference helpers.

A ``--features`` spec is a comma-separated list of ``NAME:TYPE`` (``NAME=TYPE`` works too):

=====================  ==========================================================
``image``              encoded JPEG/PNG bytes (``stoker.image()``)
``blob``               opaque bytes (``stoker.blob()``)
``int64``, ``float32``  one number per sample (``stoker.scalar``); any stoker dtype
``int32[]``            a variable-length list (``stoker.ndarray("int32", (None,))``)
``float32[3,32,32]``   a fixed-size list reshaped (``stoker.ndarray("float32", (3, 32, 32))``)
``skip``               drop the feature
=====================  ==========================================================

When a spec is given, the dataset has exactly the listed fields (in that order); any other
feature of the source is dropped. Names may contain ``/`` (TFRecord keys like
``image/encoded``); a name holding ``:`` or ``,`` cannot be overridden this way.
"""

from __future__ import annotations

import re
from typing import Dict, Optional

from ..fields import Field, blob, image, ndarray, scalar

__all__ = ["parse_features", "SKIP"]

#: Placeholder type of a feature that ``--features`` drops.
SKIP = "skip"

_ARRAY = re.compile(r"^([a-z0-9]+)\[([0-9,\s]*)\]$")


def parse_type(text: str) -> Optional[Field]:
    """``"int64"`` -> scalar, ``"float32[]"`` -> variable ndarray, ``"skip"`` -> None."""
    t = text.strip().lower()
    if t == SKIP:
        return None
    if t == "image":
        return image()
    if t == "blob":
        return blob()
    m = _ARRAY.match(t)
    if m:
        dims = [d.strip() for d in m.group(2).split(",") if d.strip()]
        shape = (None,) if not dims else tuple(int(d) for d in dims)
        return ndarray(m.group(1), shape)
    return scalar(t)


def parse_features(spec: str) -> Dict[str, Optional[Field]]:
    """Parses a ``--features`` spec into ``{name: field or None (skip)}``.

    Example::

        >>> parse_features("image/encoded:image, label:int64, emb:float32[128], id:skip")
    """
    out: Dict[str, Optional[Field]] = {}
    for item in re.split(r",(?![^\[]*\])", spec):  # not the commas of a shape
        item = item.strip()
        if not item:
            continue
        # the type never contains ':' or '=', so split at the last one
        cut = max(item.rfind(":"), item.rfind("="))
        if cut <= 0:
            raise ValueError(f"--features: {item!r} is not NAME:TYPE (e.g. label:int64, "
                             "image:image, emb:float32[128], tokens:int32[], meta:skip)")
        name, typ = item[:cut].strip(), item[cut + 1:]
        if name in out:
            raise ValueError(f"--features: {name!r} given twice")
        try:
            out[name] = parse_type(typ)
        except ValueError as e:
            raise ValueError(f"--features: {name!r}: {e}") from None
    if not any(f is not None for f in out.values()):
        raise ValueError(f"--features {spec!r}: no field left to write")
    return out
