"""Records of a remote shard by byte range, without downloading the shard.

The building blocks of first-batch range reads (NOTE [ Records by range ] in
``csrc/format/record_ranges.h``; the fetcher serves them with these): a
shard's record table from two small range requests (its 64-byte header and its tail: the
record table and the footer), validated in C++ exactly as opening the shard file validates
it (``_core.parse_shard_table``: checksums, version, schema hash, the version-2 identity
against ``index.json``); then any records of it, nearby ones coalesced into one request,
requests issued in parallel, every record verified against the table before it is returned.

::

    source = open_source("https://host/datasets/train")
    entry = index["shards"][s]
    table = fetch_shard_table(source, entry["path"], entry, schema_hash,
                              shard_identity(index, s))
    records = fetch_records(source, entry["path"], table, [3, 17, 18, 19])

Retries follow the remote dataset's :class:`.retry.Retry` (``retry=``, or ``retries`` and
``backoff``): connection errors, stalls, 5xx/429 answers and short bodies are retried with
exponential backoff;
404/403, a range past the object's end or a server that ignores ranges for a large object
fail at once; either way :class:`RemoteError` names the URL, the byte range and the reason.
Bytes that arrive whole but fail their checks (the table's, a record's checksum) are a
:class:`stoker.DataError` naming the URL (and the record) at once, as a corrupt local shard
is: the transfer itself was complete.
"""

from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._index import shard_identity
from ._threads import DaemonPool
from .retry import CancelToken, Retry
from .transport import PermanentError, RemoteError, Source, TransientError, _check_range

__all__ = ["fetch_range", "fetch_ranges", "coalesce", "fetch_shard_table", "fetch_records",
           "shard_identity"]

#: Ranges at most this far apart are read in one request (the bytes between are
#: downloaded and dropped): on most links they take less time than the round trip of
#: another request.
DEFAULT_MAX_GAP = 64 << 10
#: A coalesced request does not grow beyond this (a single larger range stays whole),
#: so that many nearby records still arrive over parallel requests.
DEFAULT_MAX_REQUEST = 16 << 20


def _describe(start: int, length: int) -> str:
    return f"bytes {start}-{start + length - 1}"


def _policy(retry: Optional[Retry], retries: Optional[int], backoff: Optional[float]) -> Retry:
    return Retry.of(retry).replace(retries=retries, backoff=backoff)


def fetch_range(source: Source, name: str, start: int, length: int, *,
                retries: Optional[int] = None, backoff: Optional[float] = None,
                retry: Optional[Retry] = None, cancel: Optional[CancelToken] = None) -> bytes:
    """Exactly ``length`` bytes of object ``name`` from byte ``start``, under ``retry``
    (``retries`` and ``backoff`` override its fields). Raises :class:`RemoteError` naming
    the URL, the byte range, the reason and, after retries, the number of attempts;
    :class:`.retry.Cancelled` once ``cancel`` is cancelled."""
    _check_range(start, length)
    if length == 0:
        return b""
    return _policy(retry, retries, backoff).run(
        lambda: source.read_range(name, start, length, cancel=cancel),
        f"{source.object_url(name)} ({_describe(start, length)})", transient=TransientError,
        permanent=PermanentError, error=RemoteError, cancel=cancel)


def coalesce(ranges: Sequence[Tuple[int, int]], *, max_gap: int = DEFAULT_MAX_GAP,
             max_request: int = DEFAULT_MAX_REQUEST) -> List[Tuple[int, int]]:
    """The requests that cover ``ranges`` ((start, length) pairs, any order, overlaps
    allowed): (start, length) spans in increasing order, each joining the ranges that
    begin at most ``max_gap`` bytes after the previous ones end, while the span stays
    within ``max_request`` bytes. Empty ranges need no request. A pure function of its
    arguments."""
    if max_gap < 0 or max_request < 1:
        raise ValueError(f"max_gap must be >= 0 and max_request >= 1, got {max_gap}, "
                         f"{max_request}")
    spans: List[List[int]] = []  # [start, end) each
    for start, length in sorted((s, n) for s, n in ranges if n > 0):
        end = start + length
        if spans and start <= spans[-1][1] + max_gap and \
                max(end, spans[-1][1]) - spans[-1][0] <= max_request:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return [(a, b - a) for a, b in spans]


def fetch_ranges(source: Source, name: str, ranges: Sequence[Tuple[int, int]], *,
                 max_gap: int = DEFAULT_MAX_GAP, max_parallel: int = 8,
                 max_request: int = DEFAULT_MAX_REQUEST, retries: Optional[int] = None,
                 backoff: Optional[float] = None, retry: Optional[Retry] = None,
                 cancel: Optional[CancelToken] = None) -> List[bytes]:
    """The bytes of each (start, length) range of object ``name``, in the given order.

    Nearby ranges are read in one request (:func:`coalesce`), requests run on up to
    ``max_parallel`` threads, each with :func:`fetch_range`'s retries. The result depends
    only on the arguments (and the object), never on timing; when requests fail, the
    :class:`RemoteError` raised is that of the first failing request in byte order."""
    ranges = [(s, n) for s, n in ranges]
    for s, n in ranges:
        _check_range(s, n)
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
    spans = coalesce(ranges, max_gap=max_gap, max_request=max_request)

    policy = _policy(retry, retries, backoff)

    def get(span: Tuple[int, int]) -> bytes:
        return fetch_range(source, name, span[0], span[1], retry=policy, cancel=cancel)

    if len(spans) <= 1 or max_parallel == 1:
        bodies = [get(span) for span in spans]
    else:
        pool = DaemonPool(min(max_parallel, len(spans)), "stoker-range")
        try:
            futures = [pool.submit(get, span) for span in spans]
            bodies = [f.result() for f in futures]  # in byte order: the first error wins
        finally:
            pool.shutdown()
    starts = [span[0] for span in spans]
    out: List[bytes] = []
    for s, n in ranges:
        if n == 0:
            out.append(b"")
            continue
        # The last span starting at or before s holds the range (coalesce's order).
        k = bisect.bisect_right(starts, s) - 1
        body, offset = bodies[k], s - starts[k]
        assert offset + n <= len(body), (s, n, spans[k])
        out.append(body if offset == 0 and n == len(body) else body[offset:offset + n])
    return out


def fetch_shard_table(source: Source, shard_name: str, index_entry: Dict[str, Any],
                      schema_hash: int, identity: Optional[Tuple[str, int, int, int]] = None,
                      *, max_gap: int = DEFAULT_MAX_GAP, retries: Optional[int] = None,
                      backoff: Optional[float] = None, retry: Optional[Retry] = None,
                      cancel: Optional[CancelToken] = None) -> Any:
    """The record table of shard ``shard_name`` (a ``_core.ShardTable``) from its header
    and its tail, read by range: two requests, or one when the shard is small enough for
    the gap between them to be under ``max_gap``.

    ``index_entry`` is the shard's entry in ``index.json`` (its ``bytes`` and
    ``num_records`` are checked), ``schema_hash`` the dataset's, ``identity`` from
    :func:`shard_identity`. Raises :class:`RemoteError` when the bytes cannot be fetched,
    and :class:`stoker.DataError` naming the URL when they are not that shard's."""
    from .. import _core

    size, n = int(index_entry["bytes"]), int(index_entry["num_records"])
    head_len = min(64, size)
    tail_len = min(_core.shard_tail_bytes(n), size)
    head, tail = fetch_ranges(source, shard_name, [(0, head_len), (size - tail_len, tail_len)],
                              max_gap=max_gap, max_parallel=2, retries=retries,
                              backoff=backoff, retry=retry, cancel=cancel)
    return _core.parse_shard_table(source.object_url(shard_name), head, tail, size, schema_hash,
                                   n, identity)


def fetch_records(source: Source, shard_name: str, table: Any, records: Sequence[int], *,
                  max_gap: int = DEFAULT_MAX_GAP, max_parallel: int = 8,
                  max_request: int = DEFAULT_MAX_REQUEST, retries: Optional[int] = None,
                  backoff: Optional[float] = None, retry: Optional[Retry] = None,
                  cancel: Optional[CancelToken] = None) -> List[bytes]:
    """The bytes of ``records`` (record numbers within the shard, any order, repeats
    allowed) of shard ``shard_name``, whose ``table`` :func:`fetch_shard_table` gave, in
    the given order. Read as :func:`fetch_ranges` reads; every record is verified against
    the table (length and checksum) before it is returned: :class:`stoker.DataError`
    naming the URL and the record otherwise."""
    ranges = []
    for r in records:
        offset, length, _ = table.entry(int(r))
        ranges.append((offset, length))
    out = fetch_ranges(source, shard_name, ranges, max_gap=max_gap, max_parallel=max_parallel,
                       max_request=max_request, retries=retries, backoff=backoff, retry=retry,
                       cancel=cancel)
    for r, data in zip(records, out):
        table.verify(int(r), data)
    return out
