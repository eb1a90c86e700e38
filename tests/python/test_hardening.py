"""Hardening III at the HTTP front, as an attacker tries it: one decoder for admission and rmcp,
anonymous callers that are never one principal, operator endpoints that tell strangers nothing,
and session ids that never reach the store unless they are session ids.

Real parts only: the real graph-os binary over streamable HTTP, the official Python SDK client,
the project's test child and a real redis-server for the shared store.
"""
import concurrent.futures
import json

import anyio
import pytest

from conftest import child_entry, settled, structured, wait_status
from test_trust import (DELEGATE, DISCOVER, TOKEN_ARGS, client, initialize_body, modern, post, rss_mb,
                        token_env)

pytestmark = pytest.mark.anyio

PAD = 3_500_000


def rss_parts(pid):
    fields = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[k] = int(v.split()[0]) // 1024
    return fields


def padded_initialize(method="initiali\\u007ae", where="capabilities"):
    """An initialize whose method is spelled with a JSON escape, carrying 3.5 MB of params."""
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
    if where == "capabilities":
        params["capabilities"] = {"experimental": {"pad": {"x": "A" * PAD}}}
    else:
        params["pad"] = "A" * PAD
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "@METHOD@", "params": params})
    return body.replace("@METHOD@", method).encode()


def raw_post(url, data, headers):
    import urllib.error
    import urllib.request
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
    req = urllib.request.Request(url, method="POST", headers=h, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


@pytest.mark.parametrize("where", ["capabilities", "unknown-field"])
async def test_escaped_initialize_floods_are_admitted_as_initialize(write_fleet, http_gateway, where):
    gw = http_gateway(write_fleet({}), *TOKEN_ARGS, "--max-sessions-per-principal", "10", env=token_env())
    auth = {"Authorization": f"Bearer {DISCOVER}"}
    body = padded_initialize(where=where)
    before_parts = rss_parts(gw.proc.pid)
    before = before_parts["RssAnon"]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        answers = list(ex.map(lambda _: raw_post(gw.url, body, auth), range(100)))
    await anyio.sleep(2.5)  # the allocator's free memory is handed back a second after a burst
    after_parts = rss_parts(gw.proc.pid)
    after = after_parts["RssAnon"]
    codes = {}
    for status, _, _ in answers:
        codes[status] = codes.get(status, 0) + 1
    sessions = [h.get("mcp-session-id") or h.get("Mcp-Session-Id") for s, h, _ in answers if s == 200]
    # Anonymous memory is what the gateway holds; file pages are its own code, paged in once.
    print(f"{where}: {codes}; RssAnon {before} -> {after} MB; before {before_parts}, after {after_parts}")
    if where == "capabilities":
        # What a session would keep is over the 64 KiB bound: refused before rmcp sees it.
        assert codes == {413: 100}, codes
        assert all("initialize-too-large" in b for s, _, b in answers)
    else:
        # rmcp keeps no unknown field: the sessions are small, and at most the principal's cap.
        assert codes.get(200, 0) == 10 and codes.get(429, 0) == 90, codes
        assert all(sessions)
    assert after - before < 20, (before, after)


async def test_a_second_initialize_inside_a_session_is_refused(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({}), *TOKEN_ARGS, env=token_env())
    auth = {"Authorization": f"Bearer {DISCOVER}"}
    status, h, _ = post(gw.url, initialize_body(), auth)
    assert status == 200
    sid = h.get("mcp-session-id") or h.get("Mcp-Session-Id")
    post(gw.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {**auth, "Mcp-Session-Id": sid})
    for method in ("initialize", "initiali\\u007ae"):
        data = json.dumps(initialize_body()).replace('"initialize"', f'"{method}"').encode()
        status, _, body = raw_post(gw.url, data, {**auth, "Mcp-Session-Id": sid,
                                                  "Mcp-Protocol-Version": "2025-11-25"})
        assert "already-initialized" in body, (status, body)
    # The session itself still works.
    status, _, body = post(gw.url, {"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
                           {**auth, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-11-25"})
    assert status == 200 and "find_tools" in body, body


@pytest.mark.parametrize("configured", [False, True])
async def test_two_anonymous_callers_share_nothing_in_either_era(write_fleet, http_gateway, configured):
    extra = [*TOKEN_ARGS, "--anonymous-scope", "delegate"] if configured else []
    gw = http_gateway(write_fleet({"tc": child_entry()}), *extra, env=token_env())
    # 2025: two sessions from the same address.
    async with client(gw) as a, client(gw) as b:
        await wait_status(a, settled)
        structured(await a.call_tool("load_tools", {"tools": ["tc__add"]}))
        names_a = {t.name for t in (await a.list_tools()).tools}
        names_b = {t.name for t in (await b.list_tools()).tools}
        assert "tc__add" in names_a and "tc__add" not in names_b, (names_a, names_b)
        unloaded = structured(await b.call_tool("unload_tools", {"tools": ["tc__add"]}))
        assert "tc__add" in {t.name for t in (await a.list_tools()).tools}, unloaded
    # 2026: two callers on their own connections, same address, no handle: with --anonymous-scope
    # each connection is its own principal; in local development each client program (two
    # programs: two User-Agents), while one program's own requests share its loaded set.
    body, headers = modern("tools/call", {"name": "load_tools", "arguments": {"tools": ["tc__add"]}})
    headers.update({"Mcp-Name": "load_tools", "User-Agent": "program-a"})
    status, _, answer = post(gw.url, body, headers)
    assert status == 200 and "tc__add" in answer, answer
    body, headers = modern("tools/list")
    status, _, listed = post(gw.url, body, {**headers, "User-Agent": "program-b"})
    assert status == 200 and "tc__add" not in listed, listed
    status, _, mine = post(gw.url, body, {**headers, "User-Agent": "program-a"})
    assert ("tc__add" in mine) == (not configured), mine


async def test_strangers_learn_nothing_from_metrics_and_readyz(write_fleet, http_gateway, tmp_path):
    fleet = write_fleet({"hidden-payments": child_entry(requiredScopes=["manage"]), "tc": child_entry()})
    gw = http_gateway(fleet, *TOKEN_ARGS, "--anonymous-scope", "discover", env=token_env())
    async with client(gw, DELEGATE) as c:
        await wait_status(c, settled)
    status, body = gw.get("/metrics", {})
    assert status == 401 and "hidden-payments" not in body and "tc__" not in body, (status, body[:200])
    status, body = gw.get("/metrics", {"Authorization": f"Bearer {DISCOVER}", "Host": "evil.example"})
    assert status == 403 and "host-not-allowed" in body, (status, body)
    status, body = gw.get("/metrics", {"Authorization": f"Bearer {DISCOVER}"})
    assert status == 200 and "graphos_" in body
    status, body = gw.get("/readyz", {})
    assert status == 200 and json.loads(body) == {"ready": True}, body
    status, body = gw.get("/readyz", {"Authorization": f"Bearer {DISCOVER}"})
    assert status == 200 and "catalog_generation" in body, body


async def test_hidden_and_missing_servers_look_alike_to_load_tools(write_fleet, http_gateway):
    fleet = write_fleet({"hidden-payments": child_entry(requiredScopes=["manage"]), "tc": child_entry()})
    gw = http_gateway(fleet, *TOKEN_ARGS, env=token_env())
    async with client(gw, DELEGATE) as c:
        await wait_status(c, settled)
        hidden = structured(await c.call_tool("load_tools", {"servers": ["hidden-payments"]}))
        missing = structured(await c.call_tool("load_tools", {"servers": ["no-such-server"]}))
    strip = lambda r: json.dumps(r).replace("hidden-payments", "X").replace("no-such-server", "X")
    assert strip(hidden) == strip(missing), (hidden, missing)


@pytest.mark.parametrize("bad", ["{sid}:loaded", "{sid}:x", "../../etc", "a" * 300, "s p a c e"])
async def test_session_ids_that_are_not_session_ids_never_reach_the_store(write_fleet, http_gateway, bad, tmp_path):
    import shutil
    import socket
    import subprocess
    if not shutil.which("redis-server"):
        pytest.skip("redis-server not installed (scripts/install-peers.sh)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                              "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        await anyio.sleep(0.5)
        gw = http_gateway(write_fleet({}), *TOKEN_ARGS, "--session-store", f"redis://127.0.0.1:{port}",
                          env=token_env())
        auth = {"Authorization": f"Bearer {DISCOVER}"}
        status, h, _ = post(gw.url, initialize_body(), auth)
        sid = h.get("mcp-session-id") or h.get("Mcp-Session-Id")
        assert status == 200 and sid
        monitor = subprocess.Popen(["redis-cli", "-p", str(port), "monitor"], stdout=subprocess.PIPE, text=True)
        await anyio.sleep(0.3)
        value = bad.format(sid=sid)
        status, _, body = post(gw.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                               {**auth, "Mcp-Session-Id": value, "Mcp-Protocol-Version": "2025-11-25"})
        assert status == 404 and "session-not-found" in body, (status, body)
        await anyio.sleep(0.3)
        monitor.terminate()
        seen = monitor.communicate(timeout=5)[0]
        assert value not in seen, seen[-500:]
        status, body = gw.get("/readyz", {"Authorization": f"Bearer {DISCOVER}"})
        assert json.loads(body)["session_store"]["reachable"] is True, body
        # The real session still works.
        status, _, body = post(gw.url, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
                               {**auth, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-11-25"})
        assert status == 200, body
    finally:
        redis.terminate()
        redis.wait(timeout=10)


@pytest.mark.parametrize("mode", ["auto", "pin"])
def test_a_ts_sdk_v2_client_completes_through_a_2025_child(write_fleet, tmp_path, mode):
    """The official TypeScript SDK v2 client in the 2026 era (which rejects a result without
    `resultType`) completes a prompt and a resource-template argument of a 2025-era child."""
    import os
    import shutil
    import subprocess

    from conftest import GRAPH_OS, PEERS, ROOT
    run_dir = PEERS / "node" / "cwd"  # bare imports resolve from $PEERS/node/node_modules
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / "ts_v2_complete.mjs"
    shutil.copy(ROOT / "tests" / "peers" / "ts_v2_complete.mjs", script)
    fleet = write_fleet({"tc": child_entry("--era", "legacy")})
    r = subprocess.run(["node", str(script), str(GRAPH_OS), str(fleet)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TS_MODE": mode})
    assert r.returncode == 0, r.stderr[-2000:]
    answer = json.loads(r.stdout.strip().splitlines()[-1])
    assert answer == {"era": "modern", "prompt": ["alice"], "template": ["42", "420"]}, answer
