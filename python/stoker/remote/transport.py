"""Where remote objects come from: HTTP(S), S3, or any other fsspec URL.

A :class:`Source` streams one object (a shard, ``index.json``) into a callback, raising
:class:`TransientError` for what a retry may fix (connection errors, timeouts, 5xx and 429
answers, a body shorter than announced) and :class:`PermanentError` for what it will not
(404, 403, no credentials). Retries and backoff are the caller's (:class:`.retry.Retry`),
so every transport retries the same way. A transfer that receives nothing for the stall
timeout is a :class:`TransientError` saying how many bytes had arrived; a transfer whose
:class:`.retry.CancelToken` is cancelled ends at once with :class:`.retry.Cancelled` (its
socket is shut down, whatever it was waiting for: S3 once the answer's headers are in,
fsspec between chunks).

:meth:`Source.read_range` reads exactly the bytes of one byte range (HTTP ``Range``, S3
``GetObject(Range=...)``, fsspec ``cat_file``), with the same error classes; a range that
reaches past the object's end is a :class:`PermanentError`, as is a server that ignores
ranges for an object larger than :attr:`HttpSource.ignored_range_limit` (a smaller one is
read whole and sliced). :mod:`.ranges` adds retries and coalescing.

HTTP(S) uses the standard library's ``http.client`` (one connection per request, redirects
followed, ``Range`` for resumption);
S3 uses boto3 (credentials, region and ``AWS_ENDPOINT_URL`` as boto3 finds them, or
``storage_options={"endpoint_url": ...}``); other schemes go through fsspec. The plain
clients were picked over fsspec's HTTP and S3 backends (aiohttp, s3fs): they are
synchronous, need no dependency for HTTP, and were as fast or faster on loopback
(``bench/bench_remote.py --transports``, numbers in ``bench/RESULTS.md``).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import socket
import urllib.parse
from typing import Any, Callable, Dict, Optional

from .retry import Cancelled, CancelToken

__all__ = ["Source", "TransientError", "PermanentError", "RemoteError", "open_source", "is_url"]

CHUNK = 1 << 20


class RemoteError(OSError):
    """A remote object could not be fetched; the message names its URL and the reason."""

    # Where in stoker's C++ sources it was raised, when it was (for bug reports).
    source_location = None


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

    def stream(self, name: str, sink: Callable[[bytes], None], offset: int = 0,
               cancel: Optional[CancelToken] = None) -> int:
        """Calls ``sink`` with consecutive chunks of object ``name`` from byte ``offset``;
        returns the object's total size as the server announced it (-1 if unknown).
        ``cancel``: a :class:`CancelToken` whose cancel() ends the transfer at once with
        :class:`Cancelled`."""
        raise NotImplementedError

    def read(self, name: str, cancel: Optional[CancelToken] = None) -> bytes:
        parts: list = []
        self.stream(name, parts.append, cancel=cancel)
        return b"".join(parts)

    def read_range(self, name: str, start: int, length: int,
                   cancel: Optional[CancelToken] = None) -> bytes:
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
    """HTTP(S) with the standard library's ``http.client``: one connection per request,
    redirects followed, the socket registered with the caller's :class:`CancelToken`
    from the moment it connects (so ``close()`` ends a transfer at once, whatever it is
    waiting for), and ``stall_timeout`` seconds at most without a byte."""

    #: Largest object read whole and sliced when a server answers a range request with
    #: the whole object (200): beyond it, :meth:`read_range` refuses such a server.
    ignored_range_limit = 1 << 20
    #: Redirects followed per request.
    max_redirects = 5

    def __init__(self, url: str, timeout: float = 30.0, headers: Optional[Dict[str, str]] = None):
        super().__init__(url)
        self.timeout = timeout  # the stall timeout: connect, and every read
        self.headers = dict(headers or {})

    def _get(self, url: str, headers: Dict[str, str], cancel: Optional[CancelToken]):
        """(connection, response) of a GET, after redirects; the caller closes the
        connection. Raises TransientError / PermanentError."""
        for _ in range(self.max_redirects + 1):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise PermanentError(f"not an http(s) URL: {url!r}")
            cls = http.client.HTTPSConnection if parts.scheme == "https" else \
                http.client.HTTPConnection
            conn = cls(parts.hostname, parts.port, timeout=self.timeout)
            closer = None
            try:
                if cancel is not None:
                    cancel.check()
                conn.connect()
                if cancel is not None:
                    # The socket itself: a response that closes its connection takes the
                    # socket over (conn.sock becomes None), still to be shut down.
                    closer = cancel.on_cancel(lambda sock=conn.sock: _shutdown(sock))
                target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                conn.request("GET", target, headers=headers)
                resp = conn.getresponse()
            except BaseException as e:
                conn.close()
                if closer is not None:
                    closer()
                if cancel is not None and cancel.cancelled:
                    raise Cancelled() from None
                if isinstance(e, _HTTP_ERRORS):
                    raise _http_error(e) from None
                raise
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                url = urllib.parse.urljoin(url, resp.getheader("Location"))
                _close(conn, resp, closer)
                continue
            if resp.status >= 400:
                reason = resp.reason
                _close(conn, resp, closer)
                raise _status_error(resp.status, reason, resp.headers)
            return conn, resp, closer
        raise PermanentError(f"more than {self.max_redirects} redirects")

    def stream(self, name, sink, offset=0, cancel=None):
        headers = dict(self.headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        conn, resp, closer = self._get(self.object_url(name), headers, cancel)
        got = 0
        expect = -1
        try:
            if offset and resp.status != 206:
                raise TransientError(f"asked for bytes from {offset}, got status {resp.status}")
            length = resp.getheader("Content-Length")
            expect = int(length) if length is not None and length.isdigit() else -1
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
            if cancel is not None and cancel.cancelled:
                raise Cancelled() from None
            if isinstance(e, (socket.timeout, TimeoutError)):
                of = f" of {expect}" if expect >= 0 else ""
                raise TransientError(f"stalled: no data for {self.timeout:g} s after {got}{of} "
                                     "bytes") from None
            raise _http_error(e) from None
        finally:
            _close(conn, resp, closer)

    def read_range(self, name: str, start: int, length: int, cancel=None) -> bytes:
        _check_range(start, length)
        if length == 0:
            return b""
        end = start + length - 1
        headers = dict(self.headers)
        headers["Range"] = f"bytes={start}-{end}"
        try:
            conn, resp, closer = self._get(self.object_url(name), headers, cancel)
        except PermanentError as e:
            if getattr(e, "status", None) == 416:
                total = (getattr(e, "headers", None) or {}).get("Content-Range") or ""
                total = total.rpartition("/")[2]
                known = f" ({total} bytes)" if total.isdigit() else ""
                raise PermanentError(f"bytes {start}-{end} are past the end of the object"
                                     f"{known} (HTTP 416)") from None
            raise
        try:
            if resp.status == 206:
                _check_content_range(resp.getheader("Content-Range"), start, end)
                return _read_exact(resp.read1, length)
            if resp.status == 200:  # the range was ignored
                cl = resp.getheader("Content-Length")
                size = int(cl) if cl is not None and cl.isdigit() else -1
                _whole_as_range(size, self.ignored_range_limit, start, end)
                return _read_exact(resp.read1, size)[start:end + 1]
            raise TransientError(f"asked for bytes {start}-{end}, got status {resp.status}")
        except _HTTP_ERRORS as e:
            if cancel is not None and cancel.cancelled:
                raise Cancelled() from None
            if isinstance(e, (socket.timeout, TimeoutError)):
                raise TransientError(f"stalled: no data for {self.timeout:g} s") from None
            raise _http_error(e) from None
        finally:
            _close(conn, resp, closer)


_HTTP_ERRORS = (http.client.HTTPException, socket.timeout, ConnectionError, TimeoutError,
                OSError)


def _close(conn: Any, resp: Any, closer: Optional[Callable[[], None]]) -> None:
    """Closes a response and its connection now (the socket with them: a response left
    to the garbage collector would keep it open until then)."""
    try:
        resp.close()
    finally:
        conn.close()
        if closer is not None:
            closer()


def _shutdown(sock: Any) -> None:
    """Ends every read and write on ``sock`` now (a thread blocked in ``recv`` returns);
    the owner closes it."""
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _status_error(code: int, reason: str, headers: Any = None) -> Exception:
    msg = f"HTTP {code} {reason}".rstrip()
    err: Exception = TransientError(msg) if code in (408, 425, 429) or code >= 500 else \
        PermanentError(msg)
    err.status = code  # type: ignore[attr-defined]
    err.headers = headers  # type: ignore[attr-defined]
    return err


def _http_error(e: BaseException) -> Exception:
    """The TransientError or PermanentError for a failed HTTP request."""
    if isinstance(e, http.client.IncompleteRead):
        return TransientError(f"body ended early ({len(e.partial)} bytes in the last read)")
    if isinstance(e, (socket.timeout, TimeoutError)):
        return TransientError("stalled: no answer within the stall timeout")
    reason = getattr(e, "reason", None) or e
    return TransientError(f"{type(e).__name__}: {reason}")


class S3Source(Source):
    _PERMANENT = {"NoSuchKey", "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                  "SignatureDoesNotMatch", "404", "403", "400", "InvalidBucketName",
                  "InvalidRange", "416"}
    ignored_range_limit = HttpSource.ignored_range_limit

    def __init__(self, url: str, timeout: float = 30.0,
                 storage_options: Optional[Dict[str, Any]] = None):
        super().__init__(url)
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ImportError("s3:// datasets need boto3 (pip install boto3: "
                              "stoker's [remote] extra)") from None
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

    def stream(self, name, sink, offset=0, cancel=None):
        from botocore.exceptions import BotoCoreError, ClientError

        kw = {"Range": f"bytes={offset}-"} if offset else {}
        got, expect, closer, body = 0, -1, None, None
        try:
            if cancel is not None:
                cancel.check()
            resp = self._client.get_object(Bucket=self.bucket, Key=self._key(name), **kw)
            body = resp["Body"]
            if cancel is not None:
                closer = cancel.on_cancel(lambda: _shutdown(_body_socket(body)))
            expect = resp.get("ContentLength", -1)
            for chunk in body.iter_chunks(CHUNK):
                got += len(chunk)
                sink(chunk)
            if expect >= 0 and got != expect:
                raise TransientError(f"body ended after {got} of {expect} bytes")
            return offset + expect if expect >= 0 else -1
        except (BotoCoreError, ClientError, OSError) as e:
            if cancel is not None and cancel.cancelled:
                raise Cancelled() from None
            if isinstance(e, (socket.timeout, TimeoutError)) or "timed out" in str(e).lower():
                of = f" of {expect}" if expect >= 0 else ""
                raise TransientError(f"stalled: no data within the stall timeout after {got}"
                                     f"{of} bytes") from None
            raise self._error(e) from None
        finally:
            if body is not None:
                with contextlib.suppress(Exception):
                    body.close()
            if closer is not None:
                closer()

    def read_range(self, name: str, start: int, length: int, cancel=None) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        _check_range(start, length)
        if cancel is not None:
            cancel.check()
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
        except (BotoCoreError, OSError) as e:
            if cancel is not None and cancel.cancelled:
                raise Cancelled() from None
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

    def stream(self, name, sink, offset=0, cancel=None):
        path = f"{self._root}/{name}"
        try:
            with self._fs.open(path, "rb") as f:
                if offset:
                    f.seek(offset)
                while True:
                    if cancel is not None:
                        cancel.check()  # between chunks: fsspec has no way in
                    chunk = f.read(CHUNK)
                    if not chunk:
                        return -1
                    sink(chunk)
        except (OSError, TimeoutError) as e:
            raise _fsspec_error(e) from None

    def read_range(self, name: str, start: int, length: int, cancel=None) -> bytes:
        _check_range(start, length)
        if length == 0:
            return b""
        if cancel is not None:
            cancel.check()
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


def _body_socket(body: Any) -> Any:
    """The socket under a botocore StreamingBody (urllib3 2), or None."""
    raw = getattr(body, "_raw_stream", None)
    conn = getattr(raw, "connection", None) if raw is not None else None
    sock = getattr(conn, "sock", None)
    if sock is None:
        fp = getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None)
        sock = getattr(fp, "_sock", None)
    return sock


def open_source(url: str, *, timeout: float = 30.0,
                storage_options: Optional[Dict[str, Any]] = None) -> Source:
    """The :class:`Source` for ``url``'s scheme; ``timeout``: seconds without progress
    before a transfer counts as stalled (connect, and every read)."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        return HttpSource(url, timeout=timeout,
                          headers=(storage_options or {}).get("headers"))
    if scheme in ("s3", "s3a"):
        return S3Source(url, timeout=timeout, storage_options=storage_options)
    return FsspecSource(url, storage_options=storage_options)


def download_to_fd(source: Source, name: str, fd: int, size: int, checksum: Optional[int],
                   cancel: Any, digest: Any, counted: Callable[[int], None]) -> None:
    """One attempt at object `name` into `fd` (from its start): exactly `size` bytes whose
    checksum (`digest`, a fresh _core.Checksum32) is `checksum` (None: not known), else
    TransientError (another attempt may do) or PermanentError (the server has other
    bytes). `counted(n)` gets the bytes that came, whatever happened."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    n = 0

    def sink(chunk: bytes) -> None:
        nonlocal n
        cancel.check()
        digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
        n += len(chunk)
        if n > size:
            raise TransientError(f"body longer than the {size} bytes index.json gives")

    try:
        source.stream(name, sink, cancel=cancel)
    finally:
        counted(n)
    if n != size:
        raise TransientError(f"got {n} bytes, index.json gives {size}")
    got = digest.digest()
    if checksum is not None and got != checksum:
        # The whole body came: the server has other bytes than index.json says.
        raise PermanentError(f"checksum {got:08x} differs from index.json's {checksum:08x} "
                             "(the whole file came: the server has other bytes, so it is not "
                             "tried again)")
