"""Converters from common on-disk layouts to stoker datasets.

``stoker convert imagefolder SRC OUT`` (see :mod:`stoker.convert.imagefolder`), or from
Python::

    from stoker.convert import convert_imagefolder
    convert_imagefolder("imagenet/train", "data/train")

Token documents for language models: ``stoker convert jsonl|parquet|hf SRC OUT --tokenizer
...`` (:mod:`stoker.convert.text`) and ``stoker convert megatron|nanogpt SRC OUT``
(:mod:`stoker.convert.tokens`).
"""

from .imagefolder import convert_imagefolder
from .text import convert_text
from .tokens import convert_tokens

__all__ = ["convert_imagefolder", "convert_text", "convert_tokens"]
