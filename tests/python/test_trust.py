"""The trust boundary as an attacker and a second tenant see it: credentials on every request,
scopes and requiredScopes enforced on every path to a child, tenant-exact child→client traffic,
and bounds on everything a caller can make the gateway hold.

Real parts only: the real graph-os binary over streamable HTTP and stdio, the official Python SDK
client, the project's test child (whose --request-log proves what reached it) and
server-everything.
"""
import json
import os
import pathlib
import subprocess
import time
import urllib.error
import urllib.request

import anyio
import httpx2
import pytest
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from conftest import GRAPH_OS, child_entry, error_code, settled, structured, wait_status

pytestmark = pytest.mark.anyio

TOKENS = {"T_DISCOVER": "discover-token-0123456789", "T_DELEGATE": "delegate-token-0123456789",
          "T_MANAGE": "manage-token-0123456789"}
TOKEN_ARGS = ["--token", "discover=env://T_DISCOVER", "--token", "delegate=env://T_DELEGATE",
              "--token", "manage=env://T_MANAGE"]
DISCOVER, DELEGATE, MANAGE = TOKENS["T_DISCOVER"], TOKENS["T_DELEGATE"], TOKENS["T_MANAGE"]
CHILD_METHODS = ("tools/call", "resources/read", "prompts/get", "completion/complete", "resources/subscribe")


def token_env():
    return {**os.environ, **TOKENS}


def client(gw, token=None, mode="legacy", headers=None, **kw):
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    return Client(streamable_http_client(gw.url, http_client=httpx2.AsyncClient(headers=h, timeout=60)), mode=mode, **kw)


def post(url, body, headers=None, timeout=10):
    """A raw JSON-RPC POST: (status, headers, body text)."""
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **(headers or {})}
    req = urllib.request.Request(url, method="POST", headers=h, data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def initialize_body(capabilities=None):
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": capabilities or {},
                       "clientInfo": {"name": "raw", "version": "0"}}}


def methods(log: pathlib.Path):
    """What reached the child: one line per request or notification it received."""
    return log.read_text().splitlines() if log.exists() else []


def reached(log, method):
    return [m for m in methods(log) if m == method or m.startswith(method + " ")]


async def rpc_code(awaitable):
    """The stable graph-os code of a JSON-RPC error (data.code)."""
    with pytest.raises(MCPError) as e:
        await awaitable
    data = e.value.error.data or {}
    return data.get("code") if isinstance(data, dict) else None


# --- credentials -----------------------------------------------------------------------------

async def test_no_token_and_a_wrong_token_get_401_with_a_challenge(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({"tc": child_entry()}), *TOKEN_ARGS, env=token_env())
    for headers in ({}, {"Authorization": "Bearer not-a-configured-token-123"}, {"Authorization": "Basic Zm9vOmJhcg=="},
                    {"Mcp-Principal": "alice"}):
        status, h, body = post(gw.url, initialize_body(), headers)
        assert status == 401, (headers, status, body)
        assert h.get("www-authenticate", h.get("WWW-Authenticate", "")).startswith("Bearer"), h
        assert "token" not in body.lower() or "not-a-configured" not in body
    # A GET stream and a DELETE are refused the same way.
    req = urllib.request.Request(gw.url, method="GET", headers={"Accept": "text/event-stream"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401
    status, _, _ = post(gw.url, initialize_body(), {"Authorization": f"Bearer {DISCOVER}"})
    assert status == 200
    # The token never appears in the gateway's output.
    assert DISCOVER not in gw.stderr_path.read_text() and "not-a-configured" not in gw.stderr_path.read_text()


def test_serving_a_public_address_without_credentials_is_refused(write_fleet):
    config = write_fleet({})
    r = subprocess.run([str(GRAPH_OS), "--transport", "streamable-http", "--host", "0.0.0.0", "--port", "1",
                        "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "--allow-unauthenticated" in r.stderr and "credential source" in r.stderr, r.stderr


# --- scopes on every path to a child ---------------------------------------------------------

def trust_fleet(write_fleet, tmp_path):
    lazy, eager = tmp_path / "lazy.log", tmp_path / "eager.log"
    path = write_fleet({"tc": child_entry("--request-log", str(lazy)),
                        # Its own URIs would be tc's too: a URI two children list is served by neither.
                        "eg": child_entry("--request-log", str(eager), "--no-resources", expose="eager")})
    return path, lazy, eager


async def every_child_path(c):
    """Each operation that reaches a child, as (name, coroutine factory)."""
    return [
        ("load_tools", lambda: c.call_tool("load_tools", {"tools": ["tc__add"]})),
        ("tools/call lazy", lambda: c.call_tool("tc__add", {"a": 1, "b": 2})),
        ("tools/call eager", lambda: c.call_tool("eg__add", {"a": 1, "b": 2})),
        ("resources/read", lambda: c.read_resource("test://hello")),
        ("prompts/get", lambda: c.get_prompt("tc__greet", {"name": "x"})),
        ("completion/complete", lambda: c.complete(types.PromptReference(name="tc__greet"), {"name": "name", "value": "a"})),
        ("resources/subscribe", lambda: c.subscribe_resource("test://hello")),
    ]


@pytest.mark.parametrize("how", ["discover-token", "anonymous-scope-discover"])
async def test_a_discover_caller_can_look_but_reaches_no_child(write_fleet, tmp_path, http_gateway, how):
    config, lazy, eager = trust_fleet(write_fleet, tmp_path)
    extra = ["--anonymous-scope", "discover"] if how == "anonymous-scope-discover" else []
    gw = http_gateway(config, *TOKEN_ARGS, *extra, env=token_env())
    token = DISCOVER if how == "discover-token" else None
    async with client(gw, token) as c:
        await wait_status(c, settled)
        found = structured(await c.call_tool("find_tools", {"query": "add two numbers"}))
        assert "tc__add" in [r["name"] for r in found["results"]]
        assert structured(await c.call_tool("list_catalog", {}))["total_servers"] == 2
        # Eager tools are not listed for a caller that may not call them.
        assert "eg__add" not in [t.name for t in (await c.list_tools()).tools]
        before = {log: methods(log) for log in (lazy, eager)}
        for name, op in await every_child_path(c):
            if name.startswith("tools/call") or name == "load_tools":
                r = await op()
                assert error_code(r) == "authorization-denied", (name, r)
            else:
                assert await rpc_code(op()) == "authorization-denied", name
        # Nothing reached either child.
        for log in (lazy, eager):
            new = methods(log)[len(before[log]):]
            assert not [m for m in new if m.split(" ")[0] in CHILD_METHODS], (log, new)


async def test_a_delegate_caller_reaches_every_child_path(write_fleet, tmp_path, http_gateway):
    config, lazy, eager = trust_fleet(write_fleet, tmp_path)
    gw = http_gateway(config, *TOKEN_ARGS, env=token_env())
    async with client(gw, DELEGATE) as c:
        await wait_status(c, settled)
        for name, op in await every_child_path(c):
            r = await op()
            assert not getattr(r, "is_error", False), (name, r)
        assert "eg__add" in [t.name for t in (await c.list_tools()).tools]
    assert reached(lazy, "tools/call add") and reached(eager, "tools/call add")
    for m in ("resources/read", "prompts/get", "completion/complete", "resources/subscribe"):
        assert reached(lazy, m) or reached(eager, m), m


async def test_a_required_scope_hides_the_child_everywhere_below_it(write_fleet, tmp_path, http_gateway):
    log = tmp_path / "admin.log"
    config = write_fleet({"tc": child_entry(),
                          "adm": child_entry("--request-log", str(log), requiredScopes=["manage"]),
                          "adme": child_entry("--request-log", str(log), requiredScopes=["manage"], expose="eager")})
    gw = http_gateway(config, *TOKEN_ARGS, "--state-dir", str(tmp_path / "state"), env=token_env())
    async with client(gw, DELEGATE) as d, client(gw, MANAGE) as m:
        await wait_status(m, settled)
        # Invisible to delegate: search, catalog, status, tools/list, prompts, resources.
        found = structured(await d.call_tool("find_tools", {"query": "add two numbers", "top_k": 50}))
        assert {r["server"] for r in found["results"]} == {"tc"}, found
        catalog = structured(await d.call_tool("list_catalog", {}))
        assert [s["server"] for s in catalog["servers"]] == ["tc"]
        assert error_code(await d.call_tool("list_catalog", {"server": "adm"})) == "server-not-in-fleet"
        assert set(structured(await d.call_tool("multiplexer_status", {}))["children"]) == {"tc"}
        assert not [t.name for t in (await d.list_tools()).tools if t.name.startswith("adm")]
        assert [p.name for p in (await d.list_prompts()).prompts] == ["tc__greet"]
        # The children share test:// URIs: the visible owner is tc.
        assert await rpc_code(d.get_prompt("adm__greet", {"name": "x"})) == "prompt-not-found"
        # Refused on every call path.
        # load_tools: a hidden server (and its tool) answers exactly as a missing one: no oracle.
        r = structured(await d.call_tool("load_tools", {"tools": ["adm__add", "nope__add"], "servers": ["adm", "nope"]}))
        failed = r["failed"]
        assert failed["adm__add"]["code"] == failed["nope__add"]["code"] == "tool-not-in-catalog", failed
        assert failed["adm"]["code"] == failed["nope"]["code"] == "server-not-in-fleet", failed
        assert failed["adm"]["message"].replace("adm", "X") == failed["nope"]["message"].replace("nope", "X"), failed
        assert failed["adm__add"]["message"].replace("adm", "X") == failed["nope__add"]["message"].replace("nope", "X")
        assert r["loaded"] == [], r
        assert error_code(await d.call_tool("list_catalog", {"server": "nope"})) == "server-not-in-fleet"
        hidden = await d.call_tool("list_catalog", {"server": "adm"})
        missing = await d.call_tool("list_catalog", {"server": "nope"})
        assert hidden.content[0].text.replace("adm", "X") == missing.content[0].text.replace("nope", "X")
        # No filesystem path below manage: the fleet file's location is for manage callers.
        assert structured(await d.call_tool("list_catalog", {"include_tools": False}))["config"]["source"] is None
        assert structured(await d.call_tool("multiplexer_status", {}))["config_source"] is None
        assert str(config) not in json.dumps(structured(await d.call_tool("list_catalog", {})))
        assert structured(await m.call_tool("list_catalog", {"include_tools": False}))["config"]["source"] == str(config)
        assert error_code(await d.call_tool("adm__add", {"a": 1, "b": 1})) == "authorization-denied"
        assert error_code(await d.call_tool("adme__add", {"a": 1, "b": 1})) == "authorization-denied"
        ident = structured(await m.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        while ident["catalog_generation"] < 1:
            await anyio.sleep(0.2)
            ident = structured(await m.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        dispatch = {"tool_name": "adm__add", "arguments": {"a": 1, "b": 1},
                    "expected_catalog_generation": ident["catalog_generation"],
                    "expected_snapshot_digest": ident["snapshot_digest"]}
        denied = await d.call_tool("catalog_dispatch", dispatch)
        assert denied.is_error and denied.structured_content["code"] == "authorization-denied", denied
        assert not reached(log, "tools/call")
        # Visible and callable for manage.
        assert "adme__add" in [t.name for t in (await m.list_tools()).tools]
        found = structured(await m.call_tool("find_tools", {"query": "add two numbers", "top_k": 50}))
        assert "adm__add" in [r["name"] for r in found["results"]]
        structured(await m.call_tool("load_tools", {"tools": ["adm__add"]}))
        r = await m.call_tool("adm__add", {"a": 2, "b": 3})
        assert not r.is_error and r.content[0].text == "5"
        r = await m.call_tool("catalog_dispatch", dispatch)
        assert not r.is_error and r.content[0].text == "2", r
    assert len(reached(log, "tools/call add")) == 2


async def test_2026_principals_follow_the_credential_not_a_header(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({"tc": child_entry()}), *TOKEN_ARGS, env=token_env())
    # Same token, different Mcp-Principal headers: one principal (the header is ignored).
    async with client(gw, DELEGATE, mode="auto", headers={"Mcp-Principal": "alice"}) as a:
        await wait_status(a, settled)
        structured(await a.call_tool("load_tools", {"tools": ["tc__add"]}))
    async with client(gw, DELEGATE, mode="auto", headers={"Mcp-Principal": "bob"}) as b:
        assert "tc__add" in [t.name for t in (await b.list_tools()).tools]
    # Another credential is another principal.
    async with client(gw, MANAGE, mode="auto", headers={"Mcp-Principal": "alice"}) as m:
        assert "tc__add" not in [t.name for t in (await m.list_tools()).tools]


async def test_a_session_id_presented_with_another_credential_does_not_exist(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({"tc": child_entry()}), *TOKEN_ARGS, env=token_env())
    status, h, _ = post(gw.url, initialize_body(), {"Authorization": f"Bearer {DELEGATE}"})
    sid = h.get("mcp-session-id") or h.get("Mcp-Session-Id")
    assert status == 200 and sid
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert post(gw.url, note, {"Authorization": f"Bearer {DELEGATE}", "Mcp-Session-Id": sid})[0] == 202
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    hdr = {"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
    assert post(gw.url, call, {**hdr, "Authorization": f"Bearer {MANAGE}"})[0] == 404
    assert post(gw.url, call, {**hdr, "Authorization": f"Bearer {DELEGATE}"})[0] == 200


# --- child→client traffic reaches only the session that caused it -------------------------------

class Asked:
    """An elicitation/logging callback that records what it was asked and answers with its mark."""

    def __init__(self, mark, delay=0.0):
        self.mark, self.delay, self.elicited, self.logs = mark, delay, 0, []

    async def elicitation(self, ctx, params):
        self.elicited += 1
        await anyio.sleep(self.delay)
        return types.ElicitResult(action="accept", content={"answer": self.mark})

    async def logging(self, params):
        self.logs.append(str(params.data))


def text(result):
    assert not result.is_error, result
    return result.content[0].text


async def test_a_shared_child_never_asks_or_tells_the_wrong_session(write_fleet, tmp_path, http_gateway):
    """A shared stdio connection carries no association for logs and child→client requests, so
    they reach nobody (counted) — alone or not; test_association.py covers late traffic and the
    exact association of streamable HTTP and per-session connections."""
    gw = http_gateway(write_fleet({"tc": child_entry()}), *TOKEN_ARGS, env=token_env())
    a, b = Asked("from-A"), Asked("from-B")
    async with client(gw, DELEGATE, elicitation_callback=a.elicitation, logging_callback=a.logging) as ca, \
            client(gw, DELEGATE, elicitation_callback=b.elicitation, logging_callback=b.logging) as cb:
        await wait_status(ca, settled)
        for c in (ca, cb):
            structured(await c.call_tool("load_tools", {"tools": ["tc__elicit", "tc__slow", "tc__log"]}))
        # Alone, A's call is the only one in flight, yet nothing says the request is A's: refused.
        answer = text(await ca.call_tool("tc__elicit", {}))
        assert answer.startswith("elicit-error: -32001") and "nothing associates" in answer, answer
        # With B's call in flight on the same connection: refused the same way.
        async with anyio.create_task_group() as tg:
            tg.start_soon(cb.call_tool, "tc__slow", {"ms": 1500})
            await anyio.sleep(0.3)
            answer = text(await ca.call_tool("tc__elicit", {}))
        assert answer.startswith("elicit-error: -32001") and "nothing associates" in answer, answer
        assert (a.elicited, b.elicited) == (0, 0)
        # A log line B's call causes while A's call is in flight reaches neither (dropped, counted).
        async with anyio.create_task_group() as tg:
            tg.start_soon(ca.call_tool, "tc__slow", {"ms": 1500})
            await anyio.sleep(0.3)
            assert text(await cb.call_tool("tc__log", {"text": "secret-of-B", "count": 3})) == "logged 3"
        # Alone too: a shared stdio child's log lines are nobody's.
        assert text(await cb.call_tool("tc__log", {"text": "mine-B", "count": 2})) == "logged 2"
        await anyio.sleep(0.5)
        assert not any("secret-of-B" in line or "mine-B" in line for line in a.logs + b.logs), (a.logs, b.logs)
    metrics = gw.get("/metrics")[1]
    assert 'graphos_relay_refused_total{server="tc",reason="relay-unassociated"} 2' in metrics, metrics
    assert 'graphos_child_logs_dropped_total{server="tc",reason="unassociated"} 5' in metrics


@pytest.fixture
def http_child(tmp_path):
    """The test child serving streamable HTTP on a free loopback port: its /mcp URL."""
    from conftest import TESTCHILD, free_port

    port = free_port()
    proc = subprocess.Popen([str(TESTCHILD), "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "http-child.log", "w"))
    import socket

    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.monotonic() < deadline and proc.poll() is None, "the HTTP child did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(timeout=5)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_per_session_isolation_relays_exactly_with_calls_overlapping(write_fleet, http_gateway, request, transport):
    if transport == "stdio":
        entry = child_entry(sessionIsolation="per-session", sessionIdleTimeout=2)
    else:
        entry = {"url": request.getfixturevalue("http_child"), "sessionIsolation": "per-session", "sessionIdleTimeout": 2}
    fleet = write_fleet({"iso": entry})
    gw = http_gateway(fleet, *TOKEN_ARGS, env=token_env())
    a, b = Asked("from-A", delay=0.6), Asked("from-B", delay=0.6)
    async with client(gw, DELEGATE, elicitation_callback=a.elicitation) as ca, \
            client(gw, DELEGATE, elicitation_callback=b.elicitation) as cb:
        await wait_status(ca, settled)
        for c in (ca, cb):
            structured(await c.call_tool("load_tools", {"tools": ["iso__elicit", "iso__whoami"]}))
        answers = {}

        async def ask(name, c):
            answers[name] = text(await c.call_tool("iso__elicit", {}))

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "A", ca)
            tg.start_soon(ask, "B", cb)
        assert time.monotonic() - started < 1.1, "the calls did not overlap"
        assert answers == {"A": 'elicited: accept {"answer":"from-A"}', "B": 'elicited: accept {"answer":"from-B"}'}
        assert (a.elicited, b.elicited) == (1, 1)
        # Each session has its own child connection: a process (stdio) or an upstream session (HTTP).
        wa, wb = text(await ca.call_tool("iso__whoami", {})), text(await cb.call_tool("iso__whoami", {}))
        assert wa != wb, (wa, wb)
        status = structured(await ca.call_tool("multiplexer_status", {}))
        assert status["children"]["iso"]["session_connections"] == 2
    # Sessions gone: their connections are closed within the idle timeout.
    async with client(gw, DELEGATE) as c:
        for _ in range(60):
            status = structured(await c.call_tool("multiplexer_status", {}))
            if status["children"]["iso"]["session_connections"] == 0:
                break
            await anyio.sleep(0.1)
        assert status["children"]["iso"]["session_connections"] == 0, status["children"]["iso"]


class RawStdio:
    """A raw JSON-RPC client on graph-os's stdio (no SDK: it declares exactly what it is given)."""

    def __init__(self, config, *args, capabilities=None):
        import queue
        import threading

        self.proc = subprocess.Popen([str(GRAPH_OS), "--config", str(config), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(config.parent / "stdio-gw.log", "w"))
        self.inbox, self.requests = queue.Queue(), []
        threading.Thread(target=self._read, daemon=True).start()
        self.next = 0
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": capabilities or {},
                                    "clientInfo": {"name": "raw", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read(self):
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "method" in msg and "id" in msg:
                self.requests.append(msg)  # a server→client request
            elif "id" in msg:
                self.inbox.put(msg)

    def send(self, msg):
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method, params, timeout=10):
        self.next += 1
        self.send({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params})
        while True:
            msg = self.inbox.get(timeout=timeout)
            if msg["id"] == self.next:
                return msg

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=15)


def relay_metric(metrics, server):
    """graphos_relay_refused_total for `server`, summed over reasons."""
    total = 0
    for line in metrics.splitlines():
        if line.startswith("graphos_relay_refused_total{") and f'server="{server}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


CALLS = int(os.environ.get("GRAPH_OS_TRUST_CALLS", "5000"))


async def test_a_client_without_roots_is_never_asked_and_no_call_hangs_over_stdio(write_fleet, tmp_path):
    from conftest import EVERYTHING, free_port

    config = write_fleet({"ever": {"command": str(EVERYTHING), "args": ["stdio"], "expose": "eager", "prefix": ""}})
    port = free_port()
    gw = RawStdio(config, "--admin-addr", f"127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while "get-sum" not in json.dumps(gw.request("tools/list", {})):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        worst = 0.0
        for i in range(CALLS):
            t = time.monotonic()
            r = gw.request("tools/call", {"name": "get-sum", "arguments": {"a": i, "b": 1}}, timeout=1.0)
            worst = max(worst, time.monotonic() - t)
            assert f"is {i + 1}" in r["result"]["content"][0]["text"], r
        print(f"{CALLS} calls over stdio, slowest {worst * 1000:.1f} ms")
        assert gw.requests == [], gw.requests[:3]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as m:
            assert relay_metric(m.read().decode(), "ever") >= 1  # graph-os answered roots/list itself
    finally:
        gw.close()


async def test_a_client_without_roots_is_never_asked_and_no_call_hangs_over_http(write_fleet, http_gateway):
    import http.client
    from conftest import EVERYTHING

    config = write_fleet({"ever": {"command": str(EVERYTHING), "args": ["stdio"], "expose": "eager", "prefix": ""}})
    gw = http_gateway(config, *TOKEN_ARGS, env=token_env())
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=1.0)  # one keep-alive connection
    auth = {"Authorization": f"Bearer {DELEGATE}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream"}

    def rpc(body, session=None):
        h = dict(auth)
        if session:
            h.update({"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"})
        conn.request("POST", "/mcp", json.dumps(body), h)
        r = conn.getresponse()
        raw = r.read().decode()
        if (r.getheader("content-type") or "").startswith("application/json"):
            return r, [json.loads(raw)]  # a plain JSON answer (the hot path's, with nothing before it)
        msgs = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:") and line[5:].strip()]
        return r, msgs

    r, _ = rpc(initialize_body())
    sid = r.getheader("mcp-session-id")
    rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    deadline = time.monotonic() + 60
    while "get-sum" not in json.dumps(rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)[1]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    worst = 0.0
    for i in range(CALLS):
        t = time.monotonic()
        _, msgs = rpc({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                       "params": {"name": "get-sum", "arguments": {"a": i, "b": 1}}}, sid)
        worst = max(worst, time.monotonic() - t)
        assert not [m for m in msgs if "method" in m and "id" in m], msgs  # no request for us
        assert any(f"is {i + 1}" in json.dumps(m) for m in msgs), msgs
    print(f"{CALLS} calls over HTTP, slowest {worst * 1000:.1f} ms")
    assert relay_metric(gw.get("/metrics")[1], "ever") >= 1


async def test_a_client_with_roots_answers_the_child(write_fleet, http_gateway, http_child):
    # A shared streamable-HTTP child: its roots/list rides the calling request's stream (exact).
    gw = http_gateway(write_fleet({"tc": {"url": http_child}}), *TOKEN_ARGS, env=token_env())

    async def roots(ctx):
        return types.ListRootsResult(roots=[types.Root(uri="file:///front-client-root", name="mine")])

    async with client(gw, DELEGATE, list_roots_callback=roots) as c, client(gw, DELEGATE) as bare:
        await wait_status(c, settled)
        for x in (c, bare):
            structured(await x.call_tool("load_tools", {"tools": ["tc__roots"]}))
        assert text(await c.call_tool("tc__roots", {})) == 'roots: ["file:///front-client-root"]'
        # Without the capability graph-os answers with the roots configured for the child (none).
        assert text(await bare.call_tool("tc__roots", {})) == "roots: []"


async def test_a_client_that_never_answers_does_not_delay_other_sessions(write_fleet, http_gateway, http_child):
    import http.client
    import threading

    # One shared streamable-HTTP connection (its requests are associated by stream) for both.
    gw = http_gateway(write_fleet({"tc": {"url": http_child, "expose": "eager", "relayTimeout": 20}}), *TOKEN_ARGS,
                      env=token_env())
    # A raw client that declares elicitation, calls the eliciting tool and never answers.
    silent = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    h = {"Authorization": f"Bearer {DELEGATE}", "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    silent.request("POST", "/mcp", json.dumps(initialize_body({"elicitation": {}})), h)
    r = silent.getresponse()
    sid = r.getheader("mcp-session-id")
    r.read()
    h.update({"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"})
    silent.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}), h)
    silent.getresponse().read()
    asked = threading.Event()

    def call_and_ignore():
        silent.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                                   "params": {"name": "tc__elicit", "arguments": {}}}), h)
        resp = silent.getresponse()
        for line in resp:  # read until the elicitation arrives, then answer nothing
            if b"elicitation/create" in line:
                asked.set()
                return

    async with client(gw, DELEGATE) as other:
        # The child is up before the silent call (under load it may not be yet: the call would
        # then be refused at once and never ask anything).
        await wait_status(other, settled)
        threading.Thread(target=call_and_ignore, daemon=True).start()
        for _ in range(100):
            if asked.is_set():
                break
            await anyio.sleep(0.05)
        assert asked.is_set(), "the silent client was never asked"
        worst = 0.0
        for i in range(20):
            t = time.monotonic()
            assert text(await other.call_tool("tc__add", {"a": i, "b": 1})) == str(i + 1)
            worst = max(worst, time.monotonic() - t)
        assert worst < 1.0, worst


# --- bounds on what callers can make the gateway hold -------------------------------------------

def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def flood_initialize(url, n, threads=32, headers=None):
    """n raw initialize POSTs from `threads` threads: a Counter of HTTP statuses."""
    import collections
    import concurrent.futures

    def one(_):
        s, h, _ = post(url, initialize_body(), headers)
        return s, h.get("retry-after", h.get("Retry-After"))

    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        results = list(ex.map(one, range(n)))
    return collections.Counter(s for s, _ in results), {s: ra for s, ra in results}


# A full default session table (1,000 sessions) holds about 75 MB on top of a ~35 MB baseline
# (docs/security.md "Bounds on what callers can make the gateway hold"): an unauthenticated
# flood must stay far below that.
FLOOD_RSS_CAP_MB = 120


@pytest.mark.parametrize("anonymous", [False, True])
async def test_an_initialize_flood_is_bounded_and_a_real_session_still_works(write_fleet, http_gateway, anonymous):
    extra = ["--anonymous-scope", "delegate"] if anonymous else []
    gw = http_gateway(write_fleet({"tc": child_entry()}), *TOKEN_ARGS, *extra, env=token_env())
    before = rss_mb(gw.proc.pid)
    served = []

    async def legitimate():
        async with client(gw, DELEGATE) as c:
            await wait_status(c, settled)
            structured(await c.call_tool("load_tools", {"tools": ["tc__add"]}))
            while not flood_done.is_set():
                served.append(text(await c.call_tool("tc__add", {"a": 1, "b": 1})))
                await anyio.sleep(0.05)

    flood_done = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(legitimate)
        await anyio.sleep(0.5)
        counts, retry = await anyio.to_thread.run_sync(lambda: flood_initialize(gw.url, 3000))
        peak = rss_mb(gw.proc.pid)
        flood_done.set()
    print(f"anonymous={anonymous}: {dict(counts)}; RSS {before:.0f} -> {peak:.0f} MB; {len(served)} real calls")
    if anonymous:
        # One principal ("anonymous") holds at most 100 sessions; the rest get 429 + Retry-After.
        assert counts[200] == 100 and counts[429] == 2900, counts
        assert retry[429] == "5"
    else:
        assert counts == {401: 3000}, counts
    assert peak < FLOOD_RSS_CAP_MB and peak - before < 40, (before, peak)
    assert served and all(s == "2" for s in served)


async def test_the_global_session_cap_answers_503_with_retry_after(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({}), "--max-sessions", "50", "--max-sessions-per-principal", "1000")
    counts, retry = await anyio.to_thread.run_sync(lambda: flood_initialize(gw.url, 300))
    assert counts == {200: 50, 503: 250}, counts
    assert retry[503] == "5"


def modern(method, params=None, principal=None, token=None):
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {
        **(params or {}), "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                    "io.modelcontextprotocol/clientCapabilities": {},
                                    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}}}
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if principal:
        headers["Mcp-Principal"] = principal
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return body, headers


async def test_thirty_thousand_principals_are_bounded_by_the_lru_cap(write_fleet, http_gateway):
    import concurrent.futures

    gw = http_gateway(write_fleet({"tc": child_entry()}), "--max-principals", "1000")

    def one(i):
        body, headers = modern("tools/list", principal=f"p{i}")
        return post(gw.url, body, headers)[0]

    rss = []
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        for start in range(0, 30_000, 5_000):
            codes = list(ex.map(one, range(start, start + 5_000)))
            assert codes == [200] * 5_000, set(codes)
            rss.append(rss_mb(gw.proc.pid))
    async with client(gw, mode="auto", headers={"Mcp-Principal": "observer"}) as c:
        held = structured(await c.call_tool("multiplexer_status", {}))["sessions"]
    print(f"RSS after each 5,000 principals: {[round(r) for r in rss]} MB; sessions held {held}")
    assert held <= 1001 + 5, held
    # Growth after the cap filled (5,000 in) is noise, not per-principal state.
    assert rss[-1] - rss[0] < 15, rss


FLOOD = int(os.environ.get("GRAPH_OS_FLOOD", "200000"))


async def test_a_progress_flood_to_a_client_that_does_not_read_stays_bounded(write_fleet, http_gateway):
    import socket

    gw = http_gateway(write_fleet({"tc": child_entry(expose="eager", callTimeout=900)}), *TOKEN_ARGS, env=token_env())
    auth = {"Authorization": f"Bearer {DELEGATE}"}
    status, h, _ = post(gw.url, initialize_body(), auth)
    sid = h.get("mcp-session-id") or h.get("Mcp-Session-Id")
    post(gw.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {**auth, "Mcp-Session-Id": sid})
    async with client(gw, DELEGATE) as c:
        await wait_status(c, settled)
    baseline = rss_mb(gw.proc.pid)
    # The call, on a socket nobody reads from.
    body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                       "params": {"name": "tc__flood", "arguments": {"count": FLOOD}, "_meta": {"progressToken": "p"}}})
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall((f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\nContent-Type: application/json\r\n"
                  f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {DELEGATE}\r\n"
                  f"Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    peak, started = baseline, time.monotonic()
    # Sample the gateway's RSS until the child has sent every notification (its CPU time stops).
    child_pid, last_cpu = None, None
    while time.monotonic() - started < 600:
        await anyio.sleep(0.5)
        peak = max(peak, rss_mb(gw.proc.pid))
        if child_pid is None:
            out = subprocess.run(["pgrep", "-P", str(gw.proc.pid)], capture_output=True, text=True).stdout.split()
            # The test child, not the gateway's child reaper (also its child, idle: its CPU time
            # never moves, which ended the sampling before the flood had started).
            out = [p for p in out if b"child-reaper" not in open(f"/proc/{p}/cmdline", "rb").read()]
            child_pid = int(out[0]) if out else None
            continue
        stat = open(f"/proc/{child_pid}/stat").read().split()
        cpu = int(stat[13]) + int(stat[14])
        if cpu == last_cpu:
            break
        last_cpu = cpu
    flood_secs = time.monotonic() - started
    held = rss_mb(gw.proc.pid)
    sock.close()  # the client goes away
    await anyio.sleep(2)
    after = rss_mb(gw.proc.pid)
    print(f"{FLOOD} progress notifications in {flood_secs:.0f} s; RSS {baseline:.0f} -> peak {peak:.0f} -> "
          f"{held:.0f} at the end of the flood -> {after:.0f} MB after the client left")
    assert peak < 100, peak
    # Nothing accumulates for a client that left: queuing the flood for it would cost ~30 MB
    # (200,000 notes x ~150 B); the allocator's own noise after the call ends is ~1-2 MB.
    assert after <= held + 5, (held, after)
    metrics = gw.get("/metrics")[1]
    assert 'graphos_front_notes_dropped_total{kind="progress_coalesced"}' in metrics
    # The gateway and the child still serve.
    async with client(gw, DELEGATE) as c:
        assert text(await c.call_tool("tc__add", {"a": 2, "b": 2})) == "4"
