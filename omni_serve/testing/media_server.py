"""A local HTTP server of media files, for tests of remote media URLs (no internet here, and a
real server exercises what a mock transport would not: headers, chunking, redirects, sockets).
"""

from __future__ import annotations

import contextlib
import datetime
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Route:
    """What a path answers: ``body`` with ``status`` (and a ``Content-Length`` unless
    ``chunked``), or a redirect to ``location``, after ``delay_s``."""

    body: bytes = b""
    status: int = 200
    location: str | None = None
    chunked: bool = False
    delay_s: float = 0.0
    content_type: str = "application/octet-stream"
    content_length: int | None = None  # declared instead of the body's (a lying server)


@dataclass
class MediaServer:
    port: int
    scheme: str = "http"
    hits: list[str] = field(default_factory=list)  # the paths asked for, in order
    hosts: list[str] = field(default_factory=list)  # their Host headers

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"


def self_signed_tls(host: str, directory: Path) -> tuple[ssl.SSLContext, Path]:
    """A server TLS context whose certificate names ``host``, and that certificate's file: a
    client trusting it (``SSL_CERT_FILE``) verifies ``host`` and no other name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context, cert_file


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a refused fetch hangs up
            super().handle_error(request, client_address)


@contextlib.contextmanager
def media_server(
    routes: dict[str, Route], tls: ssl.SSLContext | None = None
) -> Iterator[MediaServer]:
    """Serves ``routes`` on 127.0.0.1 (any port) while the block runs, over https with
    ``tls``; a path not in it is a 404. Route locations may name the port as ``{port}``."""
    server_state: MediaServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            server_state.hits.append(self.path)
            server_state.hosts.append(self.headers.get("Host", ""))
            route = routes.get(self.path, Route(b"not found", status=404))
            time.sleep(route.delay_s)
            self.send_response(route.status)
            self.send_header("Content-Type", route.content_type)
            if route.location is not None:
                self.send_header("Location", route.location.format(port=server_state.port))
            if route.chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for start in range(0, len(route.body), 65536):
                    piece = route.body[start : start + 65536]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
                return
            declared = len(route.body) if route.content_length is None else route.content_length
            self.send_header("Content-Length", str(declared))
            self.end_headers()
            self.wfile.write(route.body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = _Server(("127.0.0.1", 0), Handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    server_state = MediaServer(httpd.server_address[1], "http" if tls is None else "https")
    with serving(httpd):
        yield server_state


@contextlib.contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[None]:
    """Runs ``server`` on a thread of its own while the block runs, then closes it."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
