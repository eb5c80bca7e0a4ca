"""Where remote objects come from: HTTP(S), S3, or any other fsspec URL.

A :class:`Source` streams one object (a shard, ``index.json``) into a callback, raising
:class:`TransientError` for what a retry may fix (connection errors, timeouts, 5xx and 429
answers, a body shorter than announced) and :class:`PermanentError` for what it will not
(404, 403, no credentials). Retries and backoff are the caller's (:mod:`.cache`), so every
transport retries the same way.

:meth:`Source.read_range` reads exactly the bytes of one byte range (HTTP ``Range``, S3
``GetObject(Range=...)``, fsspec ``cat_file``), with the same error classes; a range that
reaches past the object's end is a :class:`PermanentError`, as is a server that ignores
ranges for an object larger than :attr:`HttpSource.ignored_range_limit` (a smaller one is
read whole and sliced). :mod:`.ranges` adds retries and coalescing.

HTTP(S) uses the standard library (one request per object, ``Range`` for resumption);
S3 uses boto3 (credentials, region and ``AWS_ENDPOINT_URL`` as boto3 finds them, or
``storage_options={"endpoint_url": ...}``); other schemes go through fsspec. The plain
clients were picked over fsspec's HTTP and S3 backends (aiohttp, s3fs): they are
synchronous, need no dependency for HTTP, and were as fast or faster on loopback
(``bench/bench_remote.py --transports``, numbers in ``bench/RESULTS.md``).
"""

from __future__ import annotations

import http.client
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Optional

__all__ = ["Source", "TransientError", "PermanentError", "open_source", "is_url"]

CHUNK = 1 << 20


class TransientError(Exception):
    """A failure that a retry may fix."""


class PermanentError(Exception):
    """A failure that a retry will not fix."""


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` strings other than ``file://``."""
    if not isinstance(path, str) or "://" not in path:
        return False
    scheme = path.split("://", 1)[0]
    return bool(scheme) and scheme.isascii() and scheme.replace("+", "").isalnum() and \
        scheme != "file"


class Source:
    """Objects under one URL prefix."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def object_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    def stream(self, name: str, sink: Callable[[bytes], None], offset: int = 0) -> int:
        """Calls ``sink`` with consecutive chunks of object ``name`` from byte ``offset``;
        returns the object's total size as the server announced it (-1 if unknown)."""
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        parts: list = []
        self.stream(name, parts.append)
        return b"".join(parts)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """Exactly ``length`` bytes of object ``name`` from byte ``start`` (no request for
        ``length == 0``). A shorter body is a :class:`TransientError`; a range past the
        object's end, and a server that cannot serve ranges, a :class:`PermanentError`."""
        raise NotImplementedError


def _check_range(start: int, length: int) -> None:
    for what, v in (("start", start), ("length", length)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"range {what} must be an int >= 0, got {v!r}")


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def _check_content_range(value: Optional[str], start: int, end: int) -> None:
    """A partial answer's ``Content-Range`` must be the range asked for, ``end``
    inclusive; one cut at the object's end means the range reaches past it."""
    m = _CONTENT_RANGE.fullmatch((value or "").strip())
    if m is None:
        raise PermanentError(f"asked for bytes {start}-{end}, got a partial answer without a "
                             f"valid Content-Range ({value!r})")
    a, b = int(m.group(1)), int(m.group(2))
    total = -1 if m.group(3) == "*" else int(m.group(3))
    if a == start and b == end:
        return
    if a == start and b < end and b + 1 == total:
        raise PermanentError(f"bytes {start}-{end} reach past the end of the object "
                             f"({total} bytes)")
    raise PermanentError(f"asked for bytes {start}-{end}, the server sent bytes {a}-{b}")


def _whole_as_range(size: int, limit: int, start: int, end: int) -> None:
    """The server answered a range with the whole object (``size`` bytes, -1 unknown):
    fine if it is small enough to read and slice, and if the range is inside it."""
    if size < 0 or size > limit:
        what = f"the whole object ({size} bytes)" if size >= 0 else "the whole object"
        raise PermanentError(f"the server does not support range requests: it answered bytes "
                             f"{start}-{end} with {what}")
    if end >= size:
        raise PermanentError(f"bytes {start}-{end} reach past the end of the object "
                             f"({size} bytes)")


def _read_exact(read: Callable[[int], bytes], n: int) -> bytes:
    """``n`` bytes from ``read`` (which returns b"" at the end); TransientError if the body
    ends sooner."""
    parts = []
    got = 0
    while got < n:
        chunk = read(min(CHUNK, n - got))
        if not chunk:
            raise TransientError(f"body ended after {got} of {n} bytes")
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class HttpSource(Source):
    #: Largest object read whole and sliced when a server answers a range request with
    #: the whole object (200): beyond it, :meth:`read_range` refuses such a server.
    ignored_range_limit = 1 << 20

    def __init__(self, url: str, timeout: float = 60.0, headers: Optional[Dict[str, str]] = None):
        super().__init__(url)
        self.timeout = timeout
        self.headers = dict(headers or {})

    def stream(self, name, sink, offset=0):
        url = self.object_url(name)
        headers = dict(self.headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                status = resp.status
                if offset and status != 206:
                    raise TransientError(f"asked for bytes from {offset}, got status {status}")
                length = resp.headers.get("Content-Length")
                expect = int(length) if length is not None else -1
                got = 0
                while True:
                    chunk = resp.read1(CHUNK)  # what has arrived: progress is visible
                    if not chunk:
                        break
                    got += len(chunk)
                    sink(chunk)
                if expect >= 0 and got != expect:
                    raise TransientError(f"body ended after {got} of {expect} bytes")
                return offset + expect if expect >= 0 else -1
        except _HTTP_ERRORS as e:
            raise _http_error(e) from None

    def read_range(self, name: str, start: int, length: int) -> bytes:
        _check_range(start, length)
        if length == 0:
            return b""
        end = start + length - 1
        headers = dict(self.headers)
        headers["Range"] = f"bytes={start}-{end}"
        req = urllib.request.Request(self.object_url(name), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                if resp.status == 206:
                    _check_content_range(resp.headers.get("Content-Range"), start, end)
                    return _read_exact(resp.read1, length)
                if resp.status == 200:  # the range was ignored
                    cl = resp.headers.get("Content-Length")
                    size = int(cl) if cl is not None and cl.isdigit() else -1
                    _whole_as_range(size, self.ignored_range_limit, start, end)
                    return _read_exact(resp.read1, size)[start:end + 1]
                raise TransientError(f"asked for bytes {start}-{end}, got status {resp.status}")
        except urllib.error.HTTPError as e:
            if e.code == 416:
                total = (e.headers.get("Content-Range") or "").rpartition("/")[2]
                e.close()
                known = f" ({total} bytes)" if total.isdigit() else ""
                raise PermanentError(f"bytes {start}-{end} are past the end of the object"
                                     f"{known} (HTTP 416)") from None
            raise _http_error(e) from None
        except _HTTP_ERRORS as e:
            raise _http_error(e) from None


_HTTP_ERRORS = (urllib.error.URLError, http.client.HTTPException, socket.timeout,
                ConnectionError, TimeoutError)


def _http_error(e: BaseException) -> Exception:
    """The TransientError or PermanentError for a failed HTTP request."""
    if isinstance(e, urllib.error.HTTPError):
        msg = f"HTTP {e.code} {e.reason}"
        e.close()
        if e.code in (408, 425, 429) or e.code >= 500:
            return TransientError(msg)
        return PermanentError(msg)
    if isinstance(e, http.client.IncompleteRead):
        return TransientError(f"body ended early ({len(e.partial)} bytes in the last read)")
    reason = getattr(e, "reason", e)
    return TransientError(f"{type(e).__name__}: {reason}")


class S3Source(Source):
    _PERMANENT = {"NoSuchKey", "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                  "SignatureDoesNotMatch", "404", "403", "400", "InvalidBucketName",
                  "InvalidRange", "416"}
    ignored_range_limit = HttpSource.ignored_range_limit

    def __init__(self, url: str, timeout: float = 60.0,
                 storage_options: Optional[Dict[str, Any]] = None):
        super().__init__(url)
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ImportError("s3:// datasets need boto3 (pip install boto3, or "
                              "stoker[remote])") from None
        parsed = urllib.parse.urlparse(self.url)
        self.bucket, self.prefix = parsed.netloc, parsed.path.lstrip("/")
        if not self.bucket:
            raise ValueError(f"{url}: no bucket in the URL (s3://bucket/prefix)")
        opts = dict(storage_options or {})
        config = Config(retries={"max_attempts": 1, "mode": "standard"},
                        connect_timeout=timeout, read_timeout=timeout,
                        max_pool_connections=32)
        self._client = boto3.session.Session().client("s3", config=config, **opts)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def stream(self, name, sink, offset=0):
        from botocore.exceptions import BotoCoreError, ClientError

        kw = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=self._key(name), **kw)
            expect = resp.get("ContentLength", -1)
            got = 0
            for chunk in resp["Body"].iter_chunks(CHUNK):
                got += len(chunk)
                sink(chunk)
            if expect >= 0 and got != expect:
                raise TransientError(f"body ended after {got} of {expect} bytes")
            return offset + expect if expect >= 0 else -1
        except (BotoCoreError, ClientError, ConnectionError, TimeoutError, socket.timeout) as e:
            raise self._error(e) from None

    def read_range(self, name: str, start: int, length: int) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        _check_range(start, length)
        if length == 0:
            return b""
        end = start + length - 1
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=self._key(name),
                                           Range=f"bytes={start}-{end}")
            body = resp["Body"]
            try:
                if resp.get("ContentRange"):
                    _check_content_range(resp["ContentRange"], start, end)
                    return _read_exact(body.read, length)
                size = resp.get("ContentLength", -1)  # the range was ignored
                _whole_as_range(size, self.ignored_range_limit, start, end)
                return _read_exact(body.read, size)[start:end + 1]
            finally:
                body.close()
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", "?"))
            if code in ("InvalidRange", "416"):
                raise PermanentError(f"bytes {start}-{end} are past the end of the object "
                                     f"(S3 {code})") from None
            raise self._error(e) from None
        except (BotoCoreError, ConnectionError, TimeoutError, socket.timeout) as e:
            raise self._error(e) from None

    def _error(self, e: BaseException) -> Exception:
        """The TransientError or PermanentError for a failed S3 request."""
        from botocore.exceptions import ClientError, NoCredentialsError

        if isinstance(e, NoCredentialsError):
            return PermanentError("no AWS credentials found (environment, ~/.aws or instance "
                                  "role)")
        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", "?"))
            msg = f"S3 {code}: {err.get('Message', '')}".rstrip(": ")
            return PermanentError(msg) if code in self._PERMANENT else TransientError(msg)
        return TransientError(f"{type(e).__name__}: {e}")


class FsspecSource(Source):
    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]] = None):
        super().__init__(url)
        try:
            import fsspec
        except ImportError:
            raise ImportError(f"{url}: this URL scheme needs fsspec (pip install fsspec and "
                              "the scheme's backend)") from None
        self._fs, self._root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))

    def stream(self, name, sink, offset=0):
        path = f"{self._root}/{name}"
        try:
            with self._fs.open(path, "rb") as f:
                if offset:
                    f.seek(offset)
                while True:
                    chunk = f.read(CHUNK)
                    if not chunk:
                        return -1
                    sink(chunk)
        except (OSError, TimeoutError) as e:
            raise _fsspec_error(e) from None

    def read_range(self, name: str, start: int, length: int) -> bytes:
        _check_range(start, length)
        if length == 0:
            return b""
        path = f"{self._root}/{name}"
        end = start + length - 1
        try:
            data: bytes = self._fs.cat_file(path, start=start, end=start + length)
            if len(data) == length:
                return data
            if len(data) < length:
                size = self._fs.size(path)
                if size is not None and end >= size:
                    raise PermanentError(f"bytes {start}-{end} reach past the end of the "
                                         f"object ({size} bytes)")
            raise TransientError(f"got {len(data)} bytes for bytes {start}-{end}")
        except (OSError, TimeoutError) as e:
            raise _fsspec_error(e) from None


def _fsspec_error(e: BaseException) -> Exception:
    if isinstance(e, FileNotFoundError):
        return PermanentError(f"not found ({e})")
    if isinstance(e, PermissionError):
        return PermanentError(f"permission denied ({e})")
    return TransientError(f"{type(e).__name__}: {e}")


def open_source(url: str, *, timeout: float = 60.0,
                storage_options: Optional[Dict[str, Any]] = None) -> Source:
    """The :class:`Source` for ``url``'s scheme."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        return HttpSource(url, timeout=timeout,
                          headers=(storage_options or {}).get("headers"))
    if scheme in ("s3", "s3a"):
        return S3Source(url, timeout=timeout, storage_options=storage_options)
    return FsspecSource(url, storage_options=storage_options)
