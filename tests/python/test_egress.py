"""Trust boundary II, egress: one URL model, the egress policy at connect time (resolve once,
check every address, pin), plain http only where allowed, and a capture listener proving that
no request reaches a host or port the policy did not admit.

Real parts: the graph-os binary (validate, streamable HTTP front in the non-loopback profile),
the project's test child over HTTP, a raw legacy-SSE child, the official Python SDK client.
"""
import json
import os
import subprocess
import time

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import GRAPH_OS, TESTCHILD, child_entry, settled, structured, wait_status
from trust_peers import CaptureListener, SseStub, loopback_alias, start_http_testchild

pytestmark = pytest.mark.anyio

TOKEN = "egress-admin-token-0123456789"


def validate(path, *extra):
    r = subprocess.run([str(GRAPH_OS), "validate", "--config", str(path), *extra], capture_output=True, text=True,
                       timeout=30)
    return r.returncode, r.stdout + r.stderr


def line_of(output, server):
    lines = [ln for ln in output.splitlines() if ln.startswith(f"server '{server}'")]
    assert lines, f"no problem reported for {server}:\n{output}"
    return "\n".join(lines)


def test_validate_refuses_the_issue_urls_naming_the_rule(write_fleet):
    cases = {
        "backslash": ("http://127.0.0.1\\.localhost:1/mcp", "backslash"),
        "backslash2": ("http://10.1.2.3\\.localhost/mcp", "backslash"),
        "pct": ("http://10.1.2.3%2e/", "percent-encoded"),
        "userinfo": ("http://user@10.0.0.1/", "user info"),
        "metadata": ("https://169.254.169.254/mcp", "egress-denied: host '169.254.169.254' is a link-local"),
        "private": ("https://10.0.0.5/mcp", "egress-denied: host '10.0.0.5' is a private (RFC 1918)"),
        "cgnat": ("https://100.64.0.9/mcp", "carrier-grade NAT"),
        "ula": ("https://[fd00::9]/mcp", "unique local"),
        "mapped": ("https://[::ffff:a00:5]/mcp", "private (RFC 1918)"),
        "mapped-text": ("https://[::ffff:10.0.0.5]/mcp", "canonical form"),
        "plain": ("http://mcp.example/mcp", "plain http"),
        "scheme": ("ws://mcp.example/mcp", "http:// or https://"),
    }
    path = write_fleet({name: {"url": url} for name, (url, _) in cases.items()})
    rc, out = validate(path)
    assert rc == 1, out
    for name, (_, needle) in cases.items():
        assert needle in line_of(out, name), out
    assert "0 servers admitted, 12 refused" in out
    # The remote profile also refuses loopback; the allow-list (entry or gateway) admits it.
    path = write_fleet({"lo": {"url": "https://127.0.0.1:9/mcp"}, "name": {"url": "https://localhost:9/mcp"}},
                       name="lo.json")
    assert validate(path)[0] == 0
    rc, out = validate(path, "--remote-profile")
    assert rc == 1 and "loopback" in line_of(out, "lo") and "loopback" in line_of(out, "name"), out
    assert validate(path, "--remote-profile", "--allowed-private-host", "127.0.0.1,localhost")[0] == 0


def gateway_client(gw):
    h = {"Authorization": f"Bearer {TOKEN}"}
    return Client(streamable_http_client(gw.url, http_client=httpx2.AsyncClient(headers=h, timeout=60)), mode="legacy")


def remote_gateway(http_gateway, fleet, *extra):
    """graph-os in the production profile: listening on every address (so loopback is not
    admitted by default), with a credential."""
    env = {**os.environ, "EGRESS_TOKEN": TOKEN}
    return http_gateway(fleet, "--host", "0.0.0.0", "--token", "manage=env://EGRESS_TOKEN", *extra, env=env)


async def test_a_name_resolving_to_a_private_address_is_refused_at_connect_time_and_admitted_when_listed(
        tmp_path, write_fleet, http_gateway):
    name = loopback_alias()
    if name is None:
        pytest.skip("no non-localhost name resolves to loopback here")
    capture = CaptureListener()
    child, port = start_http_testchild(TESTCHILD, "--allowed-host", name)
    try:
        fleet = write_fleet({
            # https to a name: nothing to judge in the config; at connect time `name` resolves to
            # 127.0.0.1 and is refused. The capture listener sits on that address and port.
            "resolves-private": {"url": f"https://{name}:{capture.port}/mcp", "headers": {"Authorization": "Bearer ${EGRESS_TOKEN}"}},
            # The same name, allow-listed on the entry (plain http is then allowed too).
            "listed": {"url": f"http://{name}:{port}/mcp", "allowedPrivateHosts": [name]},
            # An IP literal on loopback: refused by the config in this profile.
            "literal": {"url": f"https://127.0.0.1:{capture.port}/mcp"},
            "local": child_entry(),
        })
        gw = remote_gateway(http_gateway, fleet)
        async with gateway_client(gw) as c:
            st = await wait_status(c, settled)
            kids = st["children"]
            assert kids["resolves-private"]["state"] == "failed"
            err = kids["resolves-private"]["last_error"]
            assert err["code"] == "egress-denied", err
            assert name in err["message"] and "loopback" in err["message"], err
            assert TOKEN not in json.dumps(st)
            assert kids["listed"]["state"] == "up", kids["listed"]
            assert "literal" not in kids
            assert any(i["server"] == "literal" and "loopback" in i["reason"] for i in st["config_issues"])
            assert kids["local"]["state"] == "up"
            loaded = structured(await c.call_tool("load_tools", {"servers": ["listed"]}))
            add = next(t for t in loaded["loaded"] if t.endswith("__add"))
            r = await c.call_tool(add, {"a": 2, "b": 40})
            assert not r.is_error and r.content[0].text == "42", r
        time.sleep(0.3)
        assert capture.connections == 0 and capture.received == b"", (capture.connections, capture.received[:200])
    finally:
        child.kill()
        child.wait()
        capture.close()


async def test_the_gateway_allow_list_admits_a_private_destination_for_every_entry(tmp_path, write_fleet, http_gateway):
    name = loopback_alias()
    if name is None:
        pytest.skip("no non-localhost name resolves to loopback here")
    child, port = start_http_testchild(TESTCHILD, "--allowed-host", name)
    try:
        fleet = write_fleet({"a": {"url": f"http://{name}:{port}/mcp"}, "b": {"url": f"http://127.0.0.1:{port}/mcp"}})
        gw = remote_gateway(http_gateway, fleet, "--allowed-private-host", f"{name},127.0.0.0/8")
        async with gateway_client(gw) as c:
            st = await wait_status(c, settled)
            assert {n: k["state"] for n, k in st["children"].items()} == {"a": "up", "b": "up"}, st
    finally:
        child.kill()
        child.wait()


async def test_an_sse_endpoint_on_another_port_is_refused_and_never_contacted(tmp_path, write_fleet):
    capture = CaptureListener()

    def script(send):
        send(f"event: endpoint\ndata: http://127.0.0.1:{capture.port}/messages\n\n".encode())
        time.sleep(30)

    sse = SseStub(script)
    try:
        fleet = write_fleet({"sse": {"url": sse.url, "transport": "sse", "headers": {"Authorization": "Bearer ${EGRESS_TOKEN}"}},
                             "local": child_entry()})
        from mcp import StdioServerParameters
        params = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)],
                                       env={**os.environ, "EGRESS_TOKEN": TOKEN})
        async with Client(params, mode="legacy") as c:
            st = await wait_status(c, settled)
            assert st["children"]["sse"]["state"] == "failed"
            assert st["children"]["sse"]["last_error"]["code"] == "egress-denied", st["children"]["sse"]
            assert st["children"]["local"]["state"] == "up"
        time.sleep(0.3)
        assert capture.connections == 0
        assert sse.posts == []
    finally:
        sse.close()
        capture.close()


async def test_oauth_key_fetches_go_through_the_egress_policy(tmp_path, write_fleet, http_gateway, oauth_as):
    """The OAuth issuer (on loopback) is reached only when the egress policy admits it: in the
    production profile a token cannot be validated until the issuer is allow-listed."""
    fleet = write_fleet({"local": child_entry()})
    for extra, expect in (((), 503), (("--allowed-private-host", "127.0.0.1"), 200)):
        gw = http_gateway(fleet, "--host", "0.0.0.0", "--oauth-issuer", oauth_as,
                          "--oauth-audience", "http://127.0.0.1:{port}/mcp", *extra)
        import urllib.request
        req = urllib.request.Request(f"{oauth_as}/test/mint", method="POST",
                                     data=json.dumps({"aud": f"http://127.0.0.1:{gw.port}/mcp", "scope": "delegate"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            token = json.loads(r.read())["token"]
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        req = urllib.request.Request(gw.url, method="POST", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                                              "Accept": "application/json, text/event-stream"})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        log = gw.stderr_path.read_text()
        if expect == 200:
            assert status == 200, log
        else:
            assert status in (401, 503), (status, log)
            assert "egress-denied" in log, log
        gw.stop()
