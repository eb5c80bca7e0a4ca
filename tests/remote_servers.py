"""Real servers on loopback for the remote-dataset tests and bench: nginx (Debian's), an
S3 server (moto's server mode, a separate process speaking the S3 REST API), and a raw TCP
server that cuts bodies short. Each is started by its user and stopped when done."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: Optional[subprocess.Popen], what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def nginx_binary() -> Optional[str]:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.path.exists(p)), None)


NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 30;
    types {{ application/json json; }}
    default_type application/octet-stream;
    # a client may ask for a slow answer (bytes/s), to be killed mid-download
    map $http_x_test_rate $test_rate {{ default 0; "~^[0-9]+$" $http_x_test_rate; }}
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ limit_rate $test_rate; }}
        location /err500/ {{ return 500; }}
        location /err503/ {{ return 503; }}
        # the same files from a server that ignores Range and always sends them whole
        location /norange/ {{ alias {root}/; max_ranges 0; }}
    }}
}}
"""


class Nginx:
    """nginx serving ``root`` on a loopback port; ``url`` is its base URL."""

    def __init__(self, root: str, workdir: str, port: Optional[int] = None):
        binary = nginx_binary()
        if binary is None:
            raise FileNotFoundError("nginx is not installed (apt-get install nginx)")
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self.port = port or free_port()
        conf = os.path.join(workdir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(d=workdir, port=self.port, root=os.path.abspath(root)))
        self.proc = subprocess.Popen([binary, "-c", conf, "-p", workdir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_port(self.port, self.proc, "nginx")
        except BaseException:
            _stop(self.proc)
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    def requests(self, path_part: str, at_least: int = 0, timeout: float = 5.0) -> int:
        """GET requests so far whose path contains ``path_part`` (from the access log).
        nginx logs a request after its response has gone out, so a client can be ahead of
        the log: with ``at_least``, waits up to ``timeout`` for that many lines."""
        deadline = time.monotonic() + timeout
        while True:
            with open(os.path.join(self.workdir, "access.log")) as f:
                n = sum(1 for line in f if "GET " in line and path_part in line)
            if n >= at_least or time.monotonic() > deadline:
                return n
            time.sleep(0.01)

    def stop(self) -> None:
        _stop(self.proc, signal.SIGQUIT)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def kill(self) -> None:
        """Dies at once (SIGKILL): connections in flight end mid-body."""
        self.proc.kill()
        self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class S3Server:
    """moto's S3 server in its own process; ``endpoint`` is its URL."""

    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(self.port, self.proc, "moto S3 server", timeout=60)
        except BaseException:
            _stop(self.proc)
            raise
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def client(self):
        import boto3

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing")

    def upload_dir(self, local: str, bucket: str, prefix: str) -> None:
        c = self.client()
        c.create_bucket(Bucket=bucket)
        for root, _, files in os.walk(local):
            for name in files:
                path = os.path.join(root, name)
                key = f"{prefix}/{os.path.relpath(path, local)}"
                c.upload_file(path, bucket, key)

    def stop(self) -> None:
        _stop(self.proc)


class TruncatingServer:
    """Answers every GET with the file under ``root`` and its full Content-Length, but
    sends only the first ``keep`` bytes of files whose name contains ``cut`` before closing
    the connection: a body cut short, as a dropped connection leaves it. With ``ranges``,
    a ``Range: bytes=a-b`` request is answered 206 with that range (cut the same way);
    otherwise Range is ignored. With ``hang``, the connection stays open after the kept
    bytes, sending nothing more (a stalled server) until :meth:`stop`. Each connection is
    served by its own thread."""

    def __init__(self, root: str, cut: str, keep: int, ranges: bool = False,
                 hang: bool = False):
        self.root, self.cut, self.keep, self.ranges = root, cut, keep, ranges
        self.hang = hang
        self._released = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="truncating-server",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True,
                             name="truncating-conn").start()

    def _serve_one(self, conn) -> None:
        with conn:
            try:
                self._answer(conn)
            except OSError:
                pass

    def _answer(self, conn) -> None:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        path = data.split(b" ", 2)[1].decode()
        self.requests += 1
        local = os.path.join(self.root, path.lstrip("/"))
        if not os.path.isfile(local):
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close"
                         b"\r\n\r\n")
            return
        with open(local, "rb") as f:
            body = f.read()
        status, extra = b"200 OK", b""
        asked = re.search(rb"\r\nrange: *bytes=(\d+)-(\d+)\r\n", data, re.IGNORECASE)
        if self.ranges and asked:
            a, b = int(asked.group(1)), min(int(asked.group(2)), len(body) - 1)
            status, extra = b"206 Partial Content", b"Content-Range: bytes %d-%d/%d\r\n" % (
                a, b, len(body))
            body = body[a:b + 1]
        send = body[: self.keep] if self.cut in path else body
        conn.sendall(b"HTTP/1.1 %s\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n"
                     % (status, extra, len(body)) + send)
        if self.hang and self.cut in path:
            self._released.wait(600)

    def stop(self) -> None:
        self._released.set()
        self._stop = True
        self._thread.join(5)
        self.sock.close()


class GatedServer:
    """Serves the files under ``root`` over HTTP (the standard library's threading server),
    but holds back the answer to every shard (``.stk``) whose path contains none of
    ``allow`` until :meth:`open_gate` (at most ``hold`` seconds): shards that are not there
    yet, for the tests of what may and may not wait for them."""

    def __init__(self, root: str, allow: tuple = (), hold: float = 60.0,
                 ranges: bool = False):
        """``ranges=True``: answer ``Range`` requests (206) at once, gate or not; only
        whole shards are held back (for records fetched by range ahead of their shard).
        ``ranges="ignore"``: answer them at once with the whole file (200), as a server
        without range support does."""
        import functools
        import http.server
        import re

        gate = self.gate = threading.Event()
        self.requested: list = []
        self.range_requests: list = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(handler):  # noqa: N805 (the handler's self)
                path = handler.path
                m = re.fullmatch(r"bytes=(\d+)-(\d+)", handler.headers.get("Range") or "")
                if ranges == "ignore" and m and path.endswith(".stk"):
                    self.range_requests.append((path, int(m[1]), int(m[2])))
                    return super().do_GET()  # the whole file, ungated
                if ranges is True and m and path.endswith(".stk"):
                    self.range_requests.append((path, int(m[1]), int(m[2])))
                    with open(handler.translate_path(path), "rb") as f:
                        data = f.read()
                    a, b = int(m[1]), min(int(m[2]), len(data) - 1)
                    handler.send_response(206)
                    handler.send_header("Content-Range", f"bytes {a}-{b}/{len(data)}")
                    handler.send_header("Content-Length", str(b - a + 1))
                    handler.end_headers()
                    handler.wfile.write(data[a:b + 1])
                    return
                if path.endswith(".stk"):
                    self.requested.append(path)
                    if not any(a in path for a in allow):
                        gate.wait(hold)
                super().do_GET()

            def log_message(handler, *args):  # noqa: N805
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=root))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="gated-server",
                                        daemon=True)
        self._thread.start()

    def open_gate(self) -> None:
        self.gate.set()

    def stop(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


class FlakyServer:
    """Serves the files under ``root`` over HTTP (the standard library's threading server),
    answering 503 to every GET of a path containing ``fail`` while :attr:`failing` is set:
    an object store throttling one shard, until :meth:`recover`. Counts the requests per
    path (``requests``)."""

    def __init__(self, root: str, fail: str):
        import collections
        import functools
        import http.server

        self.failing = threading.Event()
        self.failing.set()
        self.requests: "collections.Counter[str]" = collections.Counter()
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(handler):  # noqa: N805 (the handler's self)
                server.requests[handler.path] += 1
                if fail in handler.path and server.failing.is_set():
                    handler.send_response(503)
                    handler.send_header("Content-Length", "0")
                    handler.end_headers()
                    return
                super().do_GET()

            def log_message(handler, *args):  # noqa: N805
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=root))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="flaky-server",
                                        daemon=True)
        self._thread.start()

    def count(self, part: str) -> int:
        return sum(n for p, n in list(self.requests.items()) if part in p)

    def recover(self) -> None:
        self.failing.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
