"""Native 2025-11-25 Tasks (SEP-1686) through graph-os, driven by the official Python SDK's task
client against server-everything's `simulate-research-query` (a real task server): create →
tasks/get polling → tasks/result, elicitation through tasks/result, tasks/cancel, tasks/list,
notifications/tasks/status, caller scoping, bounds before routing, and a task whose child
connection died. Over streamable HTTP (two callers) and stdio.
"""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

from conftest import EVERYTHING, GRAPH_OS, child_entry, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ALICE, BOB = "alice-token-0123456789abc", "bob-token-0123456789abcde"
TOKEN_ARGS = ["--token", "delegate=env://T_ALICE", "--token", "delegate=env://T_BOB"]
RESEARCH = "ev__simulate-research-query"


def env():
    return {**os.environ, "T_ALICE": ALICE, "T_BOB": BOB}


def fleet(write_fleet, **extra):
    return write_fleet({"ev": {"command": str(EVERYTHING), "args": ["stdio"], "expose": "eager", **extra},
                        "tc": child_entry(expose="eager")})


class Seen:
    """What the client saw besides answers: elicitations and task status notifications."""

    def __init__(self, answer="technical"):
        self.elicited = []
        self.statuses = []
        self.answer = answer

    async def elicit(self, ctx, params):
        self.elicited.append(params)
        return types.ElicitResult(action="accept", content={"interpretation": self.answer})

    async def message(self, m):
        root = getattr(m, "root", None)
        if isinstance(root, types.TaskStatusNotification):
            self.statuses.append(root.params)


class http_session:
    """A 2025-11-25 session with graph-os over streamable HTTP as `token`'s caller (`None`: anonymous)."""

    def __init__(self, gw, token, seen=None):
        self.gw, self.token, self.seen = gw, token, seen or Seen()

    async def __aenter__(self):
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = streamablehttp_client(self.gw.url, headers=headers)
        r, w, self.session_id = await self._http.__aenter__()
        self._s = ClientSession(r, w, elicitation_callback=self.seen.elicit, message_handler=self.seen.message)
        s = await self._s.__aenter__()
        self.init = s.init = await s.initialize()
        return s

    async def __aexit__(self, *exc):
        await self._s.__aexit__(*exc)
        await self._http.__aexit__(*exc)


async def wait_tool(s, name, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        if name in tools:
            return tools[name]
        assert time.monotonic() < deadline, sorted(tools)
        await anyio.sleep(0.3)


async def poll(s, task_id, until, timeout=60):
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        t = await s.experimental.get_task(task_id)
        seen.append(t.status)
        if t.status in until:
            return t, seen
        assert time.monotonic() < deadline, seen
        await anyio.sleep(0.2)


async def code_of(awaitable):
    with pytest.raises(McpError) as e:
        await awaitable
    data = e.value.error.data or {}
    return e.value.error.code, (data.get("code") if isinstance(data, dict) else None)


def raw(gw, token, session_id, body):
    """One raw JSON-RPC request on an open session: the decoded answer."""
    req = urllib.request.Request(gw.url, method="POST", data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}", "Mcp-Session-Id": session_id, "Mcp-Protocol-Version": "2025-11-25"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            return json.loads(line[5:])
    return json.loads(text)


async def test_a_research_task_runs_with_elicitation_through_tasks_result(write_fleet, http_gateway):
    gw = http_gateway(fleet(write_fleet), *TOKEN_ARGS, env=env())
    async with http_session(gw, ALICE) as s:
        # graph-os keeps the tool's taskSupport, and declares 2025 tasks because its child does.
        tool = await wait_tool(s, RESEARCH)
        assert tool.execution is not None and tool.execution.taskSupport == "required", tool
    async with http_session(gw, ALICE) as s:
        assert s_caps(s).requests.tools.call is not None
        created = await s.experimental.call_tool_as_task(RESEARCH, {"topic": "python", "ambiguous": True})
        task_id = created.task.taskId
        assert task_id.startswith("graph-os-task-") and len(task_id) == len("graph-os-task-") + 32
        assert created.task.ttl == 300000 and created.task.pollInterval == 1000
        t, statuses = await poll(s, task_id, {"input_required", "completed"})
        assert t.status == "input_required", statuses
        assert "working" in statuses
        assert t.ttl == 300000 and t.pollInterval == 1000, "2025 fields kept through rmcp"
        # The elicitation is delivered while tasks/result waits, and the answer reaches the child.
        result = await s.experimental.get_task_result(task_id, types.CallToolResult)
        text = result.content[0].text
        assert "Clarification**: technical" in text, text[:400]
        assert result.meta["io.modelcontextprotocol/related-task"]["taskId"] == task_id
        done, _ = await poll(s, task_id, {"completed"})
        assert done.status == "completed"
        listed = await s.experimental.list_tasks()
        assert [x.taskId for x in listed.tasks] == [task_id]


# The child's elicitation names its task (`io.modelcontextprotocol/related-task`) and arrives while
# graph-os's tasks/result for that task waits at the child (over stdio: no stream tells whose it
# is): it reaches that task's owner, with graph-os's id.
async def test_elicitation_and_status_notifications_carry_graph_os_ids(write_fleet, http_gateway):
    gw = http_gateway(fleet(write_fleet), *TOKEN_ARGS, env=env())
    seen = Seen(answer="historical")
    async with http_session(gw, ALICE, seen) as s:
        await wait_tool(s, RESEARCH)
    async with http_session(gw, ALICE, seen) as s:
        assert s_caps(s) is not None
        created = await s.experimental.call_tool_as_task(RESEARCH, {"topic": "rome", "ambiguous": True})
        task_id = created.task.taskId
        await poll(s, task_id, {"input_required"})
        result = await s.experimental.get_task_result(task_id, types.CallToolResult)
        assert "historical" in result.content[0].text
        assert len(seen.elicited) == 1
        # The elicitation is tagged with the caller's task (graph-os's id, never the child's).
        related = seen.elicited[0].meta.model_dump()["io.modelcontextprotocol/related-task"]
        assert related == {"taskId": task_id}, related
        deadline = time.monotonic() + 10
        while not any(n.status == "completed" for n in seen.statuses) and time.monotonic() < deadline:
            await anyio.sleep(0.2)
        assert seen.statuses, "notifications/tasks/status reached the caller"
        assert {n.taskId for n in seen.statuses} == {task_id}, [n.taskId for n in seen.statuses]
        assert {"working", "input_required", "completed"} <= {n.status for n in seen.statuses}


def s_caps(s):
    return s.init.capabilities.tasks


async def test_two_anonymous_sessions_never_see_each_others_tasks(write_fleet, http_gateway):
    # Anonymous callers are admitted (--anonymous-scope) beside tokens: each session its own principal.
    gw = http_gateway(fleet(write_fleet), *TOKEN_ARGS, "--anonymous-scope", "delegate", env=env())
    async with http_session(gw, None) as a, http_session(gw, None) as b:
        await wait_tool(a, RESEARCH)
        task_id = (await a.experimental.call_tool_as_task(RESEARCH, {"topic": "slow"})).task.taskId
        assert (await a.experimental.get_task(task_id)).taskId == task_id
        assert await code_of(b.experimental.get_task(task_id)) == (-32602, "task-not-found")
        assert await code_of(b.experimental.cancel_task(task_id)) == (-32602, "task-not-found")
        assert await code_of(b.experimental.get_task_result(task_id, types.CallToolResult)) == (-32602, "task-not-found")
        assert (await b.experimental.list_tasks()).tasks == []
        assert [t.taskId for t in (await a.experimental.list_tasks()).tasks] == [task_id]
        assert (await a.experimental.cancel_task(task_id)).status == "cancelled"


async def test_cancel_scoping_bounds_and_unsupported_tools(write_fleet, http_gateway):
    gw = http_gateway(fleet(write_fleet), *TOKEN_ARGS, env=env())
    async with http_session(gw, ALICE) as s, http_session(gw, BOB) as b:
        await wait_tool(s, RESEARCH)
        caps = s_caps(s)
        assert caps is not None and caps.requests.tools.call is not None and caps.cancel is not None
        created = await s.experimental.call_tool_as_task(RESEARCH, {"topic": "slow"})
        task_id = created.task.taskId
        # Another caller: the id does not exist for it, its list is empty, it cannot cancel it.
        assert await code_of(b.experimental.get_task(task_id)) == (-32602, "task-not-found")
        assert await code_of(b.experimental.cancel_task(task_id)) == (-32602, "task-not-found")
        assert await code_of(b.experimental.get_task_result(task_id, types.CallToolResult)) == (-32602, "task-not-found")
        assert (await b.experimental.list_tasks()).tasks == []
        # The child's own id is not a graph-os id either.
        assert await code_of(s.experimental.get_task("0" * 36)) == (-32602, "task-not-found")
        cancelled = await s.experimental.cancel_task(task_id)
        assert cancelled.taskId == task_id and cancelled.status == "cancelled", cancelled
        t, _ = await poll(s, task_id, {"cancelled"})
        assert t.status == "cancelled"
        # A tool without taskSupport is not run as a task (SEP-1686: method not found).
        assert await code_of(s.experimental.call_tool_as_task("tc__echo", {"text": "x"})) == (-32601, "task-unsupported")
        assert (await s.call_tool("tc__echo", {"text": "plain"})).content[0].text.endswith("plain")


async def test_out_of_bounds_task_ids_and_input_responses_never_reach_the_child(write_fleet, http_gateway):
    gw = http_gateway(fleet(write_fleet), *TOKEN_ARGS, env=env())
    ctx = http_session(gw, ALICE)
    async with ctx as s:
        await wait_tool(s, RESEARCH)
        created = await s.experimental.call_tool_as_task(RESEARCH, {"topic": "bounds"})
        task_id = created.task.taskId
        sid = ctx.session_id()
        cases = {
            "blank": ({"taskId": "   "}, "task-id-invalid"),
            "control": ({"taskId": task_id + "\u0007"}, "task-id-invalid"),
            "long": ({"taskId": "x" * 513}, "task-id-invalid"),
            "number": ({"taskId": 7}, "task-id-invalid"),
            "string-too-long": ({"taskId": task_id, "inputResponses": {"a": "s" * (16 * 1024 + 1)}}, "request-out-of-bounds"),
            "too-many": ({"taskId": task_id, "inputResponses": {str(i): 1 for i in range(4097)}}, "request-out-of-bounds"),
            "too-large": ({"taskId": task_id, "inputResponses": {str(i): "y" * 9000 for i in range(8)}}, "request-out-of-bounds"),
            "too-deep": ({"taskId": task_id, "inputResponses": {"d": json.loads("[" * 25 + "]" * 25)}}, "request-out-of-bounds"),
        }
        for i, (name, (params, code)) in enumerate(cases.items()):
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                answer = raw(gw, ALICE, sid, {"jsonrpc": "2.0", "id": 100 + i, "method": method, "params": params})
                assert answer.get("error", {}).get("data", {}).get("code") == code, (name, method, answer)
                assert "sss" not in json.dumps(answer) and "yyy" not in json.dumps(answer)
        # Refused before routing: the task was neither cancelled nor answered; it still runs and completes.
        trimmed = raw(gw, ALICE, sid, {"jsonrpc": "2.0", "id": 200, "method": "tasks/get", "params": {"taskId": f"  {task_id} "}})
        assert trimmed["result"]["taskId"] == task_id and trimmed["result"]["status"] in ("working", "completed")
        done, _ = await poll(s, task_id, {"completed", "cancelled", "failed"})
        assert done.status == "completed"
    assert "sss" not in gw.stderr_path.read_text()


async def test_a_task_whose_child_connection_died_fails_closed(write_fleet, http_gateway):
    gw = http_gateway(fleet(write_fleet), *TOKEN_ARGS, env=env())
    async with http_session(gw, ALICE) as s:
        await wait_tool(s, RESEARCH)
        created = await s.experimental.call_tool_as_task(RESEARCH, {"topic": "epoch"})
        task_id = created.task.taskId
        # Kill server-everything (a direct child of the gateway running node): it restarts.
        out = subprocess.run(["pgrep", "-P", str(gw.proc.pid), "-f", "server-everything"], capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split()]
        assert pids, "server-everything runs as the gateway's child"
        for p in pids:
            os.kill(p, 9)
        await anyio.sleep(1.0)
        for op in (s.experimental.get_task(task_id), s.experimental.cancel_task(task_id),
                   s.experimental.get_task_result(task_id, types.CallToolResult)):
            assert await code_of(op) == (-32602, "task-epoch-changed")
        # The restarted child serves new tasks.
        await wait_tool(s, RESEARCH)
        deadline = time.monotonic() + 30
        while True:
            try:
                again = await s.experimental.call_tool_as_task(RESEARCH, {"topic": "after"})
                break
            except McpError:
                assert time.monotonic() < deadline
                await anyio.sleep(0.5)
        t, _ = await poll(s, again.task.taskId, {"working", "completed"})
        assert t.status in ("working", "completed")


async def test_tasks_over_the_stdio_front(write_fleet):
    config = fleet(write_fleet)
    params = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config)])
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            # Initialized before the child is up: tasks are declared while its capability is unknown.
            init = await s.initialize()
            assert init.capabilities.tasks is not None
            tool = await wait_tool(s, RESEARCH)
            assert tool.execution.taskSupport == "required"
            created = await s.experimental.call_tool_as_task(RESEARCH, {"topic": "stdio"})
            result = await s.experimental.get_task_result(created.task.taskId, types.CallToolResult)
            assert "Research Report: stdio" in result.content[0].text
            assert [t.taskId for t in (await s.experimental.list_tasks()).tasks] == [created.task.taskId]


@pytest.fixture
def everything_http(tmp_path):
    """server-everything over streamable HTTP on a free loopback port: its /mcp URL."""
    import socket

    port = free_port()
    p = subprocess.Popen([str(EVERYTHING), "streamableHttp"], env={**os.environ, "PORT": str(port)},
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "evhttp.log", "w"))
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.monotonic() < deadline and p.poll() is None, "server-everything did not listen"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    p.terminate()
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()


async def test_a_task_at_a_streamable_http_child_stays_on_its_pool_connection(write_fleet, http_gateway, everything_http):
    # Two pooled connections = two sessions at the child: a task exists in one of them only.
    config = write_fleet({"ev": {"url": everything_http, "poolSize": 2, "expose": "eager"}})
    gw = http_gateway(config, *TOKEN_ARGS, env=env())
    seen = Seen(answer="pooled")
    async with http_session(gw, ALICE, seen) as s:
        tool = await wait_tool(s, RESEARCH)
        assert tool.execution.taskSupport == "required"
        ids = []
        for topic in ("one", "two", "three"):
            created = await s.experimental.call_tool_as_task(RESEARCH, {"topic": topic, "ambiguous": topic == "two"})
            ids.append(created.task.taskId)
        for task_id in ids:  # each poll goes to the connection its task lives on
            t = await s.experimental.get_task(task_id)
            assert t.taskId == task_id and t.status in ("working", "input_required", "completed"), t
        result = await s.experimental.get_task_result(ids[1], types.CallToolResult)
        assert "Clarification**: pooled" in result.content[0].text
        assert len(seen.elicited) == 1
        for task_id in (ids[0], ids[2]):
            r = await s.experimental.get_task_result(task_id, types.CallToolResult)
            assert "Research Report" in r.content[0].text
        assert sorted(t.taskId for t in (await s.experimental.list_tasks()).tasks) == sorted(ids)
