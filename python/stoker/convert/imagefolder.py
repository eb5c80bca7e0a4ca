"""torchvision ``ImageFolder`` layout (``SRC/<class>/**/<image>``) to a stoker dataset.

Classes are the sorted sub-folders of SRC, labelled 0..C-1, and files are found as
torchvision finds them (extensions in ``IMG_EXTENSIONS``, case-insensitive; sub-folders
walked in sorted order), so label ``i`` means the same class as in ``ImageFolder``. The
dataset has fields ``{"image": stoker.image(), "label": stoker.scalar("int64")}`` and
``Dataset(out).metadata == {"classes": [...], "source": ..., "write_options": {...}}``,
where ``write_options`` records ``max_side``, ``quality`` and ``verified``.

JPEG and PNG files are stored byte for byte (no re-encode). Other formats (BMP, TIFF, WebP,
PPM/PGM) are re-encoded as lossless PNG. ``--store raw`` stores every image as decoded
pixels instead (``stoker.image(storage="raw")``: no decode when loading, 3 bytes a pixel on
disk), decoded by stoker's own decoder; ``--store smart`` stores images of at most
``--smart-pixels`` pixels raw and the rest as files (FFCV's write modes). With
``max_side``, images whose longer side exceeds it are shrunk with Pillow (Lanczos) and
re-encoded as JPEG at ``quality`` (RGB: alpha dropped, as the loader would), as FFCV's
``max_resolution`` does. With ``verify`` (``--verify``, the default) every file is decoded
once in full while converting, so a truncated or corrupt image is reported by name now, not
in epoch 37; ``--no-verify`` reads only the headers of the files kept as they are.

Reading, checking and resizing run on a thread pool (the decoders release the GIL);
samples are written in the source order, so the output is deterministic.

Example::

    stoker convert imagefolder ~/imagenet/train data/train --max-side 512 --workers 8
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

from .._args import (
    add_out,
    add_overwrite,
    add_quiet,
    add_shard_size,
    add_workers,
    plain,
    positive_int,
)
from .._progress import Progress
from ._errors import InputError
from ._parallel import ordered_results
from ._workers import available_cores

__all__ = ["convert_imagefolder", "add_arguments", "run", "IMG_EXTENSIONS"]

#: torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _BadImage(Exception):
    """A source file that cannot be stored; carries the path and the reason."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def find_samples(src: str) -> Tuple[List[str], List[Tuple[str, int]]]:
    """(classes, [(path, label), ...]) in torchvision ImageFolder's order."""
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{src}: not a directory")
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"{src}: no class folders (expected SRC/<class>/<image>)")
    samples = []
    for label, name in enumerate(classes):
        root_dir = os.path.join(src, name)
        for root, _, fnames in sorted(os.walk(root_dir, followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(root, fname), label))
    return classes, samples


STORES = ("jpeg", "raw", "smart")


def _prepare(path: str, max_side: Optional[int], quality: int, verify: bool = True,
             store: str = "jpeg", smart_pixels: int = 0) -> bytes:
    """The bytes to store for one file; raises _BadImage for anything unusable."""
    data = _prepare_file(path, max_side, quality, verify and store == "jpeg")
    if store == "jpeg":
        return data
    from .. import _core
    from ..fields import raw_record

    try:
        if store == "smart":
            h, w = _core.image_output_size(data)
            if h * w > smart_pixels:
                if verify:
                    _core.decode_image(data)
                return data
        return raw_record(_core.decode_image(data))  # the decode verifies the file
    except _core.DecodeError as e:
        raise _BadImage(path, str(e)) from None


def _prepare_file(path: str, max_side: Optional[int], quality: int, verify: bool) -> bytes:
    """The JPEG or PNG bytes to store for one file."""
    from .. import _core

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise _BadImage(path, f"cannot read: {e.strerror or e}") from None
    native = data.startswith(_JPEG_MAGIC) or data.startswith(_PNG_MAGIC)
    if native:
        try:
            h, w = _core.image_output_size(data)
            if max_side is None or max(h, w) <= max_side:
                if verify:  # full decode: truncation and corruption show here
                    _core.decode_image(data)
                return data
        except _core.DecodeError as e:
            raise _BadImage(path, str(e)) from None
    return _reencode(path, data, max_side, quality, native)


# The formats Pillow reads that are re-encoded (IMG_EXTENSIONS), by their signatures.
_OTHER_FORMATS = ((b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
                  (b"P1", "PBM"), (b"P2", "PGM"), (b"P3", "PPM"), (b"P4", "PBM"),
                  (b"P5", "PGM"), (b"P6", "PPM"))
_NAMES = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".tif": "TIFF",
          ".tiff": "TIFF", ".webp": "WebP", ".ppm": "PPM", ".pgm": "PGM"}


def _format(data: bytes) -> Optional[str]:
    """The image format of bytes that are not JPEG or PNG, by signature; None if none."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    return next((name for magic, name in _OTHER_FORMATS if data.startswith(magic)), None)


def _not_an_image(path: str, data: bytes) -> str:
    """Why a file with an image's name is not one: what its first bytes are instead."""
    want = _NAMES.get(os.path.splitext(path)[1].lower(), "image")
    if not data:
        return f"not a {want}: the file is empty"
    return f"not a {want}: the file starts with {data[:12]!r}, no image format's signature"


def _reencode(path: str, data: bytes, max_side: Optional[int], quality: int,
              native: bool) -> bytes:
    fmt = None if native else _format(data)
    if not native and fmt is None:
        raise _BadImage(path, _not_an_image(path, data))
    try:
        from PIL import Image
    except ImportError:
        what = ("shrinking it to --max-side" if native
                else f"a {fmt} image: storing it (as PNG)")
        raise _BadImage(path, f"{what} needs Pillow (pip install pillow)") from None
    try:
        img = Image.open(io.BytesIO(data))
        if max_side is not None and max(img.size) > max_side:
            scale = max_side / max(img.size)
            size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
            img.draft("RGB", size)  # JPEG: let libjpeg's DCT scaling do the first part
            img = img.convert("RGB").resize(size, Image.LANCZOS)
            out = io.BytesIO()
            img.save(out, format="JPEG", quality=quality)
            return out.getvalue()
        img.load()
        if img.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):
            img = img.convert("RGBA" if "A" in img.getbands() else "RGB")
        out = io.BytesIO()
        img.save(out, format="PNG")
        return out.getvalue()
    except Exception as e:  # Pillow raises many types for bad files
        raise _BadImage(path, f"not a readable image ({type(e).__name__}: {e})") from None


class _Progress:
    """Images written, as a bar with rate and ETA on a terminal (stoker._progress)."""

    def __init__(self, total: int, enabled: bool):
        self._bar = Progress(total, "stoker convert imagefolder", unit="img", enabled=enabled)

    def update(self, done: int, nbytes: int, final: bool = False) -> None:
        self._bar.set(done)
        self._bar.note(f"{nbytes / 1e6:.1f} MB")
        if final:
            self._bar.close()

    def write(self, text: str) -> None:
        self._bar.write(text, file=sys.stderr)


def convert_imagefolder(src, out, *, shard_size="256MB", max_side: Optional[int] = None,
                        quality: int = 90, verify: bool = True, skip_bad: bool = False,
                        workers: Optional[int] = None, progress: bool = True,
                        overwrite: bool = False, store: str = "jpeg",
                        smart_pixels: Optional[int] = None) -> Dict[str, Any]:
    """Writes the ImageFolder tree at ``src`` as a stoker dataset at ``out``.

    Args:
        src: folder with one sub-folder per class.
        out: output dataset directory.
        shard_size: target bytes per shard (``"256MB"``, ``"1GiB"`` or an int).
        max_side: shrink images whose longer side is larger (re-encoded as JPEG).
        quality: JPEG quality of re-encoded images.
        verify: decode every JPEG/PNG in full once, so a truncated or corrupt file is
            reported by name now (False: only headers are read; files that are re-encoded
            are always decoded).
        skip_bad: skip unreadable or corrupt files (each reported on stderr) instead of
            failing on the first one.
        workers: images read, checked and resized at once, on threads (the decodes and
            resizes release the GIL; default: the cores this process may use).
        progress: draw a progress bar on stderr.
        overwrite: replace an existing dataset at ``out``.
        store: ``"jpeg"`` (default): the files' bytes (JPEG, PNG); ``"raw"``: decoded pixels
            (``stoker.image(storage="raw")``), read with no decode; ``"smart"``: raw for
            images of at most ``smart_pixels`` pixels (default 512 x 512), files above.

    Returns:
        ``{"images", "classes", "skipped" (list of (path, reason)), "bytes", "seconds"}``.

    Raises:
        stoker.convert.InputError: a bad file without ``skip_bad`` (the message names it
            and why; a ``ValueError``, and exit status 1 of ``stoker convert``).

    Example::

        >>> stats = convert_imagefolder("flowers/train", "data/flowers-train")
        >>> stoker.Dataset("data/flowers-train").metadata["classes"][:2]
        ['daisy', 'dandelion']
    """
    from .. import ShardWriter, image, scalar
    from ..fields import DEFAULT_SMART_PIXELS

    if store not in STORES:
        raise ValueError(f"store must be one of {', '.join(map(repr, STORES))}, got {store!r}")
    if smart_pixels is None:
        smart_pixels = DEFAULT_SMART_PIXELS
    if isinstance(smart_pixels, bool) or not isinstance(smart_pixels, int) or smart_pixels < 1:
        raise ValueError(f"smart_pixels must be a positive int, got {smart_pixels!r}")
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side must be >= 1, got {max_side}")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality must be in [1, 100], got {quality}")
    t0 = time.monotonic()
    src = os.fspath(src)
    classes, samples = find_samples(src)
    if workers is None:
        workers = available_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    skipped: List[Tuple[str, str]] = []
    written = nbytes = 0
    bar = _Progress(len(samples), progress)
    storage = {"jpeg": "encoded", "raw": "raw", "smart": "smart"}[store]
    fields = {"image": image(storage=storage, smart_pixels=smart_pixels),
              "label": scalar("int64")}
    # the source by name: this machine's folders mean nothing where the dataset goes next
    metadata = {"classes": classes, "source": os.path.basename(os.path.abspath(src)),
                "write_options": {"max_side": max_side,
                                  "quality": quality if max_side is not None else None,
                                  "verified": verify}}
    if store != "jpeg":  # the options of a plain conversion read as they always did
        metadata["write_options"]["store"] = store
        if store == "smart":
            metadata["write_options"]["smart_pixels"] = smart_pixels

    def job(i):
        path = samples[i][0]
        try:
            return _prepare(path, max_side, quality, verify, store, smart_pixels)
        except _BadImage as e:
            return e

    with ThreadPoolExecutor(workers, thread_name_prefix="stoker-convert") as pool, \
            ShardWriter(out, fields, shard_size=shard_size, metadata=metadata,
                        overwrite=overwrite) as w:
        depth = 4 * workers  # bounded look-ahead: memory stays flat on any dataset size
        results = ordered_results(pool, job, len(samples), depth)
        for i, result in enumerate(results):
            if isinstance(result, _BadImage):
                if not skip_bad:
                    results.close()  # the jobs not started are cancelled
                    raise InputError(f"{result}; pass --skip-bad (skip_bad=True) to skip "
                                     "unreadable files")
                skipped.append((result.path, result.reason))
                if progress:
                    bar.write(f"skipped {result.path}: {result.reason}")
                continue
            w.write({"image": result, "label": samples[i][1]})
            written += 1
            nbytes += len(result)
            bar.update(i + 1, nbytes)
        bar.update(len(samples), nbytes, final=True)
    if skipped and progress:
        sys.stderr.write(f"skipped {len(skipped)} bad file(s)\n")
    return {"images": written, "classes": len(classes), "skipped": skipped, "bytes": nbytes,
            "seconds": time.monotonic() - t0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``stoker convert imagefolder``."""
    p.description = plain(__doc__.split("\n\n")[0])
    p.add_argument("src", metavar="SRC", help="ImageFolder root: one sub-folder per class")
    add_out(p)
    add_shard_size(p)
    p.add_argument("--max-side", type=positive_int, default=None, metavar="N",
                   help="shrink images whose longer side is larger, re-encoding as JPEG")
    p.add_argument("--quality", type=positive_int, default=90, metavar="Q",
                   help="JPEG quality (1-100) of re-encoded images (default 90)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="decode every image once so a corrupt file is reported by name before "
                        "training (default; --no-verify reads headers only)")
    p.add_argument("--store", choices=STORES, default="jpeg",
                   help="jpeg: the files' bytes (default); raw: decoded pixels, loaded with no "
                        "decode (3 bytes a pixel); smart: raw up to --smart-pixels, files above")
    p.add_argument("--smart-pixels", type=positive_int, default=None, metavar="N",
                   help="--store smart: images of at most N pixels are stored raw "
                        "(default 262144, 512 x 512)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip unreadable or corrupt images (reported) instead of failing")
    add_workers(p)
    add_overwrite(p)
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    stats = convert_imagefolder(args.src, args.out, shard_size=args.shard_size,
                                max_side=args.max_side, quality=args.quality,
                                verify=args.verify,
                                skip_bad=args.skip_bad, workers=args.workers,
                                progress=not args.quiet, overwrite=args.overwrite,
                                store=args.store, smart_pixels=args.smart_pixels)
    print(f"wrote {stats['images']} images of {stats['classes']} classes "
          f"({stats['bytes'] / 1e6:.1f} MB) to {args.out} in {stats['seconds']:.1f} s"
          + (f"; skipped {len(stats['skipped'])} bad file(s)" if stats["skipped"] else ""),
          file=sys.stderr)
    return 0
