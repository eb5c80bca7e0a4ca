"""Converters from common on-disk layouts to stoker datasets.

``stoker convert imagefolder SRC OUT`` (see :mod:`stoker.convert.imagefolder`), or from
Python::

    from stoker.convert import convert_imagefolder
    convert_imagefolder("imagenet/train", "data/train")
"""

from .imagefolder import convert_imagefolder

__all__ = ["convert_imagefolder"]
