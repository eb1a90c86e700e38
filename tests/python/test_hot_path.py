"""The forwarding hot path (issue 16): a 2025-era `tools/call` of a loaded tool is decoded only to
its envelope and forwarded with its arguments and result raw, on the stdio and on the HTTP front
(src/server/fast.rs, src/mux/fast.rs, src/child/fast.rs, src/transport/raw_link.rs). Every test
reads `graphos_hot_path_calls_total` to prove the hot path served the calls, then checks what the
typed path guarantees: progress and logs before the result, cancellation upstream, the caller's
checks, argument bounds, a child that dies mid-call, arguments passed byte for byte, and a client
that declared relay capabilities staying on the typed path."""
import json
import re

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from conftest import GRAPH_OS, child_entry, error_code, free_port, settled, structured, wait_status

pytestmark = pytest.mark.anyio

TOKENS = {"GRAPH_OS_T_DELEGATE": "delegate-token-hot-path-0123456789",
          "GRAPH_OS_T_DISCOVER": "discover-token-hot-path-0123456789"}
TOKEN_ARGS = ("--token", "delegate=env://GRAPH_OS_T_DELEGATE", "--token", "discover=env://GRAPH_OS_T_DISCOVER")


class Front:
    """A gateway on either front, with its metrics."""

    def __init__(self, kind, config, http_gateway, extra=()):
        import os

        self.kind = kind
        env = {**os.environ, **TOKENS}
        if kind == "http":
            self.gw = http_gateway(config, *TOKEN_ARGS, *extra, env=env)
            self.base = self.gw.base
        else:
            port = free_port()
            self.base = f"http://127.0.0.1:{port}"
            self.params = StdioServerParameters(
                command=str(GRAPH_OS), args=["--config", str(config), "--admin-addr", f"127.0.0.1:{port}", *extra],
                env={**env})

    def client(self, token="GRAPH_OS_T_DELEGATE", **kw):
        if self.kind == "http":
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS[token]}"}, timeout=30)
            return Client(streamable_http_client(self.gw.url, http_client=http), mode="legacy", **kw)
        return Client(self.params, mode="legacy", **kw)

    def dropped_logs(self):
        import urllib.request

        headers = {"Authorization": f"Bearer {TOKENS['GRAPH_OS_T_DISCOVER']}"} if self.kind == "http" else {}
        with urllib.request.urlopen(urllib.request.Request(self.base + "/metrics", headers=headers), timeout=5) as r:
            text = r.read().decode()
        m = re.search(r'graphos_child_logs_dropped_total\{server="tc",reason="unassociated"\} (\d+)', text)
        return int(m.group(1)) if m else 0

    def hot_calls(self):
        import urllib.request

        # /metrics is for operators: a discover token where credentials are configured.
        headers = {"Authorization": f"Bearer {TOKENS['GRAPH_OS_T_DISCOVER']}"} if self.kind == "http" else {}
        with urllib.request.urlopen(urllib.request.Request(self.base + "/metrics", headers=headers), timeout=5) as r:
            text = r.read().decode()
        m = re.search(r'graphos_hot_path_calls_total\{kind="' + self.kind + r'"\} (\d+)', text)
        return int(m.group(1)) if m else 0


@pytest.fixture(params=["stdio", "http"])
def front(request, write_fleet, http_gateway):
    def make(servers, extra=()):
        return Front(request.param, write_fleet(servers), http_gateway, extra)
    return make


async def test_progress_logs_and_cancellation_travel_on_the_hot_path(front):
    f = front({"tc": child_entry()})
    logs, progress = [], []

    async def on_log(params):
        logs.append(params)

    async def on_progress(value, total, message):
        progress.append((value, total))

    async with f.client(logging_callback=on_log) as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"servers": ["tc"]}))
        before = f.hot_calls()
        r = await client.call_tool("tc__add", {"a": 20, "b": 22})
        assert r.content[0].text == "42" and not r.is_error
        r = await client.call_tool("tc__progress", {"steps": 3}, progress_callback=on_progress)
        assert r.content[0].text == "3 steps done"
        # In the child's order and before the result.
        assert progress == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)], progress
        # A shared stdio child's log line carries no association: on a gateway that serves more
        # than one caller (HTTP, or stdio with an admin listener) it is dropped and counted.
        assert not any("progress tool started" in str(m.data) for m in logs), logs
        assert f.dropped_logs() >= 1
        # A client cancellation reaches the child; nothing stays in flight.
        with anyio.move_on_after(0.5):
            await client.call_tool("tc__hang", {})
        with anyio.fail_after(10):
            while (await client.call_tool("tc__cancellations", {})).content[0].text != "1":
                await anyio.sleep(0.05)
        status = structured(await client.call_tool("multiplexer_status", {}))
        assert status["children"]["tc"]["in_flight"] == 0
        assert f.hot_calls() - before >= 4


async def test_the_hot_path_keeps_every_check_and_passes_arguments_byte_for_byte(front):
    f = front({"tc": child_entry(argumentLimits={"maxBytes": 2000})})
    async with f.client() as a, f.client() as b:
        await wait_status(a, settled)
        structured(await a.call_tool("load_tools", {"tools": ["tc__echo", "tc__add", "tc__fail"]}))
        before = f.hot_calls()
        text = 'quote " backslash \\ newline \n unicode é 😀 nul-ish \u0001'
        r = await a.call_tool("tc__echo", {"text": text})
        assert r.content[0].text == text
        # A tool error passes as the child's own result.
        r = await a.call_tool("tc__fail", {})
        assert r.is_error and r.content[0].text == "this tool always fails"
        served = f.hot_calls() - before
        assert served == 2, served
        # Refusals come from the typed path, unchanged, and nothing is counted as served.
        assert error_code(await a.call_tool("tc__echo", {"text": "x" * 5000})) == "request-out-of-bounds"
        assert error_code(await a.call_tool("tc__slow", {"ms": 1})) == "tool-not-loaded"
        if f.kind == "http":
            # A second concurrent session did not load it.
            assert error_code(await b.call_tool("tc__add", {"a": 1, "b": 1})) == "tool-not-loaded"
        with pytest.raises(Exception, match="Unknown tool"):
            await a.call_tool("tc__nope", {})
        assert f.hot_calls() - before == served


async def test_a_caller_without_rights_never_reaches_the_child_on_http(write_fleet, http_gateway):
    f = Front("http", write_fleet({"tc": child_entry(expose="eager")}), http_gateway)
    async with f.client("GRAPH_OS_T_DISCOVER") as reader:
        await wait_status(reader, settled)
        before = f.hot_calls()
        r = await reader.call_tool("tc__add", {"a": 1, "b": 2})
        assert r.is_error, r
        assert f.hot_calls() == before


async def test_a_child_that_dies_mid_call_fails_the_call_and_recovers(front):
    f = front({"tc": child_entry("--exit-after", "2", expose="eager")})
    async with f.client() as client:
        await wait_status(client, settled)
        # `slow` is not read-only: no retry on a new connection hides the failure.
        r = await client.call_tool("tc__slow", {"ms": 1})
        assert r.content[0].text == "slept 1 ms"
        r = await client.call_tool("tc__slow", {"ms": 1})
        assert error_code(r) == "child-transport-closed", r
        # The child is restarted and the hot path serves the new connection.
        with anyio.fail_after(30):
            while True:
                await anyio.sleep(0.2)
                status = structured(await client.call_tool("multiplexer_status", {}))
                if status["children"]["tc"]["state"] == "up":
                    break
        before = f.hot_calls()
        r = await client.call_tool("tc__slow", {"ms": 2})
        assert r.content[0].text == "slept 2 ms"
        assert f.hot_calls() == before + 1


async def test_an_http_client_that_takes_relays_stays_on_the_typed_path(write_fleet, http_gateway):
    f = Front("http", write_fleet({"tc": child_entry(expose="eager")}), http_gateway)
    from mcp import types

    async def elicitation(context, params):
        return types.ElicitResult(action="accept", content={"name": "hot"})

    async with f.client(elicitation_callback=elicitation) as client:
        await wait_status(client, settled)
        before = f.hot_calls()
        r = await client.call_tool("tc__add", {"a": 1, "b": 2})
        assert r.content[0].text == "3"
        assert f.hot_calls() == before
        r = await client.call_tool("tc__elicit", {})
        assert not r.is_error, r


async def test_many_concurrent_calls_on_one_session_get_their_own_answers(front):
    f = front({"tc": child_entry(expose="eager")})
    async with f.client() as client:
        await wait_status(client, settled)
        results = {}

        async def one(i):
            r = await client.call_tool("tc__add", {"a": i, "b": 1000})
            results[i] = r.content[0].text

        async with anyio.create_task_group() as tg:
            for i in range(64):
                tg.start_soon(one, i)
        assert results == {i: str(i + 1000) for i in range(64)}


async def test_a_session_busy_only_on_the_hot_path_outlives_its_idle_timeout(write_fleet, http_gateway):
    # Hot-path calls do not pass rmcp's session worker; its idle timer is reset beside them.
    f = Front("http", write_fleet({"tc": child_entry(expose="eager")}), http_gateway,
              ("--session-idle-timeout", "2"))
    async with f.client() as client:
        await wait_status(client, settled)
        before = f.hot_calls()
        deadline = anyio.current_time() + 5
        n = 0
        while anyio.current_time() < deadline:
            r = await client.call_tool("tc__add", {"a": n, "b": 1})
            assert r.content[0].text == str(n + 1), r
            n += 1
            await anyio.sleep(0.25)
        assert f.hot_calls() - before == n
        # The session itself is alive: a typed request on it is served.
        assert "tc__add" in [t.name for t in (await client.list_tools()).tools]


async def test_a_list_change_reaches_a_session_without_a_stream_on_its_next_call(write_fleet, http_gateway):
    # A client that opens no GET stream (raw HTTP: scripts, proxies, load generators): a list
    # change noticed meanwhile is kept pending and goes first on the session's next call's event
    # stream; the session keeps the hot path. (It used to stay pending forever: every request took
    # it, declined the hot path, and the typed path pended it again, having no stream to send on.)
    f = Front("http", write_fleet({"tc": child_entry(expose="eager")}), http_gateway)
    url = f.gw.url
    headers = {"Authorization": f"Bearer {TOKENS['GRAPH_OS_T_DELEGATE']}",
               "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

    def messages(r):
        if r.headers["content-type"].startswith("application/json"):
            return [r.json()]
        return [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:") and line[5:].strip()]

    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        assert r.status_code == 200, r.text
        headers |= {"Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-06-18"}
        r = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202, r.text
        ids = iter(range(1, 1000))

        async def call(name, arguments):
            r = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": next(ids), "method": "tools/call",
                                                             "params": {"name": name, "arguments": arguments}})
            assert r.status_code == 200, r.text
            return r, messages(r)

        async def listed():
            r = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": next(ids), "method": "tools/list"})
            return [t["name"] for m in messages(r) if "result" in m for t in m["result"]["tools"]]

        with anyio.fail_after(30):
            while "tc__add" not in await listed():
                await anyio.sleep(0.2)
        # Whatever the start-up left pending is delivered by the first call.
        await call("tc__add", {"a": 0, "b": 0})
        before = f.hot_calls()
        _, answer = await call("tc__add", {"a": 1, "b": 2})
        assert [m.get("method") for m in answer] == [None] and answer[0]["result"]["content"][0]["text"] == "3"
        assert f.hot_calls() == before + 1

        # The child grows a tool: the session's visible list changes while it has no stream.
        await call("tc__grow", {})
        with anyio.fail_after(30):
            while "tc__grown_1" not in await listed():
                await anyio.sleep(0.2)
        await anyio.sleep(0.5)  # the typed tools/list above pended the notice again, asynchronously
        before = f.hot_calls()
        r, answer = await call("tc__add", {"a": 2, "b": 3})
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers
        assert [m.get("method") for m in answer] == ["notifications/tools/list_changed", None], answer
        assert answer[1]["result"]["content"][0]["text"] == "5"
        # Delivered once: the next call is a plain JSON answer, and both took the hot path.
        r, answer = await call("tc__add", {"a": 3, "b": 4})
        assert r.headers["content-type"].startswith("application/json") and len(answer) == 1, answer
        assert answer[0]["result"]["content"][0]["text"] == "7"
        assert f.hot_calls() == before + 2
