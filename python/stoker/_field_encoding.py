"""How field values become record bytes (stoker/fields.py): dtype names, values checked as
arrays of a dtype, and the raw pixel records of ``stoker.image(storage="raw")`` and
``"smart"``, with the pixels an image field stores in them.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Tuple

if TYPE_CHECKING:
    import numpy as np

# Largest record the shard format holds: record lengths are u32 (csrc/format/shard_format.h).
MAX_RECORD_BYTES = 0xFFFFFFFF

# NumPy is imported where values are encoded or decoded, not when a schema is built: opening
# a dataset (its index names the fields) and the command line (`stoker inspect`, `merge`)
# then start without it (about 0.15 s). A dtype given as one of these names is checked here;
# anything else (np.float32, "<f4", torch.int64) goes through np.dtype.
_ITEMSIZES = {
    "bool": 1, "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4,
    "uint64": 8, "int64": 8, "float16": 2, "float32": 4, "float64": 8,
}
_DTYPES = tuple(_ITEMSIZES)


def _check_dtype(dtype: Any) -> str:
    """The name of a supported dtype (stored little-endian), or ValueError."""
    if isinstance(dtype, str) and dtype in _ITEMSIZES:
        return dtype
    if type(dtype).__module__ == "torch":  # torch.float32 -> "float32", without importing torch
        dtype = str(dtype).rsplit(".", 1)[-1]
    import numpy as np

    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"unsupported dtype {dtype!r}") from e
    if dt.name not in _DTYPES:
        raise ValueError(f"unsupported dtype {dt.name!r}; use one of {', '.join(_DTYPES)}")
    return dt.name


def _is_int(value: Any) -> bool:
    """An int or a NumPy integer (not a bool); a NumPy integer exists only once NumPy is
    imported, so this does not import it."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.integer)


def _as_array(value: Any, dtype: np.dtype, what: str) -> np.ndarray:
    """Value as an array of `dtype`, refusing anything that would change values."""
    import numpy as np

    if isinstance(value, np.ndarray):
        arr = np.asarray(value)
        if arr.dtype.newbyteorder("=") != dtype.newbyteorder("="):
            raise ValueError(f"{what}: expected dtype {dtype.name}, got {arr.dtype.name}")
        return arr.astype(dtype, copy=False)
    try:
        arr = np.asarray(value)
    except Exception as e:  # ragged lists and the like
        raise ValueError(f"{what}: cannot convert {type(value).__name__} to an array: {e}") from e
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{what}: expected {dtype.name} numbers, got {type(value).__name__}")
    with np.errstate(all="ignore"):
        out = arr.astype(dtype)
    same = np.array_equal(out, arr, equal_nan=arr.dtype.kind == "f" and dtype.kind == "f")
    if arr.dtype.kind == "f" and dtype.kind == "f":
        same = same or np.allclose(out, arr, equal_nan=True, rtol=1e-3)
    if not same or (arr.dtype.kind == "f" and dtype.kind in "biu"):
        raise ValueError(f"{what}: value {value!r} does not fit dtype {dtype.name}")
    return out


def _numbers(value: Any, what: str, kind: str) -> np.ndarray:
    import numpy as np

    try:
        arr = np.asarray(value)
    except Exception as e:  # ragged lists and the like
        raise ValueError(f"{what}: cannot convert {type(value).__name__} to {kind}: {e}") from e
    if arr.dtype.kind not in "biuf" and arr.size:
        raise ValueError(f"{what}: {kind} must be numbers, got {arr.dtype.name}")
    return arr


def box_record(value: Any, format: str, what: str) -> bytes:
    """The record of ``stoker.boxes(format)`` for `value`, ``(n, 4)`` boxes."""
    import numpy as np

    arr = _numbers(value, what, "boxes")
    if arr.ndim == 1 and arr.size == 0:
        arr = arr.reshape(0, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"{what}: boxes must be (n, 4), got shape {arr.shape}")
    arr = arr.astype(np.float32)
    if not np.isfinite(arr).all():
        raise ValueError(f"{what}: boxes must be finite")
    if arr.size and (arr[:, 2:] < (arr[:, :2] if format == "xyxy" else 0)).any():
        bad = "x2 < x1 or y2 < y1" if format == "xyxy" else "a negative width or height"
        raise ValueError(f"{what}: a box has {bad}")
    return np.ascontiguousarray(arr, dtype="<f4").tobytes()


def keypoint_record(value: Any, num_keypoints: int, what: str) -> bytes:
    """The record of ``stoker.keypoints(num_keypoints)`` for `value`, ``(n, k, 3)`` or
    ``(n, k, 2)`` keypoints."""
    import numpy as np

    arr = _numbers(value, what, "keypoints")
    k = num_keypoints
    if arr.size == 0 and arr.ndim <= 1:
        arr = np.zeros((0, k, 3), np.float32)
    if arr.ndim != 3 or arr.shape[1] != k or arr.shape[2] not in (2, 3):
        raise ValueError(f"{what}: keypoints must be (n, {k}, 3) or (n, {k}, 2), "
                         f"got shape {arr.shape}")
    arr = arr.astype(np.float32)
    if arr.shape[2] == 2:
        arr = np.concatenate([arr, np.full(arr.shape[:2] + (1,), 2, np.float32)], 2)
    if not np.isfinite(arr).all():
        raise ValueError(f"{what}: keypoints must be finite")
    return np.ascontiguousarray(arr, dtype="<f4").tobytes()


_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# Raw pixel records (stoker.image(storage="raw")): the layout csrc/codecs/raw_image.h reads.
RAW_MAGIC = b"\x93PIX"
RAW_VERSION = 1
RAW_HEADER_BYTES = 16


def raw_record(pixels: Any) -> bytes:
    """The bytes of a raw pixel record holding `pixels`: uint8 ``(h, w, 3)``, ``(h, w, 1)`` or
    ``(h, w)`` (one channel), stored as they are (csrc/codecs/raw_image.h)."""
    import numpy as np

    arr = np.asarray(pixels)
    if arr.dtype != np.uint8:
        raise ValueError(f"raw image pixels must be uint8, got {arr.dtype.name}")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3) or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"raw image pixels must be (h, w, 3), (h, w, 1) or (h, w), got shape "
                         f"{np.asarray(pixels).shape}")
    h, w, c = arr.shape
    if h * w * c + RAW_HEADER_BYTES > MAX_RECORD_BYTES or max(h, w) > 0x7FFFFFFF:
        raise ValueError(f"raw image of {h}x{w}x{c} exceeds a record's limit")
    head = RAW_MAGIC + bytes([RAW_VERSION, c, 0, 0]) + int(w).to_bytes(4, "little") + \
        int(h).to_bytes(4, "little")
    return head + np.ascontiguousarray(arr).tobytes()


def raw_shape(payload: bytes) -> Tuple[int, int, int]:
    """(h, w, channels) of a raw record, checked against its length; ValueError if it is
    not one."""
    if len(payload) < RAW_HEADER_BYTES or bytes(payload[:4]) != RAW_MAGIC:
        raise ValueError("not a raw pixel record")
    if payload[4] != RAW_VERSION or payload[5] not in (1, 3):
        raise ValueError(f"raw pixel record of version {payload[4]} with {payload[5]} channels")
    c = payload[5]
    w = int.from_bytes(payload[8:12], "little")
    h = int.from_bytes(payload[12:16], "little")
    if w < 1 or h < 1 or len(payload) != RAW_HEADER_BYTES + w * h * c:
        raise ValueError(f"raw pixel record of {h}x{w}x{c} holds {len(payload) - 16} bytes")
    return h, w, c


def raw_pixels(payload: bytes) -> "np.ndarray":
    """The pixels of a raw record, ``(h, w, channels)`` uint8 (a copy); ValueError if it is
    not one."""
    import numpy as np

    shape = raw_shape(payload)
    return np.frombuffer(payload, np.uint8, offset=RAW_HEADER_BYTES).reshape(shape).copy()


def is_raw_record(data: Any) -> bool:
    return isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:4]) == RAW_MAGIC


def image_pixels(data: bytes, mode: str, what: str) -> "np.ndarray":
    """The pixels the loader would decode from `data` (whole, unscaled), for an image of
    `mode` (``stoker.image(mode=...)``)."""
    if mode == "RGB":
        from . import _core

        try:
            return _core.decode_image(data)
        except _core.DecodeError as e:
            raise ValueError(f"{what}: {e}") from None
    import io

    import numpy as np

    try:  # one channel as the loader reads masks: PIL's L and P values, else convert("L")
        from PIL import Image as PILImage
    except ImportError:
        raise ValueError(f"{what}: storing a mode 'L' image raw from encoded bytes needs "
                         "Pillow (pip install pillow), or pass the (h, w) uint8 array"
                         ) from None
    img = PILImage.open(io.BytesIO(data))
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        return (np.asarray(img).astype(np.uint32) >> 8).astype(np.uint8)
    if img.mode not in ("L", "P"):
        img = img.convert("L")
    return np.asarray(img, dtype=np.uint8)


def pixel_record(value: Any, mode: str, storage: str, smart_pixels: int, what: str) -> bytes:
    """The record an image of `mode` and `storage` (``"raw"`` or ``"smart"``) stores for
    the pixels `value`: raw, or JPEG-encoded above `smart_pixels` with ``"smart"``."""
    import numpy as np

    arr = np.asarray(value)
    if arr.dtype != np.uint8:
        raise ValueError(f"{what}: image pixels must be uint8, got {arr.dtype.name}")
    want = "(h, w)" if mode == "L" else "(h, w, 3)"
    if mode == "L" and arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if (mode == "L" and arr.ndim != 2) or \
            (mode == "RGB" and (arr.ndim != 3 or arr.shape[2] != 3)):
        raise ValueError(f"{what}: image pixels must be {want} uint8, got shape {arr.shape}")
    if storage == "smart" and arr.shape[0] * arr.shape[1] > smart_pixels:
        from . import _core

        return _core.encode_jpeg(np.ascontiguousarray(arr), 90)
    try:
        return raw_record(arr)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
