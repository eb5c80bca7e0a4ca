"""Where remote objects come from: HTTP(S), S3, or any other fsspec URL.

A :class:`Source` streams one object (a shard, ``index.json``) into a callback, raising
:class:`TransientError` for what a retry may fix (connection errors, timeouts, 5xx and 429
answers, a body shorter than announced) and :class:`PermanentError` for what it will not
(404, 403, no credentials). Retries and backoff are the caller's (:mod:`.cache`), so every
transport retries the same way.

HTTP(S) uses the standard library (one request per object, ``Range`` for resumption);
S3 uses boto3 (credentials, region and ``AWS_ENDPOINT_URL`` as boto3 finds them, or
``storage_options={"endpoint_url": ...}``); other schemes go through fsspec. The plain
clients were picked over fsspec's HTTP and S3 backends (aiohttp, s3fs): they are
synchronous, need no dependency for HTTP, and were as fast or faster on loopback
(``bench/bench_remote.py --transports``, numbers in ``bench/RESULTS.md``).
"""

from __future__ import annotations

import http.client
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


class HttpSource(Source):
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
        except urllib.error.HTTPError as e:
            msg = f"HTTP {e.code} {e.reason}"
            e.close()
            if e.code in (408, 425, 429) or e.code >= 500:
                raise TransientError(msg) from None
            raise PermanentError(msg) from None
        except http.client.IncompleteRead as e:
            raise TransientError(f"body ended early ({len(e.partial)} bytes in the last "
                                 "read)") from None
        except (urllib.error.URLError, http.client.HTTPException, socket.timeout,
                ConnectionError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise TransientError(f"{type(e).__name__}: {reason}") from None


class S3Source(Source):
    _PERMANENT = {"NoSuchKey", "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                  "SignatureDoesNotMatch", "404", "403", "400", "InvalidBucketName"}

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
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

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
        except NoCredentialsError:
            raise PermanentError("no AWS credentials found (environment, ~/.aws or instance "
                                 "role)") from None
        except ClientError as e:
            err = e.response.get("Error", {})
            code = str(err.get("Code", "?"))
            msg = f"S3 {code}: {err.get('Message', '')}".rstrip(": ")
            if code in self._PERMANENT:
                raise PermanentError(msg) from None
            raise TransientError(msg) from None
        except BotoCoreError as e:
            raise TransientError(f"{type(e).__name__}: {e}") from None
        except (ConnectionError, TimeoutError, socket.timeout) as e:
            raise TransientError(f"{type(e).__name__}: {e}") from None


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
        except FileNotFoundError as e:
            raise PermanentError(f"not found ({e})") from None
        except PermissionError as e:
            raise PermanentError(f"permission denied ({e})") from None
        except (OSError, TimeoutError) as e:
            raise TransientError(f"{type(e).__name__}: {e}") from None


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
