"""A reader of ``tf.train.Example`` in protobuf wire format, without TensorFlow or protoc.

The messages (``tensorflow/core/example/{example,feature}.proto``)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      // entries: key = 1, value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Parsed as protobuf parsers do: packed and unpacked repeated scalars are both accepted,
unknown fields are skipped, a repeated embedded message merges, the last map entry for a
key wins, and in the oneof the last member seen wins. Anything malformed (a truncated
varint or length, a wire type that does not match) raises :class:`MalformedExample`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import numpy as np

__all__ = ["MalformedExample", "parse_example", "BYTES", "FLOAT", "INT64"]

BYTES, FLOAT, INT64 = "bytes", "float", "int64"

#: a feature: (kind or None for an empty Feature, values)
FeatureValue = Tuple[Optional[str], Union[List[bytes], np.ndarray]]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_EMPTY_F = np.zeros(0, np.float32)
_EMPTY_I = np.zeros(0, np.int64)


class MalformedExample(ValueError):
    """The bytes are not a valid serialized ``tf.train.Example``."""


def _varint(buf: bytes, pos: int, end: int) -> Tuple[int, int]:
    if pos >= end:
        raise MalformedExample("truncated varint")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result, shift = b & 0x7F, 7
    pos += 1
    while True:
        if pos >= end:
            raise MalformedExample("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise MalformedExample("varint longer than 10 bytes")


def _length(buf: bytes, pos: int, end: int) -> Tuple[int, int]:
    n, pos = _varint(buf, pos, end)
    if n > end - pos:
        raise MalformedExample(f"length {n} runs past the end of its message")
    return pos + n, pos


def _skip(buf: bytes, pos: int, end: int, wire: int) -> int:
    if wire == _VARINT:
        return _varint(buf, pos, end)[1]
    if wire == _LEN:
        return _length(buf, pos, end)[0]
    size = {_I64: 8, _I32: 4}.get(wire)
    if size is None:  # groups (3, 4) are not used by these messages; 6, 7 are invalid
        raise MalformedExample(f"unsupported wire type {wire}")
    if pos + size > end:
        raise MalformedExample("truncated fixed-width field")
    return pos + size


def _varints(buf: bytes, pos: int, end: int) -> np.ndarray:
    """A packed run of varints as int64 (two's complement, as protobuf's int64)."""
    n = end - pos
    if n == 0:
        return _EMPTY_I
    if n <= 16:
        vals = []
        while pos < end:
            v, pos = _varint(buf, pos, end)
            vals.append(v)
        return np.array(vals, dtype=np.uint64).view(np.int64)
    b = np.frombuffer(buf, np.uint8, count=n, offset=pos)
    last = b < 0x80
    if not last[-1]:
        raise MalformedExample("truncated varint in a packed int64 list")
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise MalformedExample("varint longer than 10 bytes")
    within = np.arange(n, dtype=np.uint64) - np.repeat(starts, lengths).astype(np.uint64)
    # the groups' bits do not overlap, so a sum is their OR; bits past 64 drop out
    parts = (b & 0x7F).astype(np.uint64) << (within * np.uint64(7))
    return np.add.reduceat(parts, starts).view(np.int64)


def _parse_list(buf: bytes, pos: int, end: int, kind: str):
    """The values of a BytesList / FloatList / Int64List spanning buf[pos:end]."""
    out: list = []
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field != 1:
            pos = _skip(buf, pos, end, wire)
            continue
        if kind == BYTES:
            if wire != _LEN:
                raise MalformedExample(f"BytesList value with wire type {wire}")
            stop, pos = _length(buf, pos, end)
            out.append(buf[pos:stop])
            pos = stop
        elif kind == FLOAT:
            if wire == _LEN:
                stop, pos = _length(buf, pos, end)
                if (stop - pos) % 4:
                    raise MalformedExample("packed float list length is not a multiple of 4")
                out.append(np.frombuffer(buf, "<f4", count=(stop - pos) // 4, offset=pos))
                pos = stop
            elif wire == _I32:
                if pos + 4 > end:
                    raise MalformedExample("truncated float")
                out.append(np.frombuffer(buf, "<f4", count=1, offset=pos))
                pos += 4
            else:
                raise MalformedExample(f"FloatList value with wire type {wire}")
        else:
            if wire == _LEN:
                stop, pos = _length(buf, pos, end)
                out.append(_varints(buf, pos, stop))
                pos = stop
            elif wire == _VARINT:
                v, pos = _varint(buf, pos, end)
                out.append(np.array([v], dtype=np.uint64).view(np.int64))
            else:
                raise MalformedExample(f"Int64List value with wire type {wire}")
    if kind == BYTES:
        return out
    if not out:
        return _EMPTY_F if kind == FLOAT else _EMPTY_I
    arr = out[0] if len(out) == 1 else np.concatenate(out)
    return arr.astype(np.float32 if kind == FLOAT else np.int64, copy=False)


_KINDS = {1: BYTES, 2: FLOAT, 3: INT64}


def _parse_feature(buf: bytes, pos: int, end: int) -> FeatureValue:
    kind: Optional[str] = None
    values: Union[List[bytes], np.ndarray] = []
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        k = _KINDS.get(field)
        if k is None:
            pos = _skip(buf, pos, end, wire)
            continue
        if wire != _LEN:
            raise MalformedExample(f"Feature field {field} with wire type {wire}")
        stop, pos = _length(buf, pos, end)
        new = _parse_list(buf, pos, stop, k)
        if k == kind:  # the same oneof member again: the messages merge
            values = values + new if k == BYTES else np.concatenate([values, new])
        else:
            kind, values = k, new
        pos = stop
    return kind, values


def _parse_features(buf: bytes, pos: int, end: int, out: Dict[str, FeatureValue]) -> None:
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field != 1:
            pos = _skip(buf, pos, end, wire)
            continue
        if wire != _LEN:
            raise MalformedExample(f"Features entry with wire type {wire}")
        stop, pos = _length(buf, pos, end)
        name: Optional[str] = None
        value: FeatureValue = (None, [])
        while pos < stop:  # one map entry
            k, pos = _varint(buf, pos, stop)
            f, w = k >> 3, k & 7
            if f in (1, 2) and w == _LEN:
                s, pos = _length(buf, pos, stop)
                if f == 1:
                    try:
                        name = buf[pos:s].decode("utf-8")
                    except UnicodeDecodeError:
                        raise MalformedExample("feature name is not UTF-8") from None
                else:
                    value = _parse_feature(buf, pos, s)
                pos = s
            else:
                pos = _skip(buf, pos, stop, w)
        out["" if name is None else name] = value
        pos = stop


def parse_example(buf: bytes) -> Dict[str, FeatureValue]:
    """``{feature name: (kind, values)}`` of one serialized ``tf.train.Example``.

    ``kind`` is ``"bytes"`` (values: list of bytes), ``"float"`` (float32 array),
    ``"int64"`` (int64 array) or None for a Feature with no list set.
    """
    out: Dict[str, FeatureValue] = {}
    end = len(buf)
    pos = 0
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field == 1 and wire == _LEN:
            stop, pos = _length(buf, pos, end)
            _parse_features(buf, pos, stop, out)
            pos = stop
        elif field == 1:
            raise MalformedExample(f"Example.features with wire type {wire}")
        else:
            pos = _skip(buf, pos, end, wire)
    return out

