"""Acceptance of the core gateway over stdio, driven by the official Python `mcp` SDK client."""
import json
import os
import subprocess
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp import types

from conftest import (EVERYTHING, GRAPH_OS, META_TOOLS, PYTHON, TINY, child_entry, settled, structured,
                      wait_status)

pytestmark = pytest.mark.anyio


def gateway(config, env=None):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config)], env=env)


def full_fleet(write_fleet):
    return write_fleet({
        "testchild": child_entry(),
        "everything": {"command": str(EVERYTHING), "args": ["stdio"]},
        "tiny": {"command": str(PYTHON), "args": [str(TINY)]},
        # maxRestarts 0: fail at the first boot failure (boot failures are retried otherwise).
        "missing": {"command": "/nonexistent/graph-os-no-such-binary", "maxRestarts": 0},
        "mute": child_entry("--hang-init", initializationTimeout=2, maxRestarts=0),
    })


class Notes:
    """Collects tools/list_changed notifications from either era."""

    def __init__(self):
        self.count = 0
        self.event = anyio.Event()

    def hit(self):
        self.count += 1
        self.event.set()

    async def wait(self, timeout=5.0):
        with anyio.fail_after(timeout):
            await self.event.wait()
        self.event = anyio.Event()

    async def handler(self, message):
        if isinstance(message, types.ServerNotification) and isinstance(message, types.ToolListChangedNotification):
            self.hit()
        elif getattr(message, "method", None) == "notifications/tools/list_changed":
            self.hit()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_find_load_call_unload_with_broken_children(write_fleet, mode):
    notes = Notes()
    started = time.monotonic()
    async with Client(gateway(full_fleet(write_fleet)), mode=mode, message_handler=notes.handler) as client:
        connect_s = time.monotonic() - started
        print(f"[{mode}] spawn -> connected in {connect_s * 1000:.1f} ms (protocol {client.protocol_version})")
        # Regression guard only; the < 100 ms target is measured by `graph-os bench`.
        assert connect_s < 2.0
        if mode == "auto":
            assert client.protocol_version == "2026-07-28"
        else:
            assert client.protocol_version == "2025-11-25"

        names = [t.name for t in (await client.list_tools()).tools]
        assert names == META_TOOLS

        status = await wait_status(client, settled)
        children = status["children"]
        assert children["missing"]["state"] == "failed"
        assert children["missing"]["last_error"]["code"] == "child-spawn-failed"
        assert children["mute"]["state"] == "failed"
        assert children["mute"]["last_error"]["code"] == "child-initialize-timeout"
        for up in ("testchild", "everything", "tiny"):
            assert children[up]["state"] == "up", children[up]

        found = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))
        top3 = [r["name"] for r in found["results"][:3]]
        assert "ever__get-sum" in top3, found
        sum_row = next(r for r in found["results"] if r["name"] == "ever__get-sum")
        assert set(sum_row["input_schema"]["properties"]) >= {"a", "b"}
        assert sum_row["loaded"] is False
        assert found["unavailable"] == {"missing": "child-spawn-failed", "mute": "child-initialize-timeout"}

        async def load_and_call(sub=None):
            loaded = structured(await client.call_tool("load_tools", {"tools": ["ever__get-sum"]}))
            assert loaded["loaded"] == ["ever__get-sum"], loaded
            # 2026 era: a change racing the listen acknowledgement is delivered when the stream opens
            assert loaded["notification"] in (("sent",) if sub is None else ("sent", "no_stream"))
            await wait_note(sub)
            names = [t.name for t in (await client.list_tools()).tools]
            assert "ever__get-sum" in names
            result = await client.call_tool("ever__get-sum", {"a": 2, "b": 3})
            assert not result.is_error
            assert "5" in result.content[0].text
            unloaded = structured(await client.call_tool("unload_tools", {"tools": ["ever__get-sum"]}))
            assert unloaded["unloaded"] == ["ever__get-sum"]
            await wait_note(sub)
            names = [t.name for t in (await client.list_tools()).tools]
            assert "ever__get-sum" not in names

        async def wait_note(sub):
            if sub is None:
                await notes.wait()
            else:
                with anyio.fail_after(5):
                    event = await sub.__anext__()
                assert "tools" in type(event).__name__.lower() or "tool" in repr(event).lower(), event

        if mode == "auto":
            async with client.listen(tools_list_changed=True) as sub:
                await load_and_call(sub)
        else:
            await load_and_call()
            assert notes.count == 2


async def test_fastmcp_child_tool_through_gateway(write_fleet):
    config = write_fleet({"tiny": {"command": str(PYTHON), "args": [str(TINY)]}})
    async with Client(gateway(config), mode="legacy") as client:
        await wait_status(client, settled)
        found = structured(await client.call_tool("find_tools", {"query": "count the words", "top_k": 3}))
        assert found["results"][0]["name"] == "tiny__word_count"
        structured(await client.call_tool("load_tools", {"servers": ["tiny"]}))
        result = await client.call_tool("tiny__add", {"a": 2, "b": 40})
        assert not result.is_error
        assert result.structured_content == {"result": 42}


async def test_child_environment_is_an_allowlist(write_fleet, tmp_path):
    canary = "canary-value-3f9a1c"
    alias_value = "alias-secret-77d2e0"
    config = write_fleet({"env": child_entry(env={"DECLARED_PLAIN": "visible", "API_TOKEN": "env://CHILD_TOKEN_ALIAS"})})
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": canary, "CANARY_PLAIN": canary, "CHILD_TOKEN_ALIAS": alias_value,
           "GRAPH_OS_LOG": "debug", "XDG_SESSION_COOKIE": canary, "SSL_CERT_EVIL": canary}
    errlog = open(tmp_path / "stderr.log", "w")
    params = gateway(config, env=env)
    from mcp.client.stdio import stdio_client  # noqa: F401  (documented entry point)
    async with Client(params, mode="legacy") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"servers": ["env"]}))
        names = structured(await client.call_tool("env__env_names", {}))["names"]
        assert "AWS_SECRET_ACCESS_KEY" not in names and "CANARY_PLAIN" not in names
        assert "CHILD_TOKEN_ALIAS" not in names
        assert {"DECLARED_PLAIN", "API_TOKEN", "PATH"} <= set(names)
        outside = set(names) - {"DECLARED_PLAIN", "API_TOKEN"}
        # Exact names (docs/threat-model.md, ENV_ALLOWLIST): no prefix lets a neighbour through.
        allowed = {"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "NO_PROXY", "SSL_CERT_FILE",
                   "SSL_CERT_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME",
                   "XDG_RUNTIME_DIR"}
        assert outside <= allowed, outside - allowed
        token = await client.call_tool("env__env_get", {"name": "API_TOKEN"})
        assert token.content[0].text == alias_value
        status = json.dumps(structured(await client.call_tool("multiplexer_status", {})))
        catalog = json.dumps(structured(await client.call_tool("list_catalog", {})))
        assert alias_value not in status and alias_value not in catalog
    errlog.close()


async def test_missing_secret_fails_only_that_child(write_fleet):
    config = write_fleet({
        "needs": child_entry(env={"API_TOKEN": "env://GRAPH_OS_TEST_UNSET_ALIAS"}),
        "fine": child_entry(),
    })
    env = {k: v for k, v in os.environ.items() if k != "GRAPH_OS_TEST_UNSET_ALIAS"}
    async with Client(gateway(config, env=env), mode="legacy") as client:
        status = await wait_status(client, settled)
        assert status["children"]["needs"]["state"] == "failed"
        assert status["children"]["needs"]["last_error"]["code"] == "secret-unavailable"
        assert status["children"]["fine"]["state"] == "up"


def test_validate_names_every_problem_and_serve_keeps_the_good_entry(write_fleet):
    config = write_fleet({
        "unknown-key": child_entry(colour="blue"),
        "out-of-bounds": child_entry(maxConcurrency=0),
        "inline-token": child_entry(env={"GITHUB_TOKEN": "ghp_literal_value"}),
        "good": child_entry(),
    })
    out = subprocess.run([str(GRAPH_OS), "validate", "--config", str(config)], capture_output=True, text=True)
    assert out.returncode == 1, out
    text = out.stdout
    assert "server 'unknown-key' field 'colour'" in text
    assert "server 'out-of-bounds' field 'maxConcurrency'" in text
    assert "server 'inline-token' field 'env.GITHUB_TOKEN'" in text
    assert "ghp_literal_value" not in text + out.stderr
    assert "'good'" not in text
    assert "1 server admitted, 3 refused" in text


async def test_serving_a_config_with_bad_entries_serves_the_good_one(write_fleet):
    config = write_fleet({
        "unknown-key": child_entry(colour="blue"),
        "inline-token": child_entry(env={"GITHUB_TOKEN": "ghp_literal_value"}),
        "good": child_entry(),
    })
    async with Client(gateway(config), mode="legacy") as client:
        status = await wait_status(client, settled)
        assert list(status["children"]) == ["good"]
        assert {i["server"] for i in status["config_issues"]} == {"unknown-key", "inline-token"}
        assert "ghp_literal_value" not in json.dumps(status)
        structured(await client.call_tool("load_tools", {"tools": ["good__add"]}))
        result = await client.call_tool("good__add", {"a": 1, "b": 1})
        assert result.content[0].text == "2"


async def test_catalog_bounds_refuse_each_oversized_child(write_fleet):
    config = write_fleet({
        "many": child_entry("--tools", "5000"),
        "huge": child_entry("--tools", "100", "--pad-bytes", "65536"),
        "deep": child_entry("--deep", "40"),
        "ok": child_entry(),
    })
    async with Client(gateway(config), mode="legacy") as client:
        status = await wait_status(client, settled)
        ch = status["children"]
        assert (ch["many"]["state"], ch["many"]["last_error"]["code"]) == ("failed", "catalog-too-many-items")
        assert (ch["huge"]["state"], ch["huge"]["last_error"]["code"]) == ("failed", "catalog-too-large")
        assert (ch["deep"]["state"], ch["deep"]["last_error"]["code"]) == ("failed", "catalog-too-deep")
        assert ch["ok"]["state"] == "up"
        catalog = structured(await client.call_tool("list_catalog", {"include_tools": False}))
        assert catalog["total_tools"] == ch["ok"]["tool_count"] > 0


async def test_prefix_collisions_are_deterministic_and_long_names_stay_callable(write_fleet, tmp_path):
    servers = {"weather-api": child_entry(), "weather-service": child_entry("--long-name"), "weather": child_entry()}
    prefixes = []
    for order in (list(servers), list(reversed(servers))):
        config = write_fleet({k: servers[k] for k in order}, name=f"fleet-{order[0]}.json")
        async with Client(gateway(config), mode="legacy") as client:
            await wait_status(client, settled)
            catalog = structured(await client.call_tool("list_catalog", {}))
            prefixes.append({row["server"]: row["prefix"] for row in catalog["servers"]})
            long = [t["name"] for row in catalog["servers"] for t in row["tools"] if t["tool"].startswith("long_")]
            assert len(long) == 1 and len(long[0]) <= 64, long
            structured(await client.call_tool("load_tools", {"tools": long}))
            result = await client.call_tool(long[0], {})
            assert result.content[0].text == "long ok"
    assert prefixes[0] == prefixes[1]
    assert len(set(prefixes[0].values())) == 3
    assert prefixes[0] == {"weather": "weat", "weather-api": "weath", "weather-service": "weathe"}


async def test_prompts_and_resources_are_relayed(write_fleet):
    config = write_fleet({"tc": child_entry()})
    async with Client(gateway(config), mode="legacy") as client:
        await wait_status(client, settled)
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        assert prompts == ["tc__greet"]
        got = await client.get_prompt("tc__greet", {"name": "Ada"})
        assert "Hello, Ada!" in got.messages[0].content.text
        uris = [str(r.uri) for r in (await client.list_resources()).resources]
        assert uris == ["test://hello"]
        read = await client.read_resource("test://hello")
        assert read.contents[0].text == "hello from the test child"
        item = await client.read_resource("test://items/42")
        assert item.contents[0].text == "item 42"


async def test_out_of_bounds_meta_input_gets_a_stable_code(write_fleet):
    config = write_fleet({})
    async with Client(gateway(config), mode="legacy") as client:
        for args in ({"query": ""}, {"query": "x" * 4097}, {"query": "x", "top_k": 101}):
            r = await client.call_tool("find_tools", args)
            assert r.is_error and r.content[0].text.startswith("request-out-of-bounds"), args
        r = await client.call_tool("load_tools", {"tools": [f"t{i}" for i in range(129)]})
        assert r.is_error and r.content[0].text.startswith("request-out-of-bounds")
        r = await client.call_tool("find_tools", {"query": "x", "bogus": 1})
        assert r.is_error and r.content[0].text.startswith("invalid-arguments")


async def test_progress_logging_and_cancellation_are_relayed(write_fleet):
    config = write_fleet({"tc": child_entry()})
    logs, progress = [], []

    async def on_log(params):
        logs.append(params)

    async def on_progress(value, total, message):
        progress.append((value, total))

    async with Client(gateway(config), mode="legacy", logging_callback=on_log) as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"servers": ["tc"]}))
        result = await client.call_tool("tc__progress", {"steps": 3}, progress_callback=on_progress)
        assert result.content[0].text == "3 steps done"
        with anyio.fail_after(5):
            while len(progress) < 3:
                await anyio.sleep(0.02)
        assert progress == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]
        assert any("progress tool started" in str(m.data) for m in logs), logs

        with anyio.move_on_after(0.5):
            await client.call_tool("tc__hang", {})
        with anyio.fail_after(5):
            while True:
                count = (await client.call_tool("tc__cancellations", {})).content[0].text
                if count == "1":
                    break
                await anyio.sleep(0.05)
        status = structured(await client.call_tool("multiplexer_status", {}))
        assert status["children"]["tc"]["in_flight"] == 0


async def test_calling_a_tool_that_is_not_loaded(write_fleet):
    config = write_fleet({"tc": child_entry()})
    async with Client(gateway(config), mode="legacy") as client:
        await wait_status(client, settled)
        result = await client.call_tool("tc__add", {"a": 1, "b": 2})
        assert result.is_error and result.content[0].text.startswith("tool-not-loaded")
        with pytest.raises(Exception, match="Unknown tool"):
            await client.call_tool("tc__nope", {})
