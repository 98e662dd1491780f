"""Remote media URLs: fetched whole within the byte cap and the deadline, only from the hosts
allowed (redirect hops included), connecting only to public addresses unless the server allows
others, and every failure a 400-worthy MediaError naming the part."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from omni_serve.media import addresses as public_addresses
from omni_serve.media.decode import MediaError
from omni_serve.media.fetch import MAX_REDIRECTS, FetchPolicy, RemoteMedia, fetch_media
from omni_serve.media.proxy import ProxyUnreachable
from omni_serve.testing.forward_proxy import forward_proxy
from omni_serve.testing.media_server import Route, media_server, self_signed_tls

PARAM = "messages[0].content[1]"
BODY = bytes(range(256)) * 400  # 100 KB
ROUTES = {
    "/cat.png": Route(BODY),
    "/chunked.bin": Route(BODY, chunked=True),
    "/claims-huge.bin": Route(b"x", content_length=10**9),
    "/slow.png": Route(BODY, delay_s=3.0),
    "/to-cat": Route(status=302, location="/cat.png"),
    "/to-localhost": Route(status=302, location="http://localhost:{port}/cat.png"),
    "/loop": Route(status=302, location="/loop"),
}
# The test server listens on loopback, which only a policy allowing private addresses reaches.
ANY_HOST = FetchPolicy(None, timeout_s=5.0, private_addresses=True)
LOOPBACK_ONLY = FetchPolicy(frozenset({"127.0.0.1"}), timeout_s=5.0, private_addresses=True)
PUBLIC_ONLY = FetchPolicy(None, timeout_s=5.0)


@pytest.fixture(scope="module")
def server():
    with media_server(ROUTES) as running:
        yield running


def item(url: str, max_bytes: int = 1 << 20) -> RemoteMedia:
    return RemoteMedia(url, "image", max_bytes, PARAM)


async def refused(items: list[RemoteMedia], policy: FetchPolicy = ANY_HOST) -> str:
    with pytest.raises(MediaError) as caught:
        await fetch_media(items, policy)
    assert caught.value.param == PARAM
    return str(caught.value)


async def test_urls_are_fetched_whole_and_each_once(server):
    cat, chunked = server.url("/cat.png"), server.url("/chunked.bin")
    server.hits.clear()
    got = await fetch_media([item(cat), item(chunked), item(cat)], ANY_HOST)
    assert got == {cat: BODY, chunked: BODY}
    assert sorted(server.hits) == ["/cat.png", "/chunked.bin"]


async def test_a_redirect_is_followed_to_an_allowed_host(server):
    url = server.url("/to-cat")
    assert await fetch_media([item(url)], LOOPBACK_ONLY) == {url: BODY}


async def test_a_host_not_allowed_is_refused_without_a_request(server):
    server.hits.clear()
    reason = await refused([item(server.url("/cat.png", host="localhost"))], LOOPBACK_ONLY)
    assert "'localhost' is not in this server's allowed_media_domains" in reason
    assert server.hits == []


async def test_a_redirect_to_a_host_not_allowed_is_refused(server):
    server.hits.clear()
    reason = await refused([item(server.url("/to-localhost"))], LOOPBACK_ONLY)
    assert "'localhost' is not in" in reason and server.hits == ["/to-localhost"]


@pytest.mark.parametrize(
    ("path", "max_bytes", "reason"),
    [
        ("/missing.png", 1 << 20, "returned HTTP 404"),
        ("/claims-huge.bin", 1 << 20, f"is 1000000000 bytes; the limit is {1 << 20}"),
        ("/chunked.bin", 50_000, "over the limit of 50000 bytes"),
        ("/cat.png", 50_000, "the limit is 50000"),
        ("/loop", 1 << 20, f"redirects more than {MAX_REDIRECTS} times"),
    ],
)
async def test_bad_answers_are_refused_with_the_reason(server, path, max_bytes, reason):
    assert reason in await refused([item(server.url(path), max_bytes)])


async def test_a_slow_server_is_cut_off_at_the_deadline(server):
    reason = await refused(
        [item(server.url("/slow.png"))], FetchPolicy(None, timeout_s=0.3, private_addresses=True)
    )
    assert "took longer than 0.3 s" in reason


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://127.0.0.1/cat.png", "must be data:, http: or https: URLs"),
        ("file:///etc/passwd", "must be data:, http: or https: URLs"),
        ("http://127.0.0.1:1/cat.png", "could not fetch the image URL"),  # nothing listens
        ("http://[::1/cat.png", "not a valid image URL"),
    ],
)
async def test_urls_that_cannot_be_fetched_are_refused(url, reason):
    assert reason in await refused([item(url)])


async def test_one_failure_fails_the_whole_request(server):
    urls = [server.url("/cat.png"), server.url("/missing.png")]
    assert "HTTP 404" in await refused([item(url) for url in urls])


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
async def test_a_host_on_the_servers_own_network_is_refused_without_a_request(server, host):
    server.hits.clear()
    reason = await refused([item(server.url("/cat.png", host=host))], PUBLIC_ONLY)
    assert "is not a public address" in reason
    assert "api.allow_private_media_addresses" in reason and server.hits == []


@pytest.fixture
def names_on_loopback(monkeypatch) -> list[str]:
    """Every host name resolves to 127.0.0.1, counted public: the names looked up, in order."""
    looked_up: list[str] = []

    async def resolve(host: str, port: int):
        looked_up.append(host)
        return [ip_address("127.0.0.1")]

    monkeypatch.setattr(public_addresses, "resolve", resolve)
    monkeypatch.setattr(public_addresses, "is_public", lambda address: True)
    return looked_up


async def test_a_public_name_is_fetched_from_the_address_checked(server, names_on_loopback):
    """Through httpx's whole stack: the socket opens to the address the name resolved to and
    was checked against (here loopback, counted public for the test), the Host header names the
    host."""
    server.hosts.clear()
    url = server.url("/to-cat", host="media.example")
    assert await fetch_media([item(url)], PUBLIC_ONLY) == {url: BODY}
    assert names_on_loopback and set(names_on_loopback) == {"media.example"}  # the hop's too
    assert server.hosts == [f"media.example:{server.port}"] * 2


async def test_https_verifies_the_name_while_connecting_to_the_checked_address(
    names_on_loopback, monkeypatch, tmp_path
):
    """The address check connects to an IP; TLS must still verify the certificate against
    the URL's host name (a certificate for another name is refused)."""
    tls, cert_file = self_signed_tls("media.example", tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    with media_server(ROUTES, tls=tls) as server:
        url = server.url("/cat.png", host="media.example")
        assert await fetch_media([item(url)], PUBLIC_ONLY) == {url: BODY}
        reason = await refused([item(server.url("/cat.png", host="other.example"))], PUBLIC_ONLY)
        assert "certificate verify failed" in reason


@pytest.fixture
def proxy():
    with forward_proxy() as running:
        yield running


def through(proxy, private_addresses: bool = False) -> FetchPolicy:
    return FetchPolicy(None, 5.0, private_addresses=private_addresses, proxy=proxy.url)


async def test_through_a_proxy_plain_http_names_the_checked_address(
    server, proxy, names_on_loopback
):
    """The proxy (on loopback: the operator's own, not checked) is asked for the address the
    name was checked against, so a name resolving elsewhere for the proxy cannot send it
    inside; the origin still sees the name in the Host header."""
    server.hosts.clear()
    url = server.url("/to-cat", host="media.example")
    assert await fetch_media([item(url)], through(proxy)) == {url: BODY}
    assert proxy.asked == [
        f"GET http://127.0.0.1:{server.port}/to-cat HTTP/1.1",
        f"GET http://127.0.0.1:{server.port}/cat.png HTTP/1.1",  # the redirect, checked too
    ]
    assert names_on_loopback == ["media.example"] * 2
    assert server.hosts == [f"media.example:{server.port}"] * 2


async def test_through_a_proxy_https_tunnels_to_the_name_and_verifies_it(
    proxy, names_on_loopback, monkeypatch, tmp_path
):
    tls, cert_file = self_signed_tls("media.example", tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    with media_server(ROUTES, tls=tls) as server:
        url = server.url("/cat.png", host="media.example")
        assert await fetch_media([item(url)], through(proxy)) == {url: BODY}
        assert proxy.asked == [f"CONNECT media.example:{server.port} HTTP/1.1"]
        assert names_on_loopback == ["media.example"]  # checked before the proxy was asked
        reason = await refused([item(server.url("/cat.png", host="other.example"))], through(proxy))
        assert "certificate verify failed" in reason


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_through_a_proxy_an_internal_host_is_refused_before_the_proxy_is_asked(
    server, proxy, host
):
    server.hits.clear()
    reason = await refused([item(server.url("/cat.png", host=host))], through(proxy))
    assert "is not a public address" in reason
    assert proxy.asked == [] and server.hits == []


async def test_through_a_proxy_a_name_that_does_not_resolve_is_a_400(proxy):
    reason = await refused([item("http://no-such-host.invalid/cat.png")], through(proxy))
    assert "cannot resolve 'no-such-host.invalid'" in reason and proxy.asked == []


async def test_private_addresses_allowed_go_through_the_proxy_unchecked(server, proxy):
    url = server.url("/cat.png", host="localhost")
    assert await fetch_media([item(url)], through(proxy, private_addresses=True)) == {url: BODY}
    assert proxy.asked == [f"GET {url} HTTP/1.1"]  # by name: the proxy resolves it


@pytest.mark.parametrize("private_addresses", [False, True])
async def test_a_proxy_that_cannot_be_reached_is_the_servers_trouble(private_addresses):
    """Not a 400 blaming the client's URL, and the proxy's URL (it may hold credentials) is
    not in the message."""
    with forward_proxy() as gone:
        policy = FetchPolicy(
            None, 5.0, private_addresses, proxy=f"http://u:secret@127.0.0.1:{gone.port}"
        )
    with pytest.raises(ProxyUnreachable) as caught:
        await fetch_media([item("http://93.184.216.34/cat.png")], policy)
    assert "cannot connect to the media proxy" in str(caught.value)
    assert "secret" not in str(caught.value)
