"""Folders of videos or audio files (``SRC/<class>/**/<file>``) to a stoker dataset, labelled
as torchvision's ``ImageFolder`` labels images (stoker/convert/imagefolder.py): classes are
the sorted sub-folders of SRC, 0..C-1, files found in sorted order by extension.

``stoker convert video`` writes ``{"video": stoker.video(), "label": stoker.scalar("int64")}``,
``stoker convert audio`` ``{"audio": stoker.audio(...), "label": ...}``; each file is stored
byte for byte with the index the loader seeks by (its frames' times and key frames; the
audio's exact length, which decodes it once), made on a thread pool (FFmpeg releases the
GIL) and written in the source order, so the output is deterministic. A file FFmpeg cannot
read or decode is reported by name (``--skip-bad`` skips it). ``Dataset(out).metadata`` has
``{"classes": [...], "source": ...}``.

Example::

    stoker convert video ~/kinetics/train data/k400-train --workers 8
    stoker convert audio ~/speech_commands data/speech --sample-rate 16000 --channels 1
"""

from __future__ import annotations

import argparse
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
from ._parallel import ordered_results
from ._workers import available_cores

__all__ = ["convert_video", "convert_audio", "add_arguments", "run", "VIDEO_EXTENSIONS",
           "AUDIO_EXTENSIONS"]

#: torchvision.datasets.video_utils' and common containers
VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".mpg", ".mpeg", ".ts")
#: torchaudio's common formats
AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac", ".wma")


def find_files(src: str, extensions: Tuple[str, ...]) -> Tuple[List[str], List[Tuple[str, int]]]:
    """(classes, [(path, label), ...]) in ImageFolder's order."""
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{src}: not a directory")
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"{src}: no class folders (expected SRC/<class>/<file>)")
    samples = []
    for label, name in enumerate(classes):
        for root, _, fnames in sorted(os.walk(os.path.join(src, name), followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(extensions):
                    samples.append((os.path.join(root, fname), label))
    return classes, samples


def _convert(kind: str, src: Any, out: Any, field: Any, shard_size: Any, skip_bad: bool,
             workers: Optional[int], progress: bool, overwrite: bool) -> Dict[str, Any]:
    from .. import ShardWriter, scalar

    t0 = time.monotonic()
    src = os.fspath(src)
    classes, samples = find_files(src, VIDEO_EXTENSIONS if kind == "video" else
                                  AUDIO_EXTENSIONS)
    if workers is None:
        workers = available_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    fields = {kind: field, "label": scalar("int64")}
    metadata = {"classes": classes, "source": os.path.basename(os.path.abspath(src))}
    skipped: List[Tuple[str, str]] = []
    written = nbytes = 0
    bar = Progress(len(samples), f"stoker convert {kind}", unit="file", enabled=progress)

    def job(i: int) -> Any:
        path = samples[i][0]
        try:
            return field.encode(path, what=path)  # the index: FFmpeg, GIL released
        except ValueError as e:
            return e

    with ThreadPoolExecutor(workers, thread_name_prefix="stoker-convert") as pool, \
            ShardWriter(out, fields, shard_size=shard_size, metadata=metadata,
                        overwrite=overwrite) as w:
        depth = 2 * workers  # bounded look-ahead: a few files in memory at once
        results = ordered_results(pool, job, len(samples), depth)
        for i, result in enumerate(results):
            if isinstance(result, ValueError):
                if not skip_bad:
                    results.close()  # the jobs not started are cancelled
                    raise ValueError(f"{result}; pass --skip-bad (skip_bad=True) to skip "
                                     "unreadable files") from None
                path, _, reason = str(result).partition(": ")
                skipped.append((path, reason))
                if progress:
                    bar.write(f"skipped {result}", file=sys.stderr)
                continue
            w.write({kind: result, "label": samples[i][1]})
            written += 1
            nbytes += len(result)
            bar.set(i + 1)
            bar.note(f"{nbytes / 1e6:.1f} MB")
        bar.set(len(samples))
        bar.close()
    return {"files": written, "classes": len(classes), "skipped": skipped, "bytes": nbytes,
            "seconds": time.monotonic() - t0}


def convert_video(src: Any, out: Any, *, shard_size: Any = "256MB", skip_bad: bool = False,
                  workers: Optional[int] = None, progress: bool = True,
                  overwrite: bool = False) -> Dict[str, Any]:
    """Writes the class folders of videos at ``src`` as a stoker dataset at ``out``.

    Returns ``{"files", "classes", "skipped" (list of (path, reason)), "bytes",
    "seconds"}``; ValueError naming a bad file unless ``skip_bad``."""
    from .. import video

    return _convert("video", src, out, video(), shard_size, skip_bad, workers, progress,
                    overwrite)


def convert_audio(src: Any, out: Any, *, sample_rate: Optional[int] = None,
                  channels: Optional[int] = None, shard_size: Any = "256MB",
                  skip_bad: bool = False, workers: Optional[int] = None, progress: bool = True,
                  overwrite: bool = False) -> Dict[str, Any]:
    """Writes the class folders of audio files at ``src`` as a stoker dataset at ``out``,
    whose field ``stoker.audio(sample_rate, channels)`` the loader decodes at that rate and
    channel count (None: each file's own). Returns as :func:`convert_video`."""
    from .. import audio

    return _convert("audio", src, out, audio(sample_rate, channels), shard_size, skip_bad,
                    workers, progress, overwrite)


def add_arguments(p: argparse.ArgumentParser, fmt: str) -> None:
    """Arguments of ``stoker convert video`` and ``stoker convert audio``."""
    p.description = plain(__doc__.split("\n\n")[0])
    p.add_argument("src", metavar="SRC", help=f"one sub-folder per class, {fmt} files inside")
    add_out(p)
    add_shard_size(p)
    if fmt == "audio":
        p.add_argument("--sample-rate", type=positive_int, default=None, metavar="HZ",
                       help="the rate the loader decodes to (default: each file's own)")
        p.add_argument("--channels", type=positive_int, default=None, metavar="N",
                       help="the channels the loader decodes to (1: the mean; default: each "
                            "file's own)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip files FFmpeg cannot read (reported) instead of failing")
    add_workers(p)
    add_overwrite(p)
    add_quiet(p)
    p.set_defaults(media_kind=fmt)


def run(args: argparse.Namespace) -> int:
    common = dict(shard_size=args.shard_size, skip_bad=args.skip_bad, workers=args.workers,
                  progress=not args.quiet, overwrite=args.overwrite)
    if args.media_kind == "video":
        stats = convert_video(args.src, args.out, **common)
    else:
        stats = convert_audio(args.src, args.out, sample_rate=args.sample_rate,
                              channels=args.channels, **common)
    print(f"wrote {stats['files']} {args.media_kind} files of {stats['classes']} classes "
          f"({stats['bytes'] / 1e6:.1f} MB) to {args.out} in {stats['seconds']:.1f} s"
          + (f"; skipped {len(stats['skipped'])} bad file(s)" if stats["skipped"] else ""),
          file=sys.stderr)
    return 0
