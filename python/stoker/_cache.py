"""The decoded-sample cache of a Loader (``cache="decoded"``): its arguments, checked for
the plan (stoker/_plan.py), the shared memory it is opened in, and its stats.

NOTE [ Decoded cache, from Python ]
``stoker.Loader(ds, cache="decoded", cache_size=..., cache_max_side=...)`` keeps every RGB
image a worker decodes (csrc/cache/decoded_cache.h), so later epochs crop, resize and
augment from memory instead of decoding again. The cache is one file in a folder of the
user's own in ``/dev/shm`` (``STOKER_CACHE_DIR`` moves it; NOTE [ Cache trust ] in
csrc/cache/decoded_cache.cpp) that every process of the user on the node opening the same
dataset with the same cache arguments maps: ranks hold one copy. Its name carries the dataset's
content (:func:`dataset_identity`: the dataset id of each write, every shard's size and
checksums) and the arguments, so a dataset rewritten since, or other arguments, never
meet stale pixels. The last process to leave removes it; a killed run's file is removed
by the next process that opens any cache.

The budget is honoured exactly: the file is ``cache_size`` bytes, index included, and
images that find no room are decoded as without a cache. On the batches: without
``cache_max_side`` they are bit-identical to the uncached loader's; with it, pixels come
from the reduced copies (docs/cache.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from typing import Any, Dict, Optional, Union

from . import _core
from . import _loader_args as args
from ._media_fields import Audio, Video
from .fields import Image

__all__ = ["CachePlan", "check_cache", "check_verify", "check_use", "open_cache", "cache_stats",
           "DEFAULT_CACHE_SHARE", "CACHE_DIR_ENV"]

# cache_size=None: this share of the machine's RAM (one copy per node, whatever its ranks).
DEFAULT_CACHE_SHARE = 0.25
# Where the shared cache file lives ('' keeps every cache in its process's memory).
CACHE_DIR_ENV = "STOKER_CACHE_DIR"
DEFAULT_CACHE_DIR = "/dev/shm"
_VERSION = 1  # of what the identity covers


@dataclasses.dataclass(frozen=True)
class CachePlan:
    """A loader's decoded-sample cache, as values (opened by build())."""

    budget: int  # bytes of the whole cache, honoured exactly
    max_side: int  # 0: pixels as decoded (bit-identical batches)
    dir: str  # of the shared file; "": private memory only

    @property
    def variants(self) -> int:
        return 1 if self.max_side else 4

    def describe(self) -> str:
        side = f", max_side={self.max_side}" if self.max_side else ", exact pixels"
        where = self.dir or "private memory"
        return f"cache: decoded images, {self.budget / 2**30:.2f} GiB{side}, in {where}"


def check_cache(cache: Any, cache_max_side: Any, cache_size: Any) -> Optional[CachePlan]:
    """``cache=None | "decoded"``, ``cache_max_side=None | int``, ``cache_size=None | bytes
    | "8GB" | a share of RAM in (0, 1]``: a :class:`CachePlan` or None."""
    if cache is None:
        if cache_max_side is not None or cache_size is not None:
            raise ValueError("cache_max_side and cache_size configure the decoded-sample cache: "
                             "pass cache='decoded' too")
        return None
    if cache != "decoded":
        raise ValueError(f"cache must be None or 'decoded', got {cache!r}")
    max_side = 0
    if cache_max_side is not None:
        max_side = args.check_int("cache_max_side", cache_max_side, 1, 2**31 - 1,
                                  "a positive int (pixels of a cached image's longer side) "
                                  "or None")
    if cache_size is None:
        budget = int(args.physical_memory() * DEFAULT_CACHE_SHARE)
    elif isinstance(cache_size, float) and not isinstance(cache_size, bool):
        if not 0 < cache_size <= 1:
            raise ValueError(f"cache_size as a float is a share of the machine's RAM in (0, 1], "
                             f"got {cache_size!r}")
        budget = int(args.physical_memory() * cache_size)
    elif isinstance(cache_size, str):
        from ._index import parse_size

        budget = parse_size(cache_size)
    else:
        budget = args.check_int("cache_size", cache_size, 1, 2**62,
                                "bytes, a size such as '8GB', a share of RAM in (0, 1], or None")
    return CachePlan(budget, max_side, os.environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR))


def check_verify(verify: Any) -> str:
    if verify not in ("first", "always", "once"):
        raise ValueError(f"verify must be 'first' (a record's checksum is checked on its first "
                         f"read in this process, and again after its file changed; every read "
                         f"of a format-1 shard), 'always', or 'once' ('first' for format-1 "
                         f"shards too), got {verify!r}")
    return verify


def image_fields(fields: Dict[str, Any]) -> int:
    """Image fields of a schema: each record has a cache slot per image field (a mask's
    stays empty)."""
    return sum(isinstance(f, Image) for f in fields.values())


def dataset_identity(dataset: Any) -> str:
    """A digest of what a dataset's records hold: the write's dataset id (format v2), and
    every shard's path, size, record count and checksums (file, header, record table). A
    dataset rewritten since gives another digest; so does one of format v1 edited in place
    (its shards' size and modification time are in it too)."""
    shards = []
    for s in dataset.shards:
        entry = [s["path"], s["bytes"], s["num_records"], s.get("checksum"),
                 s.get("header_checksum"), s.get("table_checksum")]
        local = getattr(dataset, "remote", None) is None
        if getattr(dataset, "dataset_id", None) is None and local:
            try:
                st = os.stat(os.path.join(dataset.path, s["path"]))
                entry += [st.st_size, st.st_mtime_ns, st.st_ino]
            except OSError:
                pass
        shards.append(entry)
    key = {"v": _VERSION, "dataset_id": getattr(dataset, "dataset_id", None),
           "schema": [[n, f.spec()] for n, f in dataset.fields.items()], "shards": shards}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def open_cache(plan: CachePlan, dataset: Any, verify: str = "first") -> Any:
    """The ``_core.DecodedCache`` of `plan` for `dataset`: the node's shared one, or this
    process's own with a warning saying why (once per reason). Its entries' checksums are
    checked as `verify` says records are (NOTE [ Cache trust ] in
    csrc/cache/decoded_cache.cpp)."""
    slots = len(dataset) * image_fields(dataset.fields)
    identity = dataset_identity(dataset) + f"|{plan.budget}|{plan.max_side}|{slots}"
    ident64 = int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "little")
    local = args.local_world_size()
    cache = _core.DecodedCache(budget=plan.budget, slots=slots, variants=plan.variants,
                               max_side=plan.max_side, identity=ident64, dir=plan.dir,
                               private_budget=plan.budget // local,
                               verify_always=verify == "always")
    if plan.dir and not cache.shared:
        why = cache.fallback
        hint = ("Give /dev/shm room for cache_size (docker run --shm-size=...), set "
                f"{CACHE_DIR_ENV} to a tmpfs with room, or lower cache_size") \
            if "free, less than" in why or "cannot" in why else \
            (f"The shared cache is kept in a folder only this user can open ("
             f"{_core.DecodedCache.private_dir(plan.dir)}, mode 0700); set {CACHE_DIR_ENV} "
             "to another folder to share it again (docs/cache.md, \"Who can see the cache\")")
        say_once(f"stoker: the decoded-sample cache is not shared with this node's other "
                 f"processes ({why}); each keeps its own, of cache_size over the {local} "
                 f"process(es) of the job here ({cache.budget} bytes). {hint}", stacklevel=5)
    return cache


_said: set = set()


def say_once(message: str, stacklevel: int = 2) -> None:
    """A RuntimeWarning, once per message in this process (a fallback is said once, not
    per loader)."""
    if message in _said:
        return
    _said.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def cache_stats(cache: Any) -> Dict[str, Union[int, float, bool, str]]:
    """``Loader.stats()["cache"]``: this process's hits and misses (images taken from the
    cache, images decoded), and the cache's bytes, entries and the share of the dataset's
    images it holds (every process's)."""
    s = cache.stats()
    looked = s["hits"] + s["misses"]
    s["hit_rate"] = s["hits"] / looked if looked else 0.0
    s["cached_share"] = s["images"] / s["slots"] if s["slots"] else 0.0
    s["path"] = cache.path
    s["fallback"] = cache.fallback or cache.abandoned
    return s


def check_use(cache: CachePlan, dataset: Any, settings: args.Settings,
                     max_memory: Any, *, tokens: bool, map_style: bool) -> args.Settings:
    """Where cache="decoded" applies (the RGB images of one stoker.Dataset), and its place in
    max_memory: given, max_memory covers this rank's share of the cache (cache_size over the
    processes of the job on this machine, which share it) besides the batches in flight."""
    from .mix import Mix

    if tokens or map_style or isinstance(dataset, Mix):
        what = "token batches" if tokens else "a map-style dataset" if map_style else \
            "a stoker.Mix (give each source its own loader to cache it)"
        raise ValueError(f"cache='decoded' keeps the decoded images of a stoker.Dataset; it "
                         f"does not apply to {what}")
    if not any(isinstance(f, Image) and f.mode == "RGB" for f in dataset.fields.values()):
        media = sorted(n for n, f in dataset.fields.items() if isinstance(f, (Video, Audio)))
        if media:  # clips are not cached (docs/video.md)
            raise ValueError(
                f"cache='decoded' keeps decoded RGB images, and the fields {media} are video or "
                "audio: their clips are drawn anew every epoch, so one epoch's decoded frames "
                "are rarely the next one's, and a video's every frame decoded is hundreds of "
                "times its file (854x480, 300 frames: 369 MB for a file of about 1 MB); they "
                "decode from their records each time (leave cache= out)")
        raise ValueError("cache='decoded' keeps decoded RGB images, and this dataset has no "
                         "stoker.image() field of mode 'RGB'")
    slots = len(dataset) * image_fields(dataset.fields)
    index = _core.DecodedCache.index_bytes(slots, cache.variants)
    if cache.budget <= index:
        raise ValueError(f"cache_size={cache.budget} bytes cannot hold the cache's index alone "
                         f"({index} bytes for {slots} images): give at least "
                         f"{index + 2**20} bytes")
    if max_memory is None:
        return settings
    share = cache.budget // args.local_world_size()
    if share >= settings.max_memory:
        raise ValueError(f"max_memory={settings.max_memory} bytes leaves nothing for batches "
                         f"after this rank's share of the decoded cache ({share} bytes of "
                         f"cache_size={cache.budget}, shared by {args.local_world_size()} "
                         "process(es) on this machine): raise max_memory or lower cache_size")
    return settings._replace(max_memory=settings.max_memory - share)

