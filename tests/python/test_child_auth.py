"""Authentication toward children: OAuth client credentials (a real local authorization server
and a real resource server: a second graph-os validating JWTs) and run tokens (a FastMCP child
that verifies them as docs/configuration.md "Authentication toward children" says, over stdio and
over HTTP)."""
import json
import os
import secrets
import subprocess
import time
import urllib.request

import pytest
from mcp import Client

from conftest import PYTHON, ROOT, child_entry, free_port, structured, wait_status

pytestmark = pytest.mark.anyio

RUN_TOKEN_SERVER = ROOT / "tests" / "peers" / "run_token_server.py"


def post_json(url, body):
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def register_client(issuer):
    """RFC 7591 registration at the test authorization server: a confidential client."""
    reg = post_json(f"{issuer}/register", {
        "redirect_uris": ["http://127.0.0.1:1/cb"], "grant_types": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_method": "client_secret_basic", "scope": "discover delegate"})
    return reg["client_id"], reg["client_secret"]


def grants(issuer, audience=None):
    """Tokens the authorization server issued by client credentials (for `audience` only, if given)."""
    with urllib.request.urlopen(f"{issuer}/test/stats", timeout=10) as r:
        stats = json.loads(r.read())
    if audience is not None:
        return stats["by_audience"].get(audience, 0)
    return stats["client_credentials_grants"]


def mcp_client(gw, token=None):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(streamable_http_client(gw.url, http_client=httpx2.AsyncClient(headers=headers, timeout=30)),
                  mode="legacy")


async def test_a_child_behind_oauth_client_credentials_is_up_and_a_wrong_secret_fails_it_closed(
        write_fleet, tmp_path, http_gateway, oauth_as):
    client_id, client_secret = register_client(oauth_as)
    # The child: a real resource server (graph-os validating the authorization server's JWTs).
    inner = http_gateway(write_fleet({"tc": child_entry()}, name="inner.json"), "--oauth-issuer", oauth_as,
                         "--oauth-audience", "http://127.0.0.1:{port}/mcp", "--state-dir", str(tmp_path / "inner"))
    req = urllib.request.Request(inner.url, method="POST", data=b"{}", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 401  # without a token the child refuses
    grant = {"type": "oauth-client-credentials", "tokenUrl": f"{oauth_as}/token", "clientId": client_id,
             "scope": "delegate", "audience": inner.url}
    fleet = write_fleet({
        "rs": {"url": inner.url, "expose": "eager", "auth": {**grant, "clientSecret": "env://CC_SECRET"}},
        "bad": {"url": inner.url, "expose": "eager", "auth": {**grant, "clientSecret": "env://CC_WRONG"}},
        "post": {"url": inner.url, "expose": "eager",
                 "auth": {**grant, "clientSecret": "env://CC_SECRET", "tokenEndpointAuth": "client_secret_post"}},
        # A token for another audience: the authorization server issues it, the child refuses it.
        "aud": {"url": inner.url, "expose": "eager",
                "auth": {**grant, "clientSecret": "env://CC_SECRET", "audience": "http://127.0.0.1:9/other"}},
    })
    wrong = "wrong-secret-canary-" + secrets.token_hex(8)
    env = {**os.environ, "CC_SECRET": client_secret, "CC_WRONG": wrong}
    outer = http_gateway(fleet, "--state-dir", str(tmp_path / "outer"), env=env)
    async with mcp_client(outer) as c:
        status = await wait_status(c, lambda ch: all(ch[n]["state"] in ("up", "failed") for n in ("rs", "bad", "post"))
                                   and (ch["aud"]["last_error"] or {}).get("code"))
        refused = status["children"]["aud"]
        assert refused["state"] != "up" and refused["last_error"]["code"] == "child-auth-failed", refused
        assert status["children"]["rs"]["state"] == "up", status["children"]["rs"]
        assert status["children"]["post"]["state"] == "up", status["children"]["post"]
        bad = status["children"]["bad"]
        assert bad["state"] == "failed" and bad["last_error"]["code"] == "child-auth-failed", bad
        assert "invalid_client" in bad["last_error"]["message"]
        # Calls through: the inner gateway answers its own list_catalog, so the token was accepted.
        # (Counted for this audience only: the refused "aud" child keeps fetching tokens as it restarts.)
        before = grants(oauth_as, inner.url)
        for _ in range(5):
            r = await c.call_tool("rs__list_catalog", {"include_tools": False})
            assert not r.is_error, r
            assert "catalog_identity" in json.loads(r.content[0].text)
        assert grants(oauth_as, inner.url) == before  # the token is cached, not fetched per request
        dump = json.dumps(status)
    log = outer.stderr_path.read_text()
    for secret in (client_secret, wrong):
        assert secret not in log and secret not in dump


async def test_a_client_credentials_token_is_refreshed_before_it_expires(write_fleet, tmp_path, http_gateway):
    proc = subprocess.Popen([str(PYTHON), str(ROOT / "tests" / "peers" / "oauth_as.py"), "--port", "0",
                             "--cc-ttl", "33"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        issuer = f"http://127.0.0.1:{int(line.split()[1])}"
        client_id, client_secret = register_client(issuer)
        inner = http_gateway(write_fleet({"tc": child_entry()}, name="inner.json"), "--oauth-issuer", issuer,
                             "--oauth-audience", "http://127.0.0.1:{port}/mcp", "--state-dir", str(tmp_path / "inner"))
        fleet = write_fleet({"rs": {"url": inner.url, "expose": "eager", "auth": {
            "type": "oauth-client-credentials", "tokenUrl": f"{issuer}/token", "clientId": client_id,
            "clientSecret": "env://CC_SECRET", "scope": "delegate", "audience": inner.url}}})
        outer = http_gateway(fleet, "--state-dir", str(tmp_path / "outer"), env={**os.environ, "CC_SECRET": client_secret})
        async with mcp_client(outer) as c:
            await wait_status(c, lambda ch: ch["rs"]["state"] == "up")
            assert not (await c.call_tool("rs__list_catalog", {"include_tools": False})).is_error
            first = grants(issuer)
            time.sleep(4)  # 33 s tokens are refreshed 30 s before expiry: this one is due
            assert not (await c.call_tool("rs__list_catalog", {"include_tools": False})).is_error
            assert grants(issuer) > first
    finally:
        proc.terminate()
        proc.wait(timeout=5)


async def test_a_run_token_child_verifies_identity_and_scope_over_stdio_and_http(write_fleet, tmp_path, http_gateway):
    key = secrets.token_hex(32)
    alice, admin = "alice-token-" + secrets.token_hex(8), "admin-token-" + secrets.token_hex(8)
    port = free_port()
    http_child = subprocess.Popen([str(PYTHON), str(RUN_TOKEN_SERVER), "http", str(port)],
                                  env={**os.environ, "RUN_TOKEN_KEY": key, "RT_AUDIENCE": "rth"},
                                  stdout=subprocess.DEVNULL, stderr=open(tmp_path / "rth.log", "w"))
    try:
        auth = {"type": "run-token", "key": "env://RT_KEY", "ttl": 30}
        fleet = write_fleet({
            "rt": {"command": str(PYTHON), "args": [str(RUN_TOKEN_SERVER)], "expose": "eager", "auth": auth,
                   "env": {"RUN_TOKEN_KEY": "env://RT_KEY", "RT_AUDIENCE": "rt"}},
            "rth": {"url": f"http://127.0.0.1:{port}/mcp", "expose": "eager", "auth": auth},
            "short": {"command": str(PYTHON), "args": [str(RUN_TOKEN_SERVER)], "expose": "eager",
                      "auth": {"type": "run-token", "key": "env://SHORT_KEY"}},
        })
        env = {**os.environ, "RT_KEY": key, "SHORT_KEY": "too-short", "ALICE": alice, "ADMIN": admin}
        gw = http_gateway(fleet, "--state-dir", str(tmp_path / "state"), "--token", "delegate=env://ALICE",
                          "--token", "manage=env://ADMIN", env=env)
        seen = {}
        for who, token in (("alice", alice), ("admin", admin)):
            async with mcp_client(gw, token) as c:
                status = await wait_status(c, lambda ch: ch["rt"]["state"] == ch["rth"]["state"] == "up"
                                           and (ch["short"]["last_error"] or {}).get("code"), timeout=60)
                # A key shorter than 32 bytes never serves (it restarts within its budget, then fails).
                assert status["children"]["short"]["state"] != "up"
                assert status["children"]["short"]["last_error"]["code"] == "child-auth-failed"
                for server in ("rt", "rth"):
                    r = await c.call_tool(f"{server}__whoami", {"note": f"from {who}"})
                    assert not r.is_error, r
                    got = r.structured_content
                    assert got["ttl"] == 30 and got["claims"]["aud"] == server and got["claims"]["tool"] == "whoami"
                    assert token not in json.dumps(got)  # the caller's own credential never reaches the child
                    if server == "rth":
                        assert got["header_matches"] is True, got  # HTTP children also get the header
                    seen[(who, server)] = got
    finally:
        http_child.terminate()
        http_child.wait(timeout=5)
    assert seen[("alice", "rt")]["scope"] == "delegate" and seen[("admin", "rt")]["scope"] == "manage"
    assert seen[("alice", "rt")]["sub"].startswith("token:")
    assert seen[("alice", "rt")]["sub"] == seen[("alice", "rth")]["sub"] != seen[("admin", "rt")]["sub"]
    log = gw.stderr_path.read_text()
    assert key not in log and alice not in log and admin not in log
