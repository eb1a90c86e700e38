"""Both protocol eras on both sides: a 2025 or 2026-07-28 front client (the Python SDK in `legacy` or
`auto` mode) × a 2025-only or 2026-07-28-only child (the project's test child with `--era`), over a stdio
child and a streamable-HTTP child. Each pair runs the find → load → call → unload flow with progress, a
child that asks the client for input (elicitation) and a child whose tool list changes."""
import os
import subprocess

import anyio
import pytest
from mcp import Client, StdioServerParameters, types

from conftest import GRAPH_OS, TESTCHILD, child_entry, free_port, settled, structured, wait_status
from test_http import wait_port

pytestmark = pytest.mark.anyio

PROTOCOL = {"legacy": "2025-11-25", "modern": "2026-07-28"}


@pytest.fixture
def http_child(tmp_path):
    procs = []

    def start(*args):
        port = free_port()
        p = subprocess.Popen([str(TESTCHILD), "--http", str(port), *args], stdout=subprocess.DEVNULL,
                             stderr=open(tmp_path / f"child-{port}.log", "w"))
        procs.append(p)
        wait_port(port, p)
        return f"http://127.0.0.1:{port}/mcp"

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=5)


async def answer(ctx, params):
    return types.ElicitResult(action="accept", content={"answer": "teal"})


@pytest.mark.parametrize("child_transport", ["stdio", "http"])
@pytest.mark.parametrize("child_era", ["legacy", "modern"])
@pytest.mark.parametrize("front", ["legacy", "auto"])
async def test_every_era_pair_finds_loads_calls_and_unloads(write_fleet, http_gateway, http_child, front, child_era,
                                                           child_transport):
    if child_transport == "stdio":
        fleet = write_fleet({"tc": child_entry("--era", child_era)})
        server = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)])
    else:
        fleet = write_fleet({"tc": {"url": http_child("--era", child_era)}})
        server = http_gateway(fleet).url
    async with Client(server, mode=front, elicitation_callback=answer) as client:
        assert client.protocol_version == ("2026-07-28" if front == "auto" else "2025-11-25")
        status = await wait_status(client, settled)
        tc = status["children"]["tc"]
        # A 2026-only child is up (opened with server/discover); a 2025-only one through the fallback.
        assert tc["state"] == "up", tc
        assert tc["protocol"] == PROTOCOL[child_era], tc

        found = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))
        assert "tc__add" in [r["name"] for r in found["results"][:3]], found
        wanted = ["tc__add", "tc__progress", "tc__elicit", "tc__grow"]
        loaded = structured(await client.call_tool("load_tools", {"tools": wanted}))
        assert loaded["loaded"] == wanted, loaded
        assert set(wanted) <= {t.name for t in (await client.list_tools()).tools}

        r = await client.call_tool("tc__add", {"a": 2, "b": 3})
        assert not r.is_error and r.content[0].text == "5", r

        seen = []

        async def progress(value, total, message):
            seen.append((value, total))

        r = await client.call_tool("tc__progress", {"steps": 3}, progress_callback=progress)
        assert not r.is_error and r.content[0].text == "3 steps done", r
        with anyio.fail_after(5):
            while len(seen) < 3:
                await anyio.sleep(0.05)
        assert seen == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)], seen

        # The child asks for input: a 2025 child with elicitation/create, a 2026 child with an
        # input_required result. Either way the front client's own callback answers it, in its era.
        r = await client.call_tool("tc__elicit", {"message": "Favourite colour?"})
        assert not r.is_error, r
        assert r.content[0].text == 'elicited: accept {"answer":"teal"}', r

        # The child's list changes (2025: a notification; 2026: its subscriptions/listen stream)
        # reach the catalog.
        r = await client.call_tool("tc__grow", {})
        assert r.content[0].text == "added grown_1", r
        with anyio.fail_after(10):
            while True:
                found = structured(await client.call_tool("find_tools", {"query": "tool added at runtime by grow"}))
                if "tc__grown_1" in [x["name"] for x in found["results"]]:
                    break
                await anyio.sleep(0.2)

        unloaded = structured(await client.call_tool("unload_tools", {"tools": wanted}))
        assert sorted(unloaded["unloaded"]) == sorted(wanted), unloaded
        assert not set(wanted) & {t.name for t in (await client.list_tools()).tools}


async def test_the_era_is_learned_once_per_child(write_fleet, tmp_path):
    """A 2025-only child is probed with server/discover once; its restarts open with initialize only."""
    log = tmp_path / "requests.log"
    fleet = write_fleet({"tc": child_entry("--era", "legacy", "--request-log", str(log), "--exit-after", "2")})
    server = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)])
    async with Client(server, mode="legacy") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"tools": ["tc__add", "tc__whoami"]}))
        await client.call_tool("tc__add", {"a": 1, "b": 1})
        await client.call_tool("tc__whoami", {})  # the child exits mid-call: it is restarted
        await wait_status(client, lambda c: c["tc"]["restarts"] >= 1 and c["tc"]["state"] == "up")
        r = await client.call_tool("tc__add", {"a": 2, "b": 2})
        assert not r.is_error and r.content[0].text == "4", r
    lines = log.read_text().splitlines()
    assert lines.count("server/discover") == 1, lines
    assert lines.count("initialize") == 2, lines


async def test_a_parked_call_resumes_only_for_its_caller_and_tool(write_fleet, http_gateway):
    """A 2025 child asks a 2026 client for input: the call is parked behind an opaque requestState that
    another caller, another tool or a forged handle cannot use; the real answer completes the call."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from test_trust import DELEGATE, MANAGE, TOKEN_ARGS, token_env
    from conftest import error_code

    def client(token):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        return Client(streamable_http_client(gw.url, http_client=http), mode="auto", elicitation_callback=answer)

    # The child's elicitation needs an exact caller: a per-session connection (a shared stdio one
    # carries no association).
    gw = http_gateway(write_fleet({"tc": child_entry("--era", "legacy", sessionIsolation="per-session")}), *TOKEN_ARGS,
                      env=token_env())
    async with client(DELEGATE) as a, client(MANAGE) as b:
        await wait_status(b, settled)
        for c in (a, b):
            structured(await c.call_tool("load_tools", {"tools": ["tc__elicit", "tc__echo"]}))
        first = await a.session.call_tool("tc__elicit", {"message": "colour?"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult), first
        assert list(first.input_requests) == ["graph-os"], first
        assert first.input_requests["graph-os"].method == "elicitation/create"
        state = first.request_state
        assert state.startswith("graph-os.input.") and len(state) == len("graph-os.input.") + 32, state
        status = structured(await b.call_tool("multiplexer_status", {}))
        assert status["parked_input_calls"] == 1
        reply = {"graph-os": {"action": "accept", "content": {"answer": "mallory"}}}
        # Another caller, another tool, a forged handle: refused, and the parked call stays parked.
        stolen = await b.session.call_tool("tc__elicit", {}, input_responses=reply, request_state=state,
                                           allow_input_required=True)
        assert error_code(stolen) == "input-state-unknown", stolen
        other_tool = await a.session.call_tool("tc__echo", {"text": "x"}, input_responses=reply, request_state=state,
                                               allow_input_required=True)
        assert error_code(other_tool) == "input-state-unknown", other_tool
        forged = await a.session.call_tool("tc__elicit", {}, input_responses=reply,
                                           request_state="graph-os.input." + "0" * 32, allow_input_required=True)
        assert error_code(forged) == "input-state-unknown", forged
        done = await a.session.call_tool("tc__elicit", {}, allow_input_required=True, request_state=state,
                                         input_responses={"graph-os": {"action": "accept", "content": {"answer": "teal"}}})
        assert isinstance(done, types.CallToolResult) and not done.is_error, done
        assert done.content[0].text == 'elicited: accept {"answer":"teal"}', done
        # Used once: the same handle is gone.
        again = await a.session.call_tool("tc__elicit", {}, input_responses=reply, request_state=state,
                                          allow_input_required=True)
        assert error_code(again) == "input-state-unknown", again
        status = structured(await b.call_tool("multiplexer_status", {}))
        assert status["parked_input_calls"] == 0


@pytest.mark.parametrize("child_era", ["legacy", "modern"])
async def test_a_2025_client_subscribes_to_a_resource_of_either_era(write_fleet, child_era):
    """resources/subscribe of a 2025 client: forwarded to a 2025 child, a subscriptions/listen stream on a
    2026 child (which has no resources/subscribe); the child's update reaches the client either way."""
    updates = []

    async def on_message(message):
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)

    fleet = write_fleet({"tc": child_entry("--era", child_era)})
    server = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)])
    async with Client(server, mode="legacy", message_handler=on_message) as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"tools": ["tc__touch"]}))
        await client.subscribe_resource("test://hello")
        r = await client.call_tool("tc__touch", {"uri": "test://hello"})
        assert not r.is_error, r
        with anyio.fail_after(5):
            while "test://hello" not in updates:
                await anyio.sleep(0.05)
        await client.unsubscribe_resource("test://hello")
        r = await client.call_tool("tc__touch", {"uri": "test://hello"})
        if child_era == "modern":
            assert r.content[0].text == "touched test://hello (0 streams)", r
        await anyio.sleep(0.3)
        assert updates == ["test://hello"], updates


async def test_one_session_unsubscribing_leaves_another_sessions_subscription_to_a_2026_child(
        write_fleet, http_gateway):
    """Two HTTP sessions subscribe to one resource of a 2026 child (one subscriptions/listen stream for both):
    the first one's unsubscribe does not end the stream the second still follows."""
    updates = {"a": [], "b": []}

    def handler(name):
        async def on_message(message):
            if isinstance(message, types.ResourceUpdatedNotification):
                updates[name].append(message.params.uri)
        return on_message

    gw = http_gateway(write_fleet({"tc": child_entry("--era", "modern")}))
    async with Client(gw.url, mode="legacy", message_handler=handler("a")) as a, \
            Client(gw.url, mode="legacy", message_handler=handler("b")) as b:
        await wait_status(a, settled)
        for c in (a, b):
            structured(await c.call_tool("load_tools", {"tools": ["tc__touch"]}))
            await c.subscribe_resource("test://hello")
        await a.unsubscribe_resource("test://hello")
        r = await b.call_tool("tc__touch", {"uri": "test://hello"})
        assert r.content[0].text == "touched test://hello (1 streams)", r
        with anyio.fail_after(5):
            while "test://hello" not in updates["b"]:
                await anyio.sleep(0.05)
        await anyio.sleep(0.3)
        assert updates["a"] == [], updates
        # The last subscriber's unsubscribe ends the stream.
        await b.unsubscribe_resource("test://hello")
        r = await b.call_tool("tc__touch", {"uri": "test://hello"})
        assert r.content[0].text == "touched test://hello (0 streams)", r


async def test_a_2025_child_that_dies_on_server_discover_still_comes_up(write_fleet):
    """The era probe must not cost a child that exits on an unknown method: the next attempt opens it with
    initialize."""
    fleet = write_fleet({"tc": child_entry("--exit-on-discover")})
    server = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)])
    async with Client(server, mode="legacy") as client:
        status = await wait_status(client, lambda c: c["tc"]["state"] == "up")
        tc = status["children"]["tc"]
        assert tc["protocol"] == "2025-11-25" and tc["restarts"] == 1, tc
        structured(await client.call_tool("load_tools", {"tools": ["tc__add"]}))
        r = await client.call_tool("tc__add", {"a": 2, "b": 5})
        assert r.content[0].text == "7", r


@pytest.mark.parametrize("front", ["legacy", "auto"])
async def test_a_2026_childs_prompt_that_asks_for_input(write_fleet, front):
    """prompts/get of a 2026 child answering input_required: a 2026 client answers it through graph-os; a
    2025 client gets a stable refusal (graph-os relays client input for tools/call only)."""
    from mcp.shared.exceptions import MCPError

    fleet = write_fleet({"tc": child_entry("--era", "modern")})
    server = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)])

    async def name(ctx, params):
        return types.ElicitResult(action="accept", content={"answer": "Grace"})

    async with Client(server, mode=front, elicitation_callback=name) as client:
        await wait_status(client, settled)
        got = await client.get_prompt("tc__greet", {"name": "Ada"})
        assert "Hello, Ada!" in got.messages[0].content.text
        if front == "auto":
            got = await client.get_prompt("tc__greet", {})
            assert "Hello, Grace!" in got.messages[0].content.text
        else:
            with pytest.raises(MCPError) as refused:
                await client.get_prompt("tc__greet", {})
            assert refused.value.error.data == {"code": "input-required-unsupported"}, refused.value.error


async def test_a_resumed_call_reports_progress_to_the_resuming_request(write_fleet, http_gateway):
    """A 2025 child's call parked on a 2026 client's input goes on after the answer: its progress reaches the
    client on the request that resumed it (over HTTP, the first request's stream is closed by then)."""
    gw = http_gateway(write_fleet({"tc": child_entry(sessionIsolation="per-session")}))
    seen = []

    async def progress(value, total, message):
        seen.append((value, total))

    async with Client(gw.url, mode="auto", elicitation_callback=answer) as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"tools": ["tc__elicit"]}))
        r = await client.call_tool("tc__elicit", {}, progress_callback=progress)
        assert r.content[0].text == 'elicited: accept {"answer":"teal"}', r
        with anyio.fail_after(5):
            while not seen:
                await anyio.sleep(0.05)
        assert seen == [(1.0, 1.0)], seen


@pytest.mark.parametrize("child_era", ["legacy", "modern"])
async def test_a_2026_client_follows_a_resource_of_either_era(write_fleet, child_era):
    """subscriptions/listen with resourceSubscriptions: graph-os subscribes at the owning child (2025:
    resources/subscribe, 2026: its own listen stream) and the update reaches the client's stream."""
    fleet = write_fleet({"tc": child_entry("--era", child_era)})
    server = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)])
    async with Client(server, mode="auto") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"tools": ["tc__touch"]}))
        async with client.listen(resource_subscriptions=["test://hello", "test://nobody-serves-this"]) as sub:
            assert list(sub.honored.resource_subscriptions or []) == ["test://hello"], sub.honored
            # graph-os subscribes at the child once the stream is acknowledged (rmcp acknowledges
            # first): touch until the update arrives.
            event = None
            for _ in range(20):
                r = await client.call_tool("tc__touch", {"uri": "test://hello"})
                assert not r.is_error, r
                with anyio.move_on_after(0.5):
                    event = await sub.__anext__()
                if event is not None:
                    break
            assert event is not None and "test://hello" in repr(event), event


@pytest.mark.parametrize("child_transport", ["stdio", "http"])
@pytest.mark.parametrize("front", ["legacy", "auto"])
async def test_completions_of_a_2025_child_reach_a_client_of_either_era(write_fleet, http_gateway, http_child, front,
                                                                       child_transport):
    """completion/complete answered by a 2025 child (no `resultType`) goes through the one era
    translation (src/server/era.rs) like every other result: a 2026 client (which rejects a result
    without `resultType`) completes prompt and resource-template arguments."""
    entry = child_entry("--era", "legacy") if child_transport == "stdio" else {"url": http_child("--era", "legacy")}
    gw = http_gateway(write_fleet({"tc": entry}))
    async with Client(gw.url, mode=front) as client:
        assert client.protocol_version == ("2026-07-28" if front == "auto" else "2025-11-25")
        await wait_status(client, settled)
        prompt = types.PromptReference(type="ref/prompt", name="tc__greet")
        r = await client.complete(prompt, {"name": "name", "value": "a"})
        assert r.completion.values == ["alice"], r
        templates = (await client.list_resource_templates()).resource_templates
        uri = next(t.uri_template for t in templates if t.uri_template.endswith("items/{id}"))
        r = await client.complete(types.ResourceTemplateReference(type="ref/resource", uri=uri), {"name": "id", "value": "4"})
        assert r.completion.values == ["42", "420"], r
        # The other results on the same session, for the same client.
        assert [p.name for p in (await client.list_prompts()).prompts] == ["tc__greet"]
        assert (await client.get_prompt("tc__greet", {"name": "x"})).messages
        assert (await client.read_resource("test://hello")).contents
