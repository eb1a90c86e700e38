"""graph-os as an OAuth 2.1 resource server (MCP authorization, 2025-11-25): the official Python
SDK's client-side OAuth discovers the protected-resource metadata, registers, authorizes (PKCE)
and calls a tool; forged, expired, foreign and under-scoped tokens are refused; a rotated signing
key is picked up without a restart. The authorization server is real (tests/peers/oauth_as.py,
built on the SDK's own mcp.server.auth), its keys generated at start."""
from urllib.parse import parse_qs, urlparse

import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

from conftest import child_entry, settled, structured, wait_status

pytestmark = pytest.mark.anyio


class MemoryStorage(TokenStorage):
    def __init__(self):
        self.tokens = self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, info):
        self.client_info = info


def headless_oauth(server_url, login_hint):
    """The SDK's OAuth client with a 'browser' that follows the authorization redirect itself."""
    captured, seen = {}, []

    async def redirect_handler(url: str) -> None:
        seen.append(url)
        async with httpx2.AsyncClient(follow_redirects=False) as browser:
            r = await browser.get(url + f"&login_hint={login_hint}")
        assert r.status_code == 302, r.text
        q = parse_qs(urlparse(r.headers["location"]).query)
        assert "error" not in q, q
        captured.update(code=q["code"][0], state=q["state"][0], iss=q.get("iss", [None])[0])

    async def callback_handler() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(**captured)

    provider = OAuthClientProvider(
        server_url=server_url,
        client_metadata=OAuthClientMetadata(redirect_uris=["http://127.0.0.1:1/callback"],
                                            grant_types=["authorization_code", "refresh_token"],
                                            token_endpoint_auth_method="none"),
        storage=MemoryStorage(), redirect_handler=redirect_handler, callback_handler=callback_handler)
    return provider, seen


def oauth_gateway(http_gateway, write_fleet, issuer, *extra):
    return http_gateway(write_fleet({"tc": child_entry()}), "--oauth-issuer", issuer,
                        "--oauth-audience", "http://127.0.0.1:{port}/mcp", *extra)


async def test_the_sdk_client_discovers_authorizes_and_calls_a_tool(write_fleet, http_gateway, oauth_as):
    gw = oauth_gateway(http_gateway, write_fleet, oauth_as)
    # RFC 9728 metadata at the path-suffixed and the root well-known URL.
    import json

    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        status, body = gw.get(path)
        doc = json.loads(body)
        assert status == 200 and doc["resource"] == gw.url and doc["authorization_servers"] == [oauth_as], doc
    auth, seen = headless_oauth(gw.url, "alice")
    async with httpx2.AsyncClient(auth=auth, timeout=30) as http, \
            Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"tools": ["tc__add"]}))
        r = await client.call_tool("tc__add", {"a": 20, "b": 22})
        assert not r.is_error and r.content[0].text == "42"
    assert len(seen) == 1 and "resource=" in seen[0] and "code_challenge_method=S256" in seen[0]


def mcp_post(gw, token):
    import urllib.error
    import urllib.request
    import json

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}).encode()
    req = urllib.request.Request(gw.url, method="POST", data=body, headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def challenge(headers):
    return headers.get("www-authenticate") or headers.get("WWW-Authenticate") or ""


async def test_forged_expired_foreign_and_underscoped_tokens_are_refused(write_fleet, http_gateway, oauth_as):
    gw = oauth_gateway(http_gateway, write_fleet, oauth_as)
    audience = gw.url
    async with httpx2.AsyncClient() as http:
        async def mint(**body):
            r = await http.post(f"{oauth_as}/test/mint", json={"sub": "mallory", "aud": audience, **body})
            return r.json()["token"]

        good = await mint(scope="delegate")
        assert mcp_post(gw, good)[0] == 200
        status, h, _ = mcp_post(gw, None)
        assert status == 401 and f'resource_metadata="http://127.0.0.1:{gw.port}/.well-known/oauth-protected-resource/mcp"' in challenge(h)
        header, payload, signature = good.split(".")
        tampered = header + "." + payload[:-4] + ("AAAA" if not payload.endswith("AAAA") else "BBBB") + "." + signature
        cases = {
            "another audience": await mint(scope="delegate", aud="http://127.0.0.1:1/other"),
            "expired": await mint(scope="delegate", exp_offset_s=-600),
            "tampered": tampered,
            "unknown key": await mint(scope="delegate", sign_with_unknown_key=True),
            "another issuer": await mint(scope="delegate", iss_override="https://evil.example"),
        }
        for name, token in cases.items():
            status, h, body = mcp_post(gw, token)
            assert status == 401, (name, status, body)
            assert 'error="invalid_token"' in challenge(h), (name, challenge(h))
            assert token not in body and token not in gw.stderr_path.read_text()
        # A valid token that maps to no graph-os scope: 403 insufficient_scope (step-up).
        status, h, body = mcp_post(gw, await mint(scope="openid profile"))
        assert status == 403 and 'error="insufficient_scope"' in challenge(h), (status, h, body)
        # A discover-only token gets in, and is refused the child paths inside MCP.
        reader = httpx2.AsyncClient(headers={"Authorization": f"Bearer {await mint(scope='discover')}"}, timeout=30)
        async with Client(streamable_http_client(gw.url, http_client=reader), mode="legacy") as c:
            await wait_status(c, settled)
            r = await c.call_tool("load_tools", {"tools": ["tc__add"]})
            assert r.is_error and r.content[0].text.startswith("authorization-denied")


async def test_a_rotated_signing_key_is_picked_up_without_a_restart(write_fleet, http_gateway, oauth_as):
    gw = oauth_gateway(http_gateway, write_fleet, oauth_as, "--oauth-jwks-min-refresh", "1")
    async with httpx2.AsyncClient() as http:
        async def mint(**body):
            r = await http.post(f"{oauth_as}/test/mint", json={"sub": "alice", "aud": gw.url, "scope": "delegate", **body})
            return r.json()["token"]

        old = await mint()
        assert mcp_post(gw, old)[0] == 200
        rotated = (await http.post(f"{oauth_as}/test/rotate?keep_old=0")).json()
        new = await mint()
        import jwt

        assert jwt.get_unverified_header(new)["kid"] == rotated["kid"]
        import anyio

        await anyio.sleep(1.2)  # past --oauth-jwks-min-refresh since the last fetch
        assert mcp_post(gw, new)[0] == 200  # unknown kid → JWKS refetched
        assert mcp_post(gw, old)[0] == 401  # the withdrawn key no longer verifies
        pid = gw.proc.pid
        assert gw.proc.poll() is None and gw.proc.pid == pid


async def test_scope_claims_are_compared_whole_never_split_on_other_whitespace(write_fleet, http_gateway, oauth_as):
    """RFC 6749 §3.3: a scope string is split on U+0020 only; an array claim's elements are values
    as they are. A group named "waitlist mcp-admins" is not mcp-admins; "x\\u00a0manage" and
    "x\\tmanage" are one unknown value each."""
    groups = http_gateway(write_fleet({"tc": child_entry()}, name="groups.json"), "--oauth-issuer", oauth_as,
                          "--oauth-audience", "http://127.0.0.1:{port}/mcp", "--oauth-scope-claim", "groups",
                          "--oauth-scope-map", "mcp-admins=manage", "--oauth-scope-map", "mcp-users=discover")
    plain = oauth_gateway(http_gateway, write_fleet, oauth_as)
    async with httpx2.AsyncClient() as http:
        async def mint(gw, **extra):
            r = await http.post(f"{oauth_as}/test/mint", json={"sub": "mallory", "aud": gw.url, "extra": extra})
            return r.json()["token"]

        async def status(gw, token):
            return mcp_post(gw, token)[0]

        async def manages(gw, token):
            """Whether the token's caller holds manage: catalog_refresh is manage-only."""
            h = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
            async with Client(streamable_http_client(gw.url, http_client=h), mode="legacy") as c:
                r = await c.call_tool("catalog_refresh", {})
                assert r.is_error, r  # an empty request: refused either way, by scope or by schema
                return (r.structured_content or {}).get("code") != "authorization-denied"

        # Whole values grant; a value hidden in another (array element, other whitespace) does not.
        assert await manages(groups, await mint(groups, groups=["mcp-admins"]))
        assert await manages(groups, await mint(groups, groups="waitlist mcp-admins"))
        for forged in (["waitlist mcp-admins"], ["waitlist\u00a0mcp-admins"], "waitlist\u00a0mcp-admins",
                       "waitlist\tmcp-admins"):
            token = await mint(groups, groups=forged)
            assert await status(groups, token) == 403, forged  # maps to no scope at all
            # With a genuine discover group beside it: in, but never manage.
            token = await mint(groups, groups=(forged if isinstance(forged, list) else [forged]) + ["mcp-users"])
            assert not await manages(groups, token), forged
        for forged in ("x\u00a0manage", "x\tmanage", "openid\u3000manage"):
            assert await status(plain, await mint(plain, scope=forged)) == 403, repr(forged)
            assert not await manages(plain, await mint(plain, scope=forged + " discover")), repr(forged)
        assert await manages(plain, await mint(plain, scope="openid manage"))
