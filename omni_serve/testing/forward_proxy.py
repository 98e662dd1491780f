"""A local forward HTTP proxy, for tests of media fetches through ``api.media_proxy``: plain
requests in absolute form and CONNECT tunnels, each request line recorded. Every host name
it is asked for connects to 127.0.0.1 (no DNS here), an IP literal to itself.
"""

from __future__ import annotations

import contextlib
import select
import socket
import socketserver
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import ip_address
from urllib.parse import urlsplit

from omni_serve.testing.media_server import serving


@dataclass
class ForwardProxy:
    port: int
    asked: list[str] = field(default_factory=list)  # request lines, in order

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _address_of(host: str) -> str:
    try:
        return str(ip_address(host.strip("[]")))
    except ValueError:
        return "127.0.0.1"


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copies bytes both ways until either side closes (or 30 s pass quietly)."""
    while True:
        ready, _, _ = select.select([a, b], [], [], 30.0)
        if not ready:
            return
        for source in ready:
            data = source.recv(65536)
            if not data:
                return
            (b if source is a else a).sendall(data)


@contextlib.contextmanager
def forward_proxy() -> Iterator[ForwardProxy]:
    """Runs the proxy on 127.0.0.1 (any port) while the block runs."""
    state: ForwardProxy

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = self.request.recv(65536)
                if not chunk:
                    return
                head += chunk
            header, rest = head.split(b"\r\n\r\n", 1)
            lines = header.decode("latin-1").split("\r\n")
            state.asked.append(lines[0])
            method, target, version = lines[0].split(" ")
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                upstream = socket.create_connection((_address_of(host), int(port)))
                self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:  # absolute form: ask the origin in origin form, one request per connection
                url = urlsplit(target)
                upstream = socket.create_connection((_address_of(url.hostname), url.port or 80))
                path = (url.path or "/") + (f"?{url.query}" if url.query else "")
                hop_by_hop = ("connection:", "proxy-connection:")
                kept = [h for h in lines[1:] if not h.lower().startswith(hop_by_hop)]
                head_out = [f"{method} {path} {version}", *kept, "Connection: close", "", ""]
                upstream.sendall("\r\n".join(head_out).encode("latin-1"))
            with upstream:
                upstream.sendall(rest)
                _pipe(self.request, upstream)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    state = ForwardProxy(server.server_address[1])
    with serving(server):
        yield state
