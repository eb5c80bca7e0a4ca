"""Field types: what a dataset's samples hold and how each is stored.

A schema is a dict ``{name: field}``::

    fields = {
        "image": stoker.image(),                          # encoded JPEG/PNG, decoded in C++
        "label": stoker.scalar("int64"),
        "x": stoker.ndarray("float32", (3, 32, 32)),      # fixed shape
        "tokens": stoker.ndarray("int32", (None,)),       # variable length, padded per batch
        "raw": stoker.blob(),                             # opaque bytes
    }

Video and audio files are ``stoker.video()`` and ``stoker.audio()`` (stoker/_media_fields.py).

Every field type is a small subclass of :class:`Field` with a fixed contract:
``encode`` validates one value and returns its bytes, ``decode`` turns stored
bytes back into a value, ``spec`` is the JSON stored in ``index.json``. The checks and
byte layouts behind ``encode`` (dtypes, arrays, raw pixel records) are in
stoker/_field_encoding.py; ``raw_record``, ``raw_pixels`` and ``RAW_MAGIC`` are here too.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._field_encoding import (
    _ITEMSIZES,
    _JPEG_MAGIC,
    _PNG_MAGIC,
    MAX_RECORD_BYTES,
    RAW_MAGIC,
    _as_array,
    _check_dtype,
    _is_int,
    box_record,
    image_pixels,
    keypoint_record,
    pixel_record,
    raw_pixels,
    raw_record,
    raw_shape,
)
from ._field_encoding import RAW_HEADER_BYTES as RAW_HEADER_BYTES
from ._field_encoding import RAW_VERSION as RAW_VERSION
from ._field_encoding import is_raw_record as is_raw_record

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Field", "Scalar", "NDArray", "Blob", "Image", "Tokens", "Boxes", "KeyPoints", "scalar",
           "ndarray", "blob", "image", "tokens", "boxes", "keypoints"]


class _Typed:
    """A field of one dtype: ``dtype`` (a little-endian NumPy dtype) is made on first use."""

    _dtype_name: str
    _dtype: Optional["np.dtype[Any]"] = None

    @property
    def dtype(self) -> "np.dtype[Any]":
        if self._dtype is None:
            import numpy as np

            self._dtype = np.dtype(self._dtype_name).newbyteorder("<")
        return self._dtype


class Field:
    """Base class of field types. Subclasses set ``kind`` and implement the contract."""

    kind: str = ""

    def encode(self, value: Any, what: str = "value") -> bytes:
        """Validates `value` and returns the bytes stored for it; ValueError when invalid."""
        raise NotImplementedError

    def decode(self, payload: bytes) -> Any:
        """The value for stored bytes (what ``Dataset[i]`` returns)."""
        raise NotImplementedError

    def spec(self) -> Dict[str, Any]:
        """JSON description stored in index.json."""
        return {"kind": self.kind}

    @staticmethod
    def from_spec(spec: Mapping[str, Any]) -> "Field":
        kind = spec.get("kind")
        if kind == "scalar":
            return Scalar(spec["dtype"])
        if kind == "ndarray":
            return NDArray(spec["dtype"], tuple(None if d is None or d < 0 else d
                                                 for d in spec["shape"]))
        if kind == "blob":
            return Blob()
        if kind == "image":
            return Image(layout=spec.get("layout", "HWC"), mode=spec.get("mode", "RGB"),
                         storage=spec.get("storage", "encoded"),
                         smart_pixels=spec.get("smart_pixels", DEFAULT_SMART_PIXELS))
        if kind == "boxes":
            return Boxes(spec["format"], bool(spec["normalized"]))
        if kind == "keypoints":
            return KeyPoints(int(spec["num_keypoints"]), bool(spec.get("normalized", False)))
        if kind == "tokens":
            return Tokens(spec["dtype"])
        if kind in SPEC_MAKERS:
            return SPEC_MAKERS[kind](spec)  # type: ignore[no-any-return]
        raise ValueError(f"unknown field kind {kind!r}")

    def _core_spec(self, name: str) -> Dict[str, Any]:
        return {"name": name, "kind": self.kind}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Field) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash(json.dumps(self.spec(), sort_keys=True))


class Scalar(_Typed, Field):
    """One number per sample; batches as a 1-D tensor of ``dtype``."""

    kind = "scalar"

    def __init__(self, dtype: Any):
        self._dtype_name = _check_dtype(dtype)

    def encode(self, value: Any, what: str = "value") -> bytes:
        arr = _as_array(value, self.dtype, what)
        if arr.shape != ():
            raise ValueError(f"{what}: expected a scalar, got shape {arr.shape}")
        return arr.tobytes()

    def decode(self, payload: bytes) -> Any:
        import numpy as np

        return np.frombuffer(payload, dtype=self.dtype)[0]

    def spec(self) -> Dict[str, Any]:
        return {"kind": self.kind, "dtype": self._dtype_name}

    def _core_spec(self, name: str) -> Dict[str, Any]:
        return {"name": name, "kind": self.kind, "dtype": self._dtype_name, "shape": []}

    def __repr__(self) -> str:
        return f"stoker.scalar({self._dtype_name!r})"


class NDArray(_Typed, Field):
    """An array per sample. ``shape`` is fixed, except that the first dimension may be
    ``None`` (variable length): such a field batches padded with zeros to the longest
    sample, with the lengths in ``"<name>_lengths"``."""

    kind = "ndarray"

    def __init__(self, dtype: Any, shape: Sequence[Optional[int]]):
        self._dtype_name = _check_dtype(dtype)
        shape = tuple(shape)
        for i, d in enumerate(shape):
            if d is None and i == 0:
                continue
            if d is None or not _is_int(d) or d < 0:
                raise ValueError(
                    f"ndarray shape {shape}: dimensions must be non-negative ints "
                    "(only the first may be None)")
        self.shape: Tuple[Optional[int], ...] = tuple(None if d is None else int(d)
                                                      for d in shape)
        # a fixed sample, or one row of a variable one, must fit a record (u32 lengths)
        row = _ITEMSIZES[self._dtype_name] * math.prod(d for d in self.shape if d is not None)
        if row > MAX_RECORD_BYTES:
            raise ValueError(f"ndarray shape {shape}: {row} bytes per sample"
                             f"{' row' if self.variable else ''} exceeds a record's limit "
                             f"of {MAX_RECORD_BYTES} bytes")

    @property
    def variable(self) -> bool:
        return bool(self.shape) and self.shape[0] is None

    def encode(self, value: Any, what: str = "value") -> bytes:
        arr = _as_array(value, self.dtype, what)
        ok = arr.ndim == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, arr.shape))
        if not ok:
            want = tuple("None" if d is None else d for d in self.shape)
            raise ValueError(f"{what}: expected shape ({', '.join(map(str, want))}), "
                             f"got {arr.shape}")
        return arr.tobytes(order="C")

    def decode(self, payload: bytes) -> np.ndarray:
        import numpy as np

        arr = np.frombuffer(payload, dtype=self.dtype)
        return arr.reshape([-1 if d is None else d for d in self.shape])

    def spec(self) -> Dict[str, Any]:
        return {"kind": self.kind, "dtype": self._dtype_name, "shape": list(self.shape)}

    def _core_spec(self, name: str) -> Dict[str, Any]:
        return {"name": name, "kind": self.kind, "dtype": self._dtype_name,
                "shape": [-1 if d is None else d for d in self.shape]}

    def __repr__(self) -> str:
        return f"stoker.ndarray({self._dtype_name!r}, {self.shape})"


class Blob(Field):
    """Opaque bytes per sample; batches as padded ``uint8`` plus ``"<name>_lengths"``."""

    kind = "blob"

    def encode(self, value: Any, what: str = "value") -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise ValueError(f"{what}: expected bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, payload: bytes) -> bytes:
        return bytes(payload)

    def _core_spec(self, name: str) -> Dict[str, Any]:
        return {"name": name, "kind": self.kind, "dtype": "uint8", "shape": []}

    def __repr__(self) -> str:
        return "stoker.blob()"


# storage="smart": images of at most this many pixels are stored raw, larger ones encoded.
DEFAULT_SMART_PIXELS = 512 * 512
_STORAGES = ("encoded", "raw", "smart")


class Image(Field):
    """An image per sample, decoded by the loader's worker threads to 8-bit ``uint8``, in
    ``layout`` ``"HWC"`` (interleaved, what the codecs write) or ``"CHW"`` (planar): RGB
    with ``mode="RGB"``, one channel with ``mode="L"`` (grayscale; a segmentation mask of
    class ids stored as a grayscale PNG). The loader delivers both layouts as
    ``[N, C, H, W]`` (HWC as that memory with ``channels_last`` strides) unless
    ``image_layout="HWC"`` is given. In a group of transformed fields, an ``"L"`` image is
    a mask: resized and warped with nearest-neighbour sampling, untouched by colour ops.

    ``storage`` says what a record holds:

    * ``"encoded"`` (default): the JPEG or PNG bytes as written; ``Dataset[i]`` returns them.
    * ``"raw"``: decoded pixels (a 16-byte header, then the rows), which the loader reads
      straight into its crops and resizes with no decode: several times faster per image,
      at 3 bytes a pixel on disk (FFCV's ``"raw"`` write mode). ``write`` takes a ``uint8``
      array ``(h, w, 3)`` (``(h, w)`` for ``mode="L"``) or JPEG/PNG bytes, which are
      decoded once, by stoker's own decoder (so the pixels are the ones the loader would
      decode); ``Dataset[i]`` returns the array.
    * ``"smart"``: raw for images of at most ``smart_pixels`` pixels, encoded above (bytes
      are kept as they are; a large array is JPEG-encoded at quality 90), FFCV's
      ``"smart"``: small images, whose decode costs most per byte, load fastest, and large
      ones keep their size on disk.

    The loader reads every kind whatever the field says, so one dataset may hold both."""

    kind = "image"

    def __init__(self, layout: str = "HWC", mode: str = "RGB", storage: str = "encoded",
                 smart_pixels: int = DEFAULT_SMART_PIXELS):
        if layout not in ("HWC", "CHW"):
            raise ValueError(f"image layout must be 'HWC' or 'CHW', got {layout!r}")
        if mode not in ("RGB", "L"):
            raise ValueError(f"image mode must be 'RGB' or 'L', got {mode!r}")
        if storage not in _STORAGES:
            raise ValueError(f"image storage must be one of {', '.join(map(repr, _STORAGES))}, "
                             f"got {storage!r}")
        if not _is_int(smart_pixels) or smart_pixels < 1:
            raise ValueError(f"smart_pixels must be a positive int, got {smart_pixels!r}")
        self.layout = layout
        self.mode = mode
        self.storage = storage
        self.smart_pixels = int(smart_pixels)

    @property
    def channels(self) -> int:
        return 1 if self.mode == "L" else 3

    def encode(self, value: Any, what: str = "value") -> bytes:
        if self.storage != "encoded" and not isinstance(value, (bytes, bytearray, memoryview)):
            return pixel_record(value, self.mode, self.storage, self.smart_pixels, what)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise ValueError(f"{what}: expected encoded JPEG or PNG bytes, got "
                             f"{type(value).__name__}")
        data = bytes(value)
        if data.startswith(RAW_MAGIC):
            try:
                channels = raw_shape(data)[2]
            except ValueError as e:
                raise ValueError(f"{what}: {e}") from None
            if channels != self.channels:
                raise ValueError(f"{what}: a raw record of {channels} channel(s) for an "
                                 f"image of mode {self.mode!r}")
            return data
        if not (data.startswith(_JPEG_MAGIC) or data.startswith(_PNG_MAGIC)):
            raise ValueError(f"{what}: not a JPEG or PNG (starts with {data[:8]!r})")
        if self.storage == "encoded":
            return data
        if self.storage == "smart":
            from . import _core

            try:
                h, w = _core.image_size(data)
            except _core.DecodeError as e:
                raise ValueError(f"{what}: {e}") from None
            if h * w > self.smart_pixels:
                return data
        return raw_record(image_pixels(data, self.mode, what))

    def decode(self, payload: bytes) -> Any:
        if bytes(payload[:4]) == RAW_MAGIC:
            return raw_pixels(bytes(payload))
        return bytes(payload)

    def spec(self) -> Dict[str, Any]:
        # "mode" only when not RGB, "storage" only when not encoded: the specs (and schema
        # hashes) of images written before these existed stay the same
        spec: Dict[str, Any] = {"kind": self.kind, "layout": self.layout}
        if self.mode != "RGB":
            spec["mode"] = self.mode
        if self.storage != "encoded":
            spec["storage"] = self.storage
            if self.storage == "smart":
                spec["smart_pixels"] = self.smart_pixels
        return spec

    def __repr__(self) -> str:
        mode = f", mode={self.mode!r}" if self.mode != "RGB" else ""
        storage = f", storage={self.storage!r}" if self.storage != "encoded" else ""
        if self.storage == "smart" and self.smart_pixels != DEFAULT_SMART_PIXELS:
            storage += f", smart_pixels={self.smart_pixels}"
        return f"stoker.image(layout={self.layout!r}{mode}{storage})"


_BOX_FORMATS = ("xyxy", "xywh", "cxcywh")


class Boxes(NDArray):
    """Axis-aligned boxes per sample: ``float32`` rows of 4, a variable number of them, in
    ``format`` ``"xyxy"`` (corners), ``"xywh"`` (COCO: corner and size) or ``"cxcywh"``
    (centre and size); pixel coordinates, or fractions of the image size when
    ``normalized`` (YOLO labels are ``cxcywh`` normalised). Batches like
    ``ndarray("float32", (None, 4))``: padded, with ``"<name>_lengths"``.

    In a transform group with an image, boxes follow the image's crops, flips, resizes,
    padding, rotations and warps; those that leave the image (or keep too little of it)
    are dropped together with the same rows of the group's other per-box fields.
    """

    kind = "boxes"

    def __init__(self, format: str = "xyxy", normalized: bool = False):
        if format not in _BOX_FORMATS:
            raise ValueError(f"box format must be one of {', '.join(map(repr, _BOX_FORMATS))}, "
                             f"got {format!r}")
        if not isinstance(normalized, bool):
            raise ValueError(f"normalized must be True or False, got {normalized!r}")
        super().__init__("float32", (None, 4))
        self.format = format
        self.normalized = normalized

    def encode(self, value: Any, what: str = "value") -> bytes:
        return box_record(value, self.format, what)

    def spec(self) -> Dict[str, Any]:
        return {"kind": self.kind, "format": self.format, "normalized": self.normalized}

    def _core_spec(self, name: str) -> Dict[str, Any]:
        return {"name": name, "kind": "ndarray", "dtype": "float32", "shape": [-1, 4]}

    def __repr__(self) -> str:
        norm = ", normalized=True" if self.normalized else ""
        return f"stoker.boxes(format={self.format!r}{norm})"


class KeyPoints(NDArray):
    """``num_keypoints`` keypoints per instance, a variable number of instances per sample:
    ``float32`` ``(n, num_keypoints, 3)`` rows of (x, y, visibility), COCO's convention
    (0: not labelled, 1: labelled but hidden, 2: visible); ``(n, num_keypoints, 2)`` is
    accepted on write, as visible points. Pixel coordinates, or fractions of the image size
    when ``normalized``. Batches like ``ndarray("float32", (None, k, 3))``.

    In a transform group, keypoints follow the image; one moved off the image becomes
    (0, 0, 0). A horizontal flip takes ``flip_pairs`` to swap left and right.
    """

    kind = "keypoints"

    def __init__(self, num_keypoints: int, normalized: bool = False):
        if not _is_int(num_keypoints) or num_keypoints < 1:
            raise ValueError(f"keypoints: num_keypoints must be a positive int, got "
                             f"{num_keypoints!r}")
        if not isinstance(normalized, bool):
            raise ValueError(f"normalized must be True or False, got {normalized!r}")
        super().__init__("float32", (None, int(num_keypoints), 3))
        self.num_keypoints = int(num_keypoints)
        self.normalized = normalized

    def encode(self, value: Any, what: str = "value") -> bytes:
        return keypoint_record(value, self.num_keypoints, what)

    def spec(self) -> Dict[str, Any]:
        spec: Dict[str, Any] = {"kind": self.kind, "num_keypoints": self.num_keypoints}
        if self.normalized:
            spec["normalized"] = True
        return spec

    def _core_spec(self, name: str) -> Dict[str, Any]:
        return {"name": name, "kind": "ndarray", "dtype": "float32",
                "shape": [-1, self.num_keypoints, 3]}

    def __repr__(self) -> str:
        norm = ", normalized=True" if self.normalized else ""
        return f"stoker.keypoints({self.num_keypoints}{norm})"


_TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")


class Tokens(_Typed, Field):
    """A document of token ids per sample: a 1-D array of ``dtype`` (``uint16`` for
    vocabularies up to 65,536 ids, ``uint32`` beyond), checksummed like every record.

    Read by :class:`stoker.TokenDataset` and ``stoker.Loader(..., seq_len=...)`` as token
    documents (windows, packing, token budgets); a plain ``Loader`` without ``seq_len``
    batches it like ``ndarray(dtype, (None,))``: padded, with ``"<name>_lengths"``.
    ``Dataset[i]`` returns the ids as a NumPy array.
    """

    kind = "tokens"

    def __init__(self, dtype: Any = "uint32"):
        name = _check_dtype(dtype)
        if name not in _TOKEN_DTYPES:
            raise ValueError(f"token dtype must be one of {', '.join(_TOKEN_DTYPES)}, "
                             f"got {name!r}")
        self._dtype_name = name

    def encode(self, value: Any, what: str = "value") -> bytes:
        import numpy as np

        try:
            arr = np.asarray(value)
        except Exception as e:  # ragged lists and the like
            raise ValueError(f"{what}: cannot convert {type(value).__name__} to token ids: "
                             f"{e}") from e
        if arr.ndim != 1:
            raise ValueError(f"{what}: token ids must be a 1-D sequence, got shape {arr.shape}")
        if arr.size == 0:
            return b""
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{what}: token ids must be integers, got {arr.dtype.name}")
        lo, hi = int(arr.min()), int(arr.max())
        info = np.iinfo(self.dtype)
        if lo < 0 or hi > info.max:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{what}: token id {bad} is outside {self.dtype.name} "
                             f"[0, {info.max}]")
        return arr.astype(self.dtype, copy=False).tobytes()

    def decode(self, payload: bytes) -> np.ndarray:
        import numpy as np

        return np.frombuffer(payload, dtype=self.dtype)

    def spec(self) -> Dict[str, Any]:
        return {"kind": self.kind, "dtype": self._dtype_name}

    def _core_spec(self, name: str) -> Dict[str, Any]:
        # stored as a variable-length array; the token reader checks the dtype
        return {"name": name, "kind": "ndarray", "dtype": self._dtype_name, "shape": [-1]}

    def __repr__(self) -> str:
        return f"stoker.tokens({self._dtype_name!r})"


def tokens(dtype: Any = "uint32") -> Tokens:
    """A token document per sample, e.g. ``stoker.tokens("uint16")`` for a GPT-2 vocabulary.

    Args:
        dtype: ``"uint16"`` (vocabularies up to 65,536 ids), ``"uint32"``, ``"int32"`` or
            ``"int64"``: the type the ids are stored in (:class:`Tokens`).
    """
    return Tokens(dtype)


def scalar(dtype: Any) -> Scalar:
    """A number per sample, e.g. ``stoker.scalar("int64")`` for a class label.

    Args:
        dtype: a NumPy or torch dtype, or its name (``"int64"``, ``np.float32``,
            ``torch.float16``); batches are 1-D tensors of it.
    """
    return Scalar(dtype)


def ndarray(dtype: Any, shape: Sequence[Optional[int]]) -> NDArray:
    """An array per sample, e.g. ``stoker.ndarray("float32", (3, 32, 32))``, or
    ``stoker.ndarray("int32", (None,))`` for variable-length token sequences.

    Args:
        dtype: a NumPy or torch dtype, or its name.
        shape: every sample's shape; the first dimension may be None (variable length:
            batches are padded with zeros to the longest sample, with the lengths in
            ``"<name>_lengths"``).
    """
    return NDArray(dtype, shape)


def blob() -> Blob:
    """Opaque bytes per sample."""
    return Blob()


def image(layout: str = "HWC", mode: str = "RGB", storage: str = "encoded",
          smart_pixels: int = DEFAULT_SMART_PIXELS) -> Image:
    """An image per sample, decoded to ``uint8`` in ``layout``: RGB, or one channel with
    ``mode="L"`` (grayscale images, segmentation masks). ``storage="encoded"`` keeps the
    JPEG/PNG bytes written, ``"raw"`` stores decoded pixels (no decode when loading),
    ``"smart"`` raw up to ``smart_pixels`` pixels and encoded above (:class:`Image`)::

        fields = {"image": stoker.image(storage="raw"), "label": stoker.scalar("int64")}
        w.write({"image": jpeg_bytes_or_uint8_hwc_array, "label": 3})

    Args:
        layout: ``"HWC"`` (interleaved, what the codecs write) or ``"CHW"`` (planar) for
            the decoded pixels; the loader delivers both as ``[N, C, H, W]`` unless its
            ``image_layout`` says otherwise.
        mode: ``"RGB"``, or ``"L"`` for one channel (grayscale; a mask of class ids).
        storage: ``"encoded"`` (JPEG/PNG bytes as written), ``"raw"`` (decoded pixels,
            no decode when loading) or ``"smart"`` (raw up to ``smart_pixels``).
        smart_pixels: with ``storage="smart"``: images of at most this many pixels are
            stored raw, larger ones encoded (an array is JPEG-encoded at quality 90).
    """
    return Image(layout, mode, storage, smart_pixels)


def boxes(format: str = "xyxy", normalized: bool = False) -> Boxes:
    """Boxes per sample, ``float32`` ``(None, 4)``, e.g. ``stoker.boxes("xywh")`` for COCO or
    ``stoker.boxes("cxcywh", normalized=True)`` for YOLO labels.

    Args:
        format: ``"xyxy"`` (corners), ``"xywh"`` (COCO: corner and size) or
            ``"cxcywh"`` (centre and size).
        normalized: coordinates are fractions of the image's size, not pixels.
    """
    return Boxes(format, normalized)


def keypoints(num_keypoints: int, normalized: bool = False) -> KeyPoints:
    """Keypoints per instance, ``float32`` ``(None, num_keypoints, 3)`` of (x, y, visibility),
    e.g. ``stoker.keypoints(17)`` for COCO person keypoints.

    Args:
        num_keypoints: keypoints per instance (17 for COCO's people).
        normalized: coordinates are fractions of the image's size, not pixels.
    """
    return KeyPoints(num_keypoints, normalized)


# Field kinds defined in other modules (stoker/_media_fields.py: video, audio), each with
# the function that makes one from its spec; they register here when imported (stoker's
# __init__ imports them), so Field.from_spec knows them without importing them.
SPEC_MAKERS: Dict[str, Any] = {}

# -- schema helpers (private) ------------------------------------------------

def check_schema(fields: Mapping[str, Field]) -> Dict[str, Field]:
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError("fields must be a non-empty dict {name: field}")
    out: Dict[str, Field] = {}
    for name, f in fields.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"field names must be non-empty strings, got {name!r}")
        if name.endswith("_lengths"):
            raise ValueError(f"field name {name!r}: the suffix '_lengths' is reserved")
        if not isinstance(f, Field):
            raise ValueError(f"field {name!r}: expected a stoker field (stoker.scalar, "
                             f"stoker.ndarray, ...), got {type(f).__name__}")
        out[name] = f
    return out


def schema_json(fields: Mapping[str, Field]) -> List[Dict[str, Any]]:
    return [{"name": n, **f.spec()} for n, f in fields.items()]


def schema_hash(fields: Mapping[str, Field]) -> int:
    canon = json.dumps(schema_json(fields), sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(canon.encode()).digest()[:8], "little")


def core_specs(fields: Mapping[str, Field]) -> List[Dict[str, Any]]:
    return [f._core_spec(n) for n, f in fields.items()]
