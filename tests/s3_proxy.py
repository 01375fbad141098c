"""A loopback HTTP proxy in front of a real S3 endpoint that drops chosen request headers.

With `If-None-Match` dropped, the endpoint behind it behaves as one that ignores conditional
writes: a second PUT of the same key overwrites instead of answering 412. Only the standard
library is used; the proxy serves on 127.0.0.1, counts the headers it dropped (so a test can
show the fault was really injected), and stops itself after `lifetime_s` at the latest.

    with HeaderDroppingProxy(s3_endpoint) as proxy:
        ... use proxy.endpoint as the S3 endpoint ...
    assert proxy.dropped > 0

Given a server-side `ssl.SSLContext` (`tls`), the proxy serves HTTPS instead (the endpoint behind
it stays plain HTTP); each connection's handshake runs in its own thread, and the handshakes
that failed are counted (`failed_handshakes`).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

# Headers that describe one connection, not the request; never forwarded.
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


class HeaderDroppingProxy:
    def __init__(
        self,
        upstream: str,
        drop: tuple[str, ...] = ("If-None-Match",),
        lifetime_s: float = 300.0,
        timeout_s: float = 30.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        target = urlsplit(upstream)
        if target.scheme != "http" or not target.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host = target.hostname
        self.upstream_port = target.port or 80
        self.drop = {name.lower() for name in drop}
        self.timeout_s = timeout_s
        self.lifetime_s = lifetime_s
        self.dropped = 0
        self.requests = 0
        self.failed_handshakes = 0
        self.tls = tls
        self._lock = threading.Lock()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True

    @property
    def endpoint(self) -> str:
        port = self._server.server_address[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"

    def start(self) -> HeaderDroppingProxy:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.cancel()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HeaderDroppingProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _count(self, dropped: int) -> None:
        with self._lock:
            self.requests += 1
            self.dropped += dropped

    def _count_failed_handshake(self) -> None:
        with self._lock:
            self.failed_handshakes += 1

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        kept = [(k, v) for k, v in headers if k.lower() not in self.drop | _HOP_BY_HOP]
        self._count(sum(1 for k, _ in headers if k.lower() in self.drop))
        connection = http.client.HTTPConnection(
            self.upstream_host, self.upstream_port, timeout=self.timeout_s
        )
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for key, value in kept:
                connection.putheader(key, value)
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            response = connection.getresponse()
            payload = response.read()
            answer = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            return response.status, response.reason, answer, payload
        finally:
            connection.close()


class _Server(ThreadingHTTPServer):
    """The proxy's server on a loopback port: HTTPS when the proxy has a TLS context, each
    connection's handshake in the connection's own thread (a failed one is counted, not
    served)."""

    daemon_threads = True

    def __init__(self, proxy: HeaderDroppingProxy) -> None:
        super().__init__(("127.0.0.1", 0), _handler_for(proxy))
        self.proxy = proxy

    def finish_request(self, request: socket.socket, client_address: Any) -> None:
        if self.proxy.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(self.proxy.timeout_s)
        try:
            secured = self.proxy.tls.wrap_socket(request, server_side=True)
        except OSError:  # ssl.SSLError included: the client refused us, or we refused it
            self.proxy._count_failed_handshake()
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()


def _handler_for(proxy: HeaderDroppingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so no body framing can go wrong between them.
        protocol_version = "HTTP/1.0"

        def _relay(self) -> None:
            body = self._read_body()
            status, reason, headers, payload = proxy.forward(
                self.command, self.path, list(self.headers.items()), body
            )
            self.send_response(status, reason)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _read_body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                chunks: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the test reports what matters

    return Handler


class HoldingProxy(HeaderDroppingProxy):
    """Forwards everything, but holds each PUT whose path contains `path_part` and whose body
    contains `body_part` until `release()` (or `hold_s` after it arrived), as a network may
    deliver a request its client gave up on. Every held request is then delivered, in order.
    """

    def __init__(self, upstream: str, path_part: str, body_part: bytes, hold_s: float) -> None:
        super().__init__(upstream, drop=(), lifetime_s=max(60.0, 4 * hold_s))
        self.path_part, self.body_part, self.hold_s = path_part, body_part, hold_s
        self.held = 0
        self.delivered: list[int] = []  # the statuses the endpoint answered to held requests
        self._released = threading.Event()

    def release(self) -> None:
        """Deliver the held requests now."""
        self._released.set()

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        holds = method == "PUT" and self.path_part in path and self.body_part in body
        if holds:
            with self._lock:
                self.held += 1
            self._released.wait(self.hold_s)
        answer = super().forward(method, path, headers, body)
        if holds:
            with self._lock:
                self.delivered.append(answer[0])
        return answer


class SequencedProxy(HeaderDroppingProxy):
    """Forwards everything, but holds each PUT whose path contains `path_part` and whose body
    contains one of `bodies` (label -> part), until `deliver()` sends the held ones on, one at
    a time, in the order they arrived or the reverse; `hold_s` after it arrived at the latest.
    Each held request is then delivered as its client sent it, whether or not that client is
    still waiting (it gave up long ago: the point). The proxy stops after `lifetime_s`; a
    request still held when it stops is dropped, never delivered (status -1).
    """

    def __init__(
        self,
        upstream: str,
        path_part: str,
        bodies: dict[str, bytes],
        hold_s: float,
        lifetime_s: float,
    ) -> None:
        super().__init__(upstream, drop=(), lifetime_s=lifetime_s)
        self.path_part, self.bodies, self.hold_s = path_part, bodies, hold_s
        self.held: list[str] = []  # the label of each held request, in arrival order
        self.delivered: list[tuple[str, int]] = []  # (label, status) in delivery order
        self._gates: list[tuple[threading.Event, threading.Event]] = []  # (release, answered)
        self._stopped = threading.Event()
        # A held request's client has gone when it is delivered: its reply has nowhere to go.
        self._server.handle_error = lambda request, address: None  # type: ignore[method-assign,assignment]

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            gates = list(self._gates)
        for release, _ in gates:
            release.set()  # dropped: see forward()
        super().stop()

    def deliver(self, reverse: bool = False, timeout_s: float = 30.0) -> list[tuple[str, int]]:
        """Send the held requests on one after the other, each once the one before it was
        answered (or `timeout_s` passed); returns (label, status) of each, in that order."""
        with self._lock:
            gates = list(reversed(self._gates) if reverse else self._gates)
        for release, answered in gates:
            release.set()
            answered.wait(timeout_s)
        with self._lock:
            return list(self.delivered)

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        label = self._label(method, path, body)
        if label is None:
            return super().forward(method, path, headers, body)
        release, answered = threading.Event(), threading.Event()
        with self._lock:
            self.held.append(label)
            self._gates.append((release, answered))
        release.wait(self.hold_s)
        status = -1  # dropped, or no answer from the endpoint
        try:
            if self._stopped.is_set():
                return 502, "Dropped by the proxy", [], b""
            answer = super().forward(method, path, headers, body)
            status = answer[0]
            return answer
        finally:
            with self._lock:
                self.delivered.append((label, status))
            answered.set()

    def _label(self, method: str, path: str, body: bytes) -> str | None:
        if method != "PUT" or self.path_part not in path:
            return None
        return next((label for label, part in self.bodies.items() if part in body), None)
