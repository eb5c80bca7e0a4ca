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

from .imagefolder import convert_imagefolder
from .merge import merge, write_part
from .text import convert_text
from .tfrecord import convert_tfrecord
from .tokens import convert_tokens
from .webdataset import convert_webdataset

__all__ = ["convert_imagefolder", "convert_text", "convert_tfrecord", "convert_tokens",
           "convert_webdataset", "merge", "write_part"]
