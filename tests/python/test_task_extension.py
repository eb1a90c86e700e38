"""The 2026-07-28 tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) through graph-os, with raw
2026 requests (no released client speaks the extension yet) toward the project's test child in
`--era modern --tasks` mode, whose tasks run on rmcp's own TaskManager: a task created by `tools/call`,
polled with `tasks/get`, fed with `tasks/update` (the `input_required` flow), cancelled with
`tasks/cancel`; scoped to the caller and to the era; bounded before the child; failing closed across a
child restart; never offered to a caller that did not declare the extension."""
import base64
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

import pytest

from conftest import child_entry
from test_eras import http_child  # noqa: F401  (fixture)

pytestmark = pytest.mark.anyio

EXT = "io.modelcontextprotocol/tasks"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def rpc(gw, method, params=None, tasks=True, principal="alice", timeout=15):
    """One raw 2026-07-28 request; returns the JSON-RPC answer (JSON or the SSE stream's answer)."""
    caps = {"extensions": {EXT: {}}} if tasks else {}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**(params or {}), "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}}}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "Mcp-Principal": principal}
    name = (params or {}).get("name") or (params or {}).get("taskId")
    if isinstance(name, str) and method in ("tools/call", "tasks/get", "tasks/update", "tasks/cancel"):
        headers["Mcp-Name"] = header_value(name)
    req = urllib.request.Request(gw.url, method="POST", headers=headers, data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        text = e.read().decode()
    for line in text.splitlines():
        if line.startswith("data: ") and '"id":7' in line.replace(" ", ""):
            return json.loads(line[6:])
    return json.loads(text)


def header_value(value):
    """A value as an HTTP header carries it (SEP-2243: Base64-wrapped when it must be)."""
    if value and (value[0] in " \t" or value[-1] in " \t" or any(not 0x20 <= ord(c) <= 0x7E for c in value)):
        return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="
    return value


def result(answer):
    assert "result" in answer, answer
    return answer["result"]


def code(answer):
    """The stable graph-os code of a JSON-RPC error answer."""
    assert "error" in answer, answer
    return (answer["error"].get("data") or {}).get("code")


def tool_error(answer):
    """The stable graph-os code of a `tools/call` answered with a tool error."""
    called = result(answer)
    assert called.get("isError") is True, called
    return called["_meta"]["io.graph-os/error"]["code"]


def wait_up(gw, server="tc", timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        status = result(rpc(gw, "tools/call", {"name": "multiplexer_status", "arguments": {}}))
        child = status["structuredContent"]["children"].get(server, {})
        if child.get("state") == "up":
            return child
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def poll(gw, task_id, until, principal="alice", timeout=15):
    deadline = time.monotonic() + timeout
    while True:
        task = result(rpc(gw, "tasks/get", {"taskId": task_id}, principal=principal))
        if task["status"] in until:
            return task
        assert task["status"] in ("working", "input_required"), task
        assert time.monotonic() < deadline, task
        time.sleep(0.05)


def requests_seen(log):
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def task_gateway(write_fleet, http_gateway, tmp_path, http_child):  # noqa: F811
    def start(transport="stdio", *extra):
        log = tmp_path / f"requests-{transport}.log"
        args = ["--era", "modern", "--tasks", "--request-log", str(log), *extra]
        entry = child_entry(*args) if transport == "stdio" else {"url": http_child(*args)}
        gw = http_gateway(write_fleet({"tc": {**entry, "expose": "eager", "prefix": ""}}))
        wait_up(gw)
        return gw, log

    return start


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_task_is_created_polled_fed_and_completed_under_a_graph_os_id(task_gateway, transport):
    gw, log = task_gateway(transport)
    discovered = result(rpc(gw, "server/discover"))
    assert EXT in discovered["capabilities"].get("extensions", {}), discovered

    created = result(rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 50, "ask": True}}))
    assert created["resultType"] == "task", created
    task_id = created["taskId"]
    assert task_id.startswith("graph-os-task-") and created["status"] == "working", created

    asking = poll(gw, task_id, {"input_required"})
    assert asking["taskId"] == task_id
    request = asking["inputRequests"]["answer"]
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "form", asking

    assert result(rpc(gw, "tasks/update", {"taskId": task_id, "inputResponses": {
        "answer": {"action": "accept", "content": {"answer": "teal"}}}}))["resultType"] == "complete"
    done = poll(gw, task_id, {"completed"})
    assert done["taskId"] == task_id
    assert done["result"]["content"][0]["text"] == "teal after 50 ms (task)", done
    # The child's own task id (a UUID from rmcp's TaskManager) never reaches the caller.
    for answer in (created, asking, done):
        assert not UUID.search(json.dumps(answer)), answer
    if transport == "stdio":  # (the HTTP child's log sees only its 2025 sessions)
        seen = requests_seen(log)
        assert seen.count("tasks/update") == 1 and "tasks/get" in seen, seen


async def test_a_task_is_cancelled_at_its_child(task_gateway):
    gw, _ = task_gateway()
    task_id = result(rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 60_000}}))["taskId"]
    assert result(rpc(gw, "tasks/cancel", {"taskId": task_id}))["resultType"] == "complete"
    assert poll(gw, task_id, {"cancelled"})["status"] == "cancelled"


async def test_tasks_belong_to_their_caller(task_gateway):
    gw, log = task_gateway()
    task_id = result(rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 60_000}}))["taskId"]
    before = len(requests_seen(log))
    for method, params in [("tasks/get", {}), ("tasks/cancel", {}),
                           ("tasks/update", {"inputResponses": {"answer": {"action": "decline"}}})]:
        answer = rpc(gw, method, {"taskId": task_id, **params}, principal="mallory")
        assert code(answer) == "task-not-found", (method, answer)
    assert len(requests_seen(log)) == before, "a refused task request reached the child"
    # The owner's task is untouched by the attempts.
    assert result(rpc(gw, "tasks/get", {"taskId": task_id}))["status"] == "working"
    # The extension has no tasks/list and no tasks/result.
    assert rpc(gw, "tasks/list")["error"]["code"] == -32601
    assert rpc(gw, "tasks/result", {"taskId": task_id})["error"]["code"] == -32601


async def test_out_of_bounds_task_requests_are_refused_before_the_child(task_gateway):
    gw, log = task_gateway()
    task_id = result(rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 60_000, "ask": True}}))["taskId"]
    poll(gw, task_id, {"input_required"})
    before = len(requests_seen(log))
    for bad in ["x" * 513, "é" * 257, "  ", "graph-os-task-\u0007bell"]:
        assert code(rpc(gw, "tasks/get", {"taskId": bad})) == "task-id-invalid", repr(bad[:20])
    flood = {"answer": {"action": "accept", "content": {"answer": "y" * 70_000}}}
    answer = rpc(gw, "tasks/update", {"taskId": task_id, "inputResponses": flood})
    assert "error" in answer and "inputResponses" in answer["error"]["message"], answer
    deep = {"answer": {"action": "accept", "content": {"answer": "x"}}}
    node = deep["answer"]["content"]
    for _ in range(40):
        node["n"] = {}
        node = node["n"]
    assert "error" in rpc(gw, "tasks/update", {"taskId": task_id, "inputResponses": deep})
    assert len(requests_seen(log)) == before, "an out-of-bounds request reached the child"
    # Nothing was lost: the task still waits for its answer.
    assert result(rpc(gw, "tasks/get", {"taskId": task_id}))["status"] == "input_required"


async def test_a_caller_without_the_extension_gets_a_plain_result(task_gateway):
    gw, _ = task_gateway()
    plain = result(rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 10}}, tasks=False))
    assert plain["resultType"] == "complete" and plain["content"][0]["text"] == "worked after 10 ms (inline)"
    # Without the declaration the task methods are refused by the protocol itself.
    assert rpc(gw, "tasks/get", {"taskId": "graph-os-task-0"}, tasks=False)["error"]["code"] == -32021


async def test_a_2025_session_never_sees_the_extension(task_gateway):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    gw, _ = task_gateway()
    async with Client(streamable_http_client(gw.url), mode="legacy") as c:
        assert c.protocol_version == "2025-11-25"
        assert EXT not in (c.server_capabilities.model_dump().get("extensions") or {})
        called = await c.call_tool("task_work", {"ms": 10})
        assert called.content[0].text == "worked after 10 ms (inline)", called


async def test_update_and_cancel_fail_closed_after_the_child_restarts(task_gateway):
    gw, log = task_gateway()
    task_id = result(rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 60_000, "ask": True}}))["taskId"]
    poll(gw, task_id, {"input_required"})
    whoami = result(rpc(gw, "tools/call", {"name": "whoami", "arguments": {}}))["content"][0]["text"]
    pid = int(whoami.split()[0].split("=")[1])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while wait_up(gw).get("connection_generation", 0) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    before = len(requests_seen(log))
    update = rpc(gw, "tasks/update", {"taskId": task_id, "inputResponses": {"answer": {"action": "decline"}}})
    assert code(update) == "task-epoch-changed", update
    assert code(rpc(gw, "tasks/cancel", {"taskId": task_id})) == "task-epoch-changed"
    assert code(rpc(gw, "tasks/get", {"taskId": task_id})) == "task-epoch-changed"
    assert len(requests_seen(log)) == before, "a task request was replayed on the new connection"
    # New tasks run on the new connection.
    fresh = result(rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 10}}))["taskId"]
    assert poll(gw, fresh, {"completed"})["result"]["content"][0]["text"] == "worked after 10 ms (task)"


async def test_a_child_task_id_out_of_bounds_is_not_registered(task_gateway):
    gw, _ = task_gateway("stdio", "--lie-task-id")
    answer = rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 10}})
    assert "task id out of bounds" in json.dumps(answer), answer
    assert "x" * 100 not in json.dumps(answer)
    assert structured_status(gw)["children"]["tc"]["state"] == "up"


async def test_a_child_without_the_extension_is_not_offered_it(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({"tc": child_entry("--era", "modern", expose="eager", prefix="")}))
    wait_up(gw)
    assert EXT not in result(rpc(gw, "server/discover"))["capabilities"].get("extensions", {})
    plain = result(rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 10}}))
    assert plain["content"][0]["text"] == "worked after 10 ms (inline)", plain


async def test_many_tasks_are_capped_per_caller_and_the_rest_are_cancelled_at_the_child(task_gateway):
    gw, log = task_gateway()
    ids, refused = [], []
    for _ in range(260):
        answer = rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 60_000}})
        (ids if result(answer).get("resultType") == "task" else refused).append(answer)
    assert len(ids) == 256, (len(ids), refused[:1])
    assert {tool_error(a) for a in refused} == {"tasks-full"}, refused[:1]
    # Nobody can follow a refused task: each is cancelled at the child.
    deadline = time.monotonic() + 10
    while requests_seen(log).count("tasks/cancel") < 4:
        assert time.monotonic() < deadline, requests_seen(log)[-10:]
        time.sleep(0.05)
    # Another caller still has its own room.
    bob = rpc(gw, "tools/call", {"name": "task_work", "arguments": {"ms": 10}}, principal="bob")
    assert result(bob)["resultType"] == "task", bob


def structured_status(gw):
    return result(rpc(gw, "tools/call", {"name": "multiplexer_status", "arguments": {}}))["structuredContent"]



async def test_two_anonymous_2026_callers_never_see_each_others_tasks(write_fleet, http_gateway):
    """With --anonymous-scope beside a token, a session-less anonymous caller is its connection: a
    task created on one connection exists on that connection only."""
    import http.client
    import urllib.parse

    gw = http_gateway(write_fleet({"tc": {**child_entry("--era", "modern", "--tasks"), "expose": "eager",
                                          "prefix": ""}}),
                      "--token", "manage=env://T_ADMIN", "--anonymous-scope", "delegate",
                      env={**os.environ, "T_ADMIN": "admin-token-0123456789abcdef"})
    url = urllib.parse.urlsplit(gw.url)

    def caller():
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=15)

        def call(method, params=None):
            body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**(params or {}), "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}},
                "io.modelcontextprotocol/clientInfo": {"name": "same-program", "version": "0"}}}}
            headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                       "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "User-Agent": "same-program"}
            name = (params or {}).get("name") or (params or {}).get("taskId")
            if name:
                headers["Mcp-Name"] = name
            conn.request("POST", url.path, body=json.dumps(body), headers=headers)
            text = conn.getresponse().read().decode()
            for line in text.splitlines():
                if line.startswith("data: ") and '"id":7' in line.replace(" ", ""):
                    return json.loads(line[6:])
            return json.loads(text)

        return call

    a, b = caller(), caller()
    deadline = time.monotonic() + 30
    while True:
        status = result(a("tools/call", {"name": "multiplexer_status", "arguments": {}}))
        if status["structuredContent"]["children"].get("tc", {}).get("state") == "up":
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    task_id = result(a("tools/call", {"name": "task_work", "arguments": {"ms": 60_000}}))["taskId"]
    assert result(a("tasks/get", {"taskId": task_id}))["status"] == "working"
    for method, params in [("tasks/get", {}), ("tasks/cancel", {}),
                           ("tasks/update", {"inputResponses": {"answer": {"action": "decline"}}})]:
        assert code(b(method, {"taskId": task_id, **params})) == "task-not-found", method
    assert result(a("tasks/get", {"taskId": task_id}))["status"] == "working"
    assert result(a("tasks/cancel", {"taskId": task_id}))["resultType"] == "complete"
