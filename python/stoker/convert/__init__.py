"""Converters from common on-disk layouts to stoker datasets.

``stoker convert imagefolder|tfrecord|webdataset SRC OUT`` and ``stoker merge PART... OUT``,
or from Python::

    from stoker.convert import convert_imagefolder, convert_tfrecord, convert_webdataset, merge
    convert_imagefolder("imagenet/train", "data/train")
    convert_tfrecord("tfrecords/", "data/train")          # tf.train.Example, no TensorFlow
    convert_webdataset("shards/", "data/train")           # WebDataset .tar shards
    merge(["parts/part-000000", "parts/part-000001"], "data/train")

Token documents for language models: ``stoker convert jsonl|parquet|hf SRC OUT --tokenizer
...`` (:mod:`stoker.convert.text`) and ``stoker convert megatron|nanogpt SRC OUT``
(:mod:`stoker.convert.tokens`).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import InputError
from ._workers import WorkerError

# `merge` (the function) is bound eagerly: it shares its name with its module
from .merge import merge, write_part

__all__ = ["InputError", "WorkerError", "convert_imagefolder", "convert_text",
           "convert_tfrecord", "convert_tokens", "convert_webdataset", "merge", "write_part"]

# the converters, imported when first used (the command line imports only the one it runs)
_LAZY = {"convert_imagefolder": "imagefolder", "convert_text": "text",
         "convert_tfrecord": "tfrecord", "convert_tokens": "tokens",
         "convert_webdataset": "webdataset"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
