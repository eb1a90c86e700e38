"""The streamable HTTP face with remote children, driven by the Python SDK and inspector-cli."""
import json
import os
import signal
import subprocess
import time

import anyio
import httpx2
import pytest
from mcp import Client, types

from conftest import EVERYTHING, ListChangedCounter as Notes, PEERS, PYTHON, TINY, child_entry, error_code, free_port, settled, structured, wait_status

pytestmark = pytest.mark.anyio
INSPECTOR = PEERS / "node" / "node_modules" / ".bin" / "mcp-inspector-cli"


def wait_port(port, proc, timeout=30):
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"peer exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def remote_children(tmp_path):
    """server-everything (streamable HTTP and SSE) and a FastMCP server over HTTP, on loopback."""
    procs, urls = [], {}
    specs = {
        "evhttp": ([str(EVERYTHING), "streamableHttp"], "/mcp"),
        "evsse": ([str(EVERYTHING), "sse"], "/sse"),
        "tiny": ([str(PYTHON), str(TINY), "http"], "/mcp"),
    }
    for name, (cmd, path) in specs.items():
        port = free_port()
        env = {**os.environ, "PORT": str(port)}
        argv = cmd + ([str(port)] if name == "tiny" else [])
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "w"))
        procs.append(p)
        wait_port(port, p)
        urls[name] = f"http://127.0.0.1:{port}{path}"
    yield urls
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def remote_fleet(write_fleet, urls, **extra):
    return write_fleet({
        "evhttp": {"url": urls["evhttp"], "poolSize": 2, **extra},
        "evsse": {"url": urls["evsse"], **extra},
        "tiny": {"url": urls["tiny"], **extra},
    })


async def sampling(ctx, params):
    return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="sampled by the front client"),
                                     model="test-model", stop_reason="endTurn")


async def elicitation(ctx, params):
    return types.ElicitResult(action="accept", content={"color": "teal"})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_remote_children_find_load_call_unload_over_http(write_fleet, remote_children, http_gateway, mode):
    gw = http_gateway(remote_fleet(write_fleet, remote_children))
    async with Client(gw.url, mode=mode, sampling_callback=sampling, elicitation_callback=elicitation) as client:
        # tool_count is the served view's: it follows the children's states by a reconciliation,
        # so wait for both (a wrong count still fails, with the status shown).
        status = await wait_status(client, lambda ch: settled(ch) and ch["evhttp"]["tool_count"] >= 17)
        for name in ("evhttp", "evsse", "tiny"):
            assert status["children"][name]["state"] == "up", status["children"][name]
        # graph-os offers roots/sampling/elicitation to children: server-everything shows 17 tools
        assert status["children"]["evhttp"]["tool_count"] == 17
        for prefix, tool, args, expect in (("evht", "get-sum", {"a": 2, "b": 3}, "5"), ("evss", "get-sum", {"a": 2, "b": 3}, "5"),
                                           ("tiny", "add", {"a": 2, "b": 3}, "5")):
            name = f"{prefix}__{tool}"
            found = structured(await client.call_tool("find_tools", {"query": f"{tool} add numbers", "top_k": 20}))
            assert name in [r["name"] for r in found["results"]], found
            assert structured(await client.call_tool("load_tools", {"tools": [name]}))["loaded"] == [name]
            assert name in [t.name for t in (await client.list_tools()).tools]
            result = await client.call_tool(name, args)
            assert not result.is_error and expect in result.content[0].text, result
            assert structured(await client.call_tool("unload_tools", {"tools": [name]}))["unloaded"] == [name]
            assert name not in [t.name for t in (await client.list_tools()).tools]


async def test_sampling_and_elicitation_complete_through_the_gateway(write_fleet, remote_children, http_gateway):
    gw = http_gateway(remote_fleet(write_fleet, remote_children))
    async with Client(gw.url, mode="legacy", sampling_callback=sampling, elicitation_callback=elicitation) as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"tools": ["evht__trigger-sampling-request", "evht__trigger-elicitation-request"]}))
        r = await client.call_tool("evht__trigger-sampling-request", {"prompt": "hello", "maxTokens": 20})
        assert not r.is_error and "sampled by the front client" in r.content[0].text, r
        r = await client.call_tool("evht__trigger-elicitation-request", {})
        assert not r.is_error and "teal" in " ".join(c.text for c in r.content), r




async def test_two_http_sessions_are_isolated(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({"tc": child_entry()}))
    a, b = Notes(), Notes()
    async with Client(gw.url, mode="legacy", message_handler=a.handler) as ca, \
            Client(gw.url, mode="legacy", message_handler=b.handler) as cb:
        await wait_status(ca, settled)
        structured(await ca.call_tool("load_tools", {"tools": ["tc__add"]}))
        await anyio.sleep(0.3)
        assert (a.count, b.count) == (1, 0)
        structured(await cb.call_tool("load_tools", {"tools": ["tc__echo"]}))
        await anyio.sleep(0.3)
        assert (a.count, b.count) == (1, 1)
        names_a = {t.name for t in (await ca.list_tools()).tools}
        names_b = {t.name for t in (await cb.list_tools()).tools}
        assert "tc__add" in names_a and "tc__echo" not in names_a
        assert "tc__echo" in names_b and "tc__add" not in names_b
        assert error_code(await cb.call_tool("tc__add", {"a": 1, "b": 1})) == "tool-not-loaded"


async def test_2026_principals_keep_separate_loaded_sets(write_fleet, http_gateway):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    gw = http_gateway(write_fleet({"tc": child_entry()}))

    def client_for(handle):
        http = httpx2.AsyncClient(headers={"Mcp-Principal": handle}, timeout=30)
        return Client(streamable_http_client(gw.url, http_client=http), mode="auto")

    async with client_for("alice") as alice, client_for("bob") as bob:
        assert alice.protocol_version == "2026-07-28"
        await wait_status(alice, settled)
        structured(await alice.call_tool("load_tools", {"tools": ["tc__add"]}))
        assert "tc__add" in [t.name for t in (await alice.list_tools()).tools]
        assert "tc__add" not in [t.name for t in (await bob.list_tools()).tools]
        r = await alice.call_tool("tc__add", {"a": 2, "b": 2})
        assert r.content[0].text == "4"
        assert error_code(await bob.call_tool("tc__add", {"a": 2, "b": 2})) == "tool-not-loaded"
        # a list change reaches the principal's subscriptions/listen stream
        async with alice.listen(tools_list_changed=True) as sub:
            structured(await alice.call_tool("unload_tools", {"tools": ["tc__add"]}))
            with anyio.fail_after(5):
                await sub.__anext__()


def test_dns_rebinding_and_foreign_origin_get_403(write_fleet, http_gateway):
    import urllib.error
    import urllib.request

    gw = http_gateway(write_fleet({}))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    for extra in ({"Host": "evil.example"}, {"Origin": "http://evil.example"}, {"Host": "evil.example", "Origin": "http://evil.example"}):
        req = urllib.request.Request(gw.url, data=body, headers={**base, **extra}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 403, extra
    ok = urllib.request.Request(gw.url, data=body, headers={**base, "Origin": f"http://127.0.0.1:{gw.port}"}, method="POST")
    with urllib.request.urlopen(ok, timeout=5) as r:
        assert r.status == 200


async def test_sigterm_lets_the_in_flight_call_finish_and_exits_0(write_fleet, http_gateway):
    # While draining, the open session keeps working and a new session gets 503.
    gw = http_gateway(write_fleet({"tc": child_entry()}))
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    result = {}
    try:
        async with Client(gw.url, mode="legacy") as client:
            await wait_status(client, settled)
            structured(await client.call_tool("load_tools", {"tools": ["tc__slow"]}))

            async def call():
                result["r"] = await client.call_tool("tc__slow", {"ms": 2000})

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.sleep(0.3)
                gw.proc.send_signal(signal.SIGTERM)
                await anyio.sleep(0.3)
                async with httpx2.AsyncClient(timeout=5) as http:
                    r = await http.post(gw.url, headers=headers, json=init)
                result["new"] = (r.status_code, r.text)
    except BaseException as e:  # closing the session after the server stopped may fail; the call must not
        if "r" not in result:
            raise
        print(f"client close after shutdown: {type(e).__name__}")
    assert result["new"] == (503, "graph-os is shutting down\n"), result["new"]
    assert not result["r"].is_error and result["r"].content[0].text == "slept 2000 ms"
    assert gw.proc.wait(timeout=15) == 0


def test_inspector_cli_drives_the_gateway(write_fleet, remote_children, http_gateway):
    config = write_fleet({"tiny": {"url": remote_children["tiny"]},
                          "ev": {"url": remote_children["evhttp"], "expose": "eager"}})
    gw = http_gateway(config)
    cwd = PEERS / "node" / "cwd"
    cwd.mkdir(exist_ok=True)

    def cli(*args):
        out = subprocess.run(["node", str(INSPECTOR), "--cli", gw.url, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    deadline = time.monotonic() + 30
    while True:
        status = cli("--method", "tools/call", "--tool-name", "multiplexer_status")["structuredContent"]
        if settled(status["children"]) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    listed = [t["name"] for t in cli("--method", "tools/list")["tools"]]
    assert "find_tools" in listed and "ev__get-sum" in listed
    found = cli("--method", "tools/call", "--tool-name", "find_tools", "--tool-arg", "query=count words in a text")
    assert found["structuredContent"]["results"][0]["name"] == "tiny__word_count"
    loaded = cli("--method", "tools/call", "--tool-name", "load_tools", "--tool-arg", 'tools=["tiny__add"]')
    assert loaded["structuredContent"]["loaded"] == ["tiny__add"]
    unloaded = cli("--method", "tools/call", "--tool-name", "unload_tools", "--tool-arg", 'tools=["tiny__add"]')
    assert unloaded["structuredContent"]["not_loaded"] == ["tiny__add"], "each inspector-cli run is a new session"
    summed = cli("--method", "tools/call", "--tool-name", "ev__get-sum", "--tool-arg", "a=2", "b=3")
    assert "5" in summed["content"][0]["text"]


async def test_a_session_ended_by_delete_answers_204_and_clients_close_without_a_warning(
        write_fleet, http_gateway, caplog):
    import logging

    from mcp.client.streamable_http import streamable_http_client

    gw = http_gateway(write_fleet({}))
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.post(gw.url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        assert r.status_code == 200, r.text
        session = {**headers, "Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
        r = await http.delete(gw.url, headers=session)
        assert r.status_code == 204 and r.content == b"", (r.status_code, r.text)
        r = await http.post(gw.url, headers=session, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 404, r.text
    # The official Python SDK (as FastMCP and pydantic-ai use it) ends its session without complaint.
    with caplog.at_level(logging.WARNING, logger="mcp.client.streamable_http"):
        async with Client(streamable_http_client(gw.url), mode="legacy") as c:
            await c.list_tools()
    assert not [r for r in caplog.records if "termination" in r.getMessage()], caplog.text
