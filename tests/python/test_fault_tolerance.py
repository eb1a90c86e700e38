"""Nothing a child, a file or a replica does can stall the fleet: discovery answers from what is
ready, failed children are explicit entries of a published generation, boot failures are retried,
hot reload reacts only to real changes and applies entry by entry, and a refused refresh changes
nothing anyone sees. Real gateway, real children, the official Python SDK client."""
import json
import os
import re
import shutil
import subprocess
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import (GRAPH_OS, TESTCHILD, ListChangedCounter as Notes, child_entry, free_port, settled,
                      structured, wait_status)

pytestmark = pytest.mark.anyio


def gateway(config, state=None, *args):
    extra = ["--state-dir", str(state)] if state else []
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config), *extra, *args],
                                 env=dict(os.environ))


def percentile(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))]


async def timed(coro):
    t = time.monotonic()
    r = await coro
    return r, (time.monotonic() - t) * 1000


async def test_a_hanging_child_never_delays_discovery(write_fleet):
    config = write_fleet({"ok": child_entry(), "hang": child_entry("--hang-init")})
    async with Client(gateway(config), mode="legacy") as client:
        await anyio.sleep(1.0)
        times = []
        for _ in range(100):
            found, ms = await timed(client.call_tool("find_tools", {"query": "add two numbers"}))
            found = structured(found)
            times.append(ms)
            assert "ok__add" in [r["name"] for r in found["results"]]
            assert found["unavailable"] == {"hang": "child-starting"}
        for call in ({"name": "list_catalog", "arguments": {}}, {"name": "list_catalog", "arguments": {"include_tools": True}}):
            _, ms = await timed(client.call_tool(call["name"], call["arguments"]))
            times.append(ms)
        for op in (client.list_prompts(), client.list_resources(), client.list_tools()):
            _, ms = await timed(op)
            times.append(ms)
        print(f"find_tools/listings with a child hanging at initialize: p50 {percentile(times, .5):.1f} ms, "
              f"max {max(times):.1f} ms")
        # The old behaviour waited the 5 s discovery budget on every request; 1 s is a generous
        # ceiling on a shared machine (the figures above are what the issue asks to report).
        assert max(times) < 1000, max(times)


async def test_tools_list_answers_while_a_hundred_children_spawn(write_fleet):
    fleet = {f"c{i:03d}": child_entry("--slow-list-ms", "3000") for i in range(100)}
    config = write_fleet(fleet)
    async with Client(gateway(config), mode="legacy") as client:
        # Like the hanging-child case, measured 1 s after start: the children still list for 3 s,
        # but the burst of 100 fork/execs (which starves this client and the gateway alike on a
        # 2-core machine for a few hundred ms) is over.
        await anyio.sleep(1.0)
        times = []
        for _ in range(20):
            _, ms = await timed(client.list_tools())
            times.append(ms)
        print(f"tools/list with 100 children spawning: p50 {percentile(times, .5):.1f} ms, max {max(times):.1f} ms")
        status = structured(await client.call_tool("multiplexer_status", {}))
        assert sum(c["state"] == "starting" for c in status["children"].values()) > 0, "nothing was spawning any more"
        assert max(times) < 1000, times


async def test_a_failed_child_is_an_explicit_entry_of_a_published_generation(write_fleet, tmp_path):
    config = write_fleet({"ok": child_entry(), "dead": {"command": "/nonexistent/graph-os-no-such"}})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        deadline, started = time.monotonic() + 10, time.monotonic()
        while True:
            catalog = structured(await client.call_tool("list_catalog", {"include_tools": False}))
            if catalog["catalog_identity"]["catalog_generation"] >= 1:
                break
            assert time.monotonic() < deadline, catalog
            await anyio.sleep(0.2)
        print(f"generation {catalog['catalog_identity']['catalog_generation']} published "
              f"{time.monotonic() - started:.1f} s after start")
        assert catalog["unavailable"] == {"dead": "child-spawn-failed"}, catalog["unavailable"]
        ident = catalog["catalog_identity"]
        r = await client.call_tool("catalog_dispatch", {
            "tool_name": "ok__add", "arguments": {"a": 2, "b": 5},
            "expected_catalog_generation": ident["catalog_generation"], "expected_snapshot_digest": ident["snapshot_digest"]})
        assert not r.is_error and r.content[0].text == "7", r
        refresh = structured(await client.call_tool("catalog_refresh", {
            "request_id": "ft-1", "expected_config_revision": ident["config_revision"],
            "expected_catalog_generation": ident["catalog_generation"],
            "expected_snapshot_digest": ident["snapshot_digest"], "deadline_ms": 10000}))
        assert refresh["changed"] is False and refresh["catalog_generation"] == ident["catalog_generation"]


async def test_a_remote_child_down_at_boot_comes_up_when_its_server_does(write_fleet, tmp_path):
    port = free_port()
    config = write_fleet({"late": {"url": f"http://127.0.0.1:{port}/mcp"}, "ok": child_entry()})
    async with Client(gateway(config), mode="legacy") as client:
        await wait_status(client, lambda ch: ch["ok"]["state"] == "up")
        await anyio.sleep(3)
        server = subprocess.Popen([str(TESTCHILD), "--http", str(port)], stdout=subprocess.DEVNULL,
                                  stderr=open(tmp_path / "late.log", "w"))
        try:
            started = time.monotonic()
            st = await wait_status(client, lambda ch: ch["late"]["state"] == "up", timeout=30)
            print(f"remote child up {time.monotonic() - started:.1f} s after its server started "
                  f"({st['children']['late']['restarts']} retries)")
            r = await client.call_tool("load_tools", {"servers": ["late"]})
            assert "late__add" in structured(r)["loaded"]
        finally:
            server.terminate()
            server.wait(timeout=5)


def reload_count(log):
    return log.read_text().count("fleet reloaded")


async def wait_reloads(log, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while reload_count(log) < n and time.monotonic() < deadline:
        await anyio.sleep(0.1)
    await anyio.sleep(0.8)  # and no more arrive
    return reload_count(log)


async def test_hot_reload_reacts_to_real_changes_only(write_fleet, http_gateway, tmp_path):
    config = write_fleet({"a": child_entry()})
    gw = http_gateway(config)
    log = gw.stderr_path
    await anyio.sleep(1.0)
    for _ in range(3):
        subprocess.run(["cat", str(config)], stdout=subprocess.DEVNULL, check=True)
        config.read_text()
    assert await wait_reloads(log, 1, timeout=1.0) == 0, "reads must not reload"
    config.write_text(json.dumps({"mcpServers": {"a": child_entry(), "b": child_entry()}}))
    assert await wait_reloads(log, 1) == 1
    # Rewriting the same bytes is not a change.
    config.write_text(config.read_text())
    assert await wait_reloads(log, 2, timeout=1.0) == 1
    # A version with a new bad entry: the rest applies, the bad entry is refused, still ready.
    config.write_text(json.dumps({"mcpServers": {"a": child_entry(), "c": child_entry(), "bad": {"command": "x", "bogus": 1}}}))
    assert await wait_reloads(log, 2) == 2
    code, body = gw.get("/readyz")
    assert code == 200, body
    metrics = gw.get("/metrics")[1]
    assert 'graphos_fleet_reloads_total{kind="partial"} 1' in metrics and "graphos_config_problems 1" in metrics
    status = json.loads(body)
    assert status["reload_error"][0]["server"] == "bad"


async def test_a_configmap_style_symlink_swap_is_one_reload(tmp_path, http_gateway):
    # The kubelet's layout: fleet.json -> ..data/fleet.json, ..data -> ..<timestamp>/
    mount = tmp_path / "mount"
    (mount / "..v1").mkdir(parents=True)
    (mount / "..v1" / "fleet.json").write_text(json.dumps({"mcpServers": {"a": child_entry()}}))
    os.symlink("..v1", mount / "..data")
    os.symlink("..data/fleet.json", mount / "fleet.json")
    gw = http_gateway(mount / "fleet.json")
    await anyio.sleep(1.0)
    (mount / "..v2").mkdir()
    (mount / "..v2" / "fleet.json").write_text(json.dumps({"mcpServers": {"a": child_entry(), "b": child_entry()}}))
    os.symlink("..v2", mount / "..data_tmp")
    os.rename(mount / "..data_tmp", mount / "..data")
    shutil.rmtree(mount / "..v1")
    assert await wait_reloads(gw.stderr_path, 1) == 1
    text = gw.stderr_path.read_text()
    assert re.search(r"fleet reloaded added=\[\"b\"\]", text), text[-2000:]


async def test_a_refused_refresh_changes_nothing_anyone_sees(write_fleet, tmp_path):
    # "vary" lists a new schema for add at every listing; "slow" lists in 1.5 s.
    config = write_fleet({"vary": child_entry("--vary-add-schema"), "slow": child_entry("--slow-list-ms", "1500")})
    notes = Notes()
    async with Client(gateway(config, tmp_path / "state"), mode="legacy", message_handler=notes.handler) as client:
        await wait_status(client, settled)
        ident = structured(await client.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        while ident["catalog_generation"] < 1:
            await anyio.sleep(0.2)
            ident = structured(await client.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        structured(await client.call_tool("load_tools", {"tools": ["vary__add"]}))
        await anyio.sleep(0.3)
        before = next(t for t in (await client.list_tools()).tools if t.name == "vary__add").input_schema
        notes.count = 0
        args = {"request_id": "ft-2", "expected_config_revision": ident["config_revision"],
                "expected_catalog_generation": ident["catalog_generation"],
                "expected_snapshot_digest": ident["snapshot_digest"], "deadline_ms": 300}
        r = await client.call_tool("catalog_refresh", args)
        assert r.is_error and r.structured_content["code"] == "refresh-deadline-exceeded"
        await anyio.sleep(2.0)  # the slow probe finishes in the background meanwhile
        after = next(t for t in (await client.list_tools()).tools if t.name == "vary__add").input_schema
        assert after == before and notes.count == 0, (notes.count, before, after)
        # A successful refresh publishes the changed schema and tells the session.
        ok = structured(await client.call_tool("catalog_refresh", {**args, "deadline_ms": 10000}))
        assert ok["changed"] and ok["catalog_generation"] == ident["catalog_generation"] + 1
        await anyio.sleep(0.5)
        changed = next(t for t in (await client.list_tools()).tools if t.name == "vary__add").input_schema
        assert changed != before and notes.count == 1
