"""Child isolation: faults, limits, breaker, restart budget, schema changes, hot reload, metrics.

Every test drives the real graph-os binary with the real test child's fault modes through the
official Python SDK client. Timings are printed (the numbers behind the issue's acceptance) and
asserted with CI-noise slack only.
"""
import json
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp import types

from conftest import ListChangedCounter as Notes, GRAPH_OS, child_entry, error_code, settled, structured, wait_status

pytestmark = pytest.mark.anyio

CALL_TIMEOUT = 1.0


def gateway(config):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config)])


async def healthy_traffic(client, stop, failures, counter):
    """Calls the healthy child's add in a loop until stop is set."""
    while not stop.is_set():
        r = await client.call_tool("ok__add", {"a": 1, "b": 2})
        counter.append(1)
        if r.is_error or r.content[0].text != "3":
            failures.append(r)
        await anyio.sleep(0.01)


FAULTS = {
    # name: (child args, tool, arguments, expected code)
    "crash-mid-call": (("--exit-after", "1"), "slow", {"ms": 10}, "child-transport-closed"),
    "hang": ((), "hang", {}, "child-call-timeout"),
    "slow": ((), "slow", {"ms": int(CALL_TIMEOUT * 2000)}, "child-call-timeout"),
    "garbage": ((), "garbage", {}, "child-call-timeout"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_fault_matrix_call_faults(write_fleet, fault):
    args, tool, arguments, code = FAULTS[fault]
    config = write_fleet({
        "bad": child_entry(*args, callTimeout=CALL_TIMEOUT, breakerThreshold=0),
        "ok": child_entry(),
    })
    async with Client(gateway(config), mode="legacy") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"servers": ["bad", "ok"]}))
        stop, failures, counter = anyio.Event(), [], []
        elapsed = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(healthy_traffic, client, stop, failures, counter)
            for _ in range(3):
                t = time.monotonic()
                r = await client.call_tool(f"bad__{tool}", arguments)
                elapsed.append(time.monotonic() - t)
                assert error_code(r) == code, r
                await wait_status(client, lambda ch: ch["bad"]["state"] == "up", timeout=20)
            stop.set()
        print(f"[{fault}] faulty call latencies (s): {[round(e, 3) for e in elapsed]}; healthy calls: {len(counter)}")
        assert not failures, failures
        assert len(counter) > 10
        if code == "child-call-timeout":
            assert all(CALL_TIMEOUT <= e < CALL_TIMEOUT + 1.0 for e in elapsed), elapsed
        status = structured(await client.call_tool("multiplexer_status", {}))["children"]
        assert status["ok"]["state"] == "up" and status["ok"]["restarts"] == 0
        assert status["bad"]["breaker"] == "closed"
        if fault == "crash-mid-call":
            assert status["bad"]["restarts"] == 3
            assert status["bad"]["connection_generation"] == 4
        else:
            assert status["bad"]["restarts"] == 0
        assert status["bad"]["in_flight"] == 0 and status["ok"]["in_flight"] == 0


async def test_read_only_tool_is_retried_once_on_the_fresh_generation(write_fleet):
    config = write_fleet({"bad": child_entry("--exit-after", "1", callTimeout=CALL_TIMEOUT)})
    async with Client(gateway(config), mode="legacy") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"servers": ["bad"]}))
        # add is readOnlyHint: its call dies with the child, and is retried on the restarted one
        # (which dies again on its first call; the retry is not retried).
        r = await client.call_tool("bad__add", {"a": 1, "b": 1})
        assert error_code(r) == "child-transport-closed"
        status = structured(await client.call_tool("multiplexer_status", {}))["children"]["bad"]
        assert status["restarts"] >= 1


async def test_boot_failures_and_restart_storm_fail_fast(write_fleet):
    config = write_fleet({
        "boot": child_entry("--exit-at-boot", maxRestarts=0),
        "flap": child_entry("--exit-after", "1", maxRestarts=3, restartWindow=120),
        "ok": child_entry(),
    })
    async with Client(gateway(config), mode="legacy") as client:
        status = await wait_status(client, settled)
        assert status["children"]["boot"]["state"] == "failed"
        assert status["children"]["boot"]["last_error"]["code"] == "child-initialize-failed"
        structured(await client.call_tool("load_tools", {"servers": ["flap", "ok"]}))
        stop, failures, counter = anyio.Event(), [], []
        async with anyio.create_task_group() as tg:
            tg.start_soon(healthy_traffic, client, stop, failures, counter)
            await storm(client)
            stop.set()
        assert not failures and len(counter) > 10, failures
        print(f"healthy calls during the storm: {len(counter)}")


async def storm(client):
        codes = []
        for _ in range(20):
            r = await client.call_tool("flap__slow", {"ms": 1})
            codes.append(error_code(r))
            st = structured(await client.call_tool("multiplexer_status", {}))["children"]["flap"]
            if st["state"] == "failed":
                break
            await wait_status(client, lambda ch: ch["flap"]["state"] in ("up", "failed"), timeout=30)
        st = await wait_status(client, lambda ch: ch["flap"]["state"] == "failed", timeout=30)
        assert st["children"]["flap"]["last_error"]["code"] == "restart-budget-exhausted"
        assert st["children"]["flap"]["restarts"] == 3
        assert set(codes) <= {"child-transport-closed", "child-unavailable"}, codes
        fast = []
        for _ in range(20):
            t = time.monotonic()
            r = await client.call_tool("flap__slow", {"ms": 1})
            fast.append(time.monotonic() - t)
            assert error_code(r) == "child-unavailable"
        print(f"failed child round trips (s): median {sorted(fast)[10]:.4f}, max {max(fast):.4f}")
        assert sorted(fast)[10] < 0.05
        ok = await client.call_tool("ok__add", {"a": 2, "b": 2})
        assert ok.content[0].text == "4"


async def test_concurrency_bound_queue_timeout_and_no_slot_leaks(write_fleet):
    config = write_fleet({"lim": child_entry(maxConcurrency=2, maxConcurrencyPerPrincipal=2, queueTimeout=0.2, callTimeout=5)})
    async with Client(gateway(config), mode="legacy") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"servers": ["lim"]}))
        results = {}

        async def call(key, ms, delay=0.0):
            await anyio.sleep(delay)
            t = time.monotonic()
            r = await client.call_tool("lim__slow", {"ms": ms})
            results[key] = (r, time.monotonic() - t)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, 1, 1000)
            tg.start_soon(call, 2, 1000)
            for k in (3, 4, 5):
                tg.start_soon(call, k, 10, 0.1)
        for k in (1, 2):
            assert not results[k][0].is_error
        for k in (3, 4, 5):
            r, took = results[k]
            assert error_code(r) == "child-busy"
            assert 0.2 <= took < 0.8, took
        print("busy after (s):", [round(results[k][1], 3) for k in (3, 4, 5)])

        counts = {"ok": 0, "busy": 0, "tool-error": 0}

        async def mixed(i):
            tool, args = [("lim__add", {"a": i, "b": 1}), ("lim__fail", {}), ("lim__slow", {"ms": 5})][i % 3]
            r = await client.call_tool(tool, args)
            if not r.is_error:
                counts["ok"] += 1
            elif r.content[0].text.startswith("child-busy"):
                counts["busy"] += 1
            else:
                counts["tool-error"] += 1

        limiter = anyio.CapacityLimiter(16)

        async def bounded(i):
            async with limiter:
                await mixed(i)

        async with anyio.create_task_group() as tg:
            for i in range(1000):
                tg.start_soon(bounded, i)
        print("1000 mixed calls:", counts)
        assert sum(counts.values()) == 1000
        status = structured(await client.call_tool("multiplexer_status", {}))["children"]["lim"]
        assert status["in_flight"] == 0 and status["queued"] == 0
        assert status["breaker"] == "closed"


async def test_breaker_opens_half_opens_for_one_call_and_closes(write_fleet):
    config = write_fleet({"br": child_entry(callTimeout=0.3, breakerThreshold=2, breakerCooldown=1)})
    async with Client(gateway(config), mode="legacy") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"servers": ["br"]}))
        for _ in range(2):
            assert error_code(await client.call_tool("br__hang", {})) == "child-call-timeout"
        t = time.monotonic()
        assert error_code(await client.call_tool("br__add", {"a": 1, "b": 1})) == "child-circuit-open"
        assert time.monotonic() - t < 0.1
        # Timeouts of one principal (the stdio user) open that principal's own breaker, not the child's for
        # every principal (docs/child-runtime.md); it half-opens the same way.
        st = structured(await client.call_tool("multiplexer_status", {}))["children"]["br"]
        assert st["breaker"] == "closed" and st["principal_breakers_open"] == 1, st
        await anyio.sleep(1.1)
        st = structured(await client.call_tool("multiplexer_status", {}))["children"]["br"]
        assert st["principal_breakers_open"] == 0, st
        results = {}

        async def probe():
            results["probe"] = await client.call_tool("br__slow", {"ms": 200})

        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            await anyio.sleep(0.05)
            results["second"] = await client.call_tool("br__add", {"a": 1, "b": 1})
        assert not results["probe"].is_error
        assert error_code(results["second"]) == "child-circuit-open"
        st = structured(await client.call_tool("multiplexer_status", {}))["children"]["br"]
        assert st["breaker"] == "closed"
        assert (await client.call_tool("br__add", {"a": 1, "b": 1})).content[0].text == "2"




async def test_schema_change_on_restart_notifies_only_affected_sessions(write_fleet, tmp_path, http_gateway):
    config = write_fleet({
        "vary": child_entry("--schema-file", str(tmp_path / "version"), "--exit-after", "2"),
        "same": child_entry("--exit-after", "2"),
    })
    gw = http_gateway(config)
    a, b = Notes(), Notes()
    async with Client(gw.url, mode="legacy", message_handler=a.handler) as ca, \
            Client(gw.url, mode="legacy", message_handler=b.handler) as cb:
        await wait_status(ca, settled)
        structured(await ca.call_tool("load_tools", {"tools": ["vary__add", "vary__slow"]}))
        structured(await cb.call_tool("load_tools", {"tools": ["same__add", "same__slow"]}))
        await anyio.sleep(0.3)
        a.count = b.count = 0
        before = next(t for t in (await ca.list_tools()).tools if t.name == "vary__add")
        # Each child dies on its 2nd call and comes back: "vary" with a new schema, "same" identical.
        for client, tool in ((ca, "vary__slow"), (cb, "same__slow")):
            await client.call_tool(tool, {"ms": 1})
            await client.call_tool(tool, {"ms": 1})
        await wait_status(ca, lambda ch: all(c["state"] == "up" and c["connection_generation"] == 2 for c in ch.values()), timeout=20)
        await anyio.sleep(0.5)
        assert a.count == 1, "the session with the changed child's tools is told once"
        assert b.count == 0, "an identical reconnect sends nothing"
        after = next(t for t in (await ca.list_tools()).tools if t.name == "vary__add")
        assert before.input_schema != after.input_schema
        assert "v2" in after.input_schema["properties"]


async def test_hot_reload_remove_add_change_and_invalid(write_fleet, tmp_path, http_gateway):
    servers = {"keep": child_entry(), "gone": child_entry(), "edit": child_entry()}
    config = write_fleet(servers)
    gw = http_gateway(config)
    a, b = Notes(), Notes()
    async with Client(gw.url, mode="legacy", message_handler=a.handler) as ca, \
            Client(gw.url, mode="legacy", message_handler=b.handler) as cb:
        await wait_status(ca, settled)
        structured(await ca.call_tool("load_tools", {"tools": ["gone__add", "keep__add"]}))
        structured(await cb.call_tool("load_tools", {"tools": ["keep__add", "edit__add"]}))
        await anyio.sleep(0.3)
        a.count = b.count = 0
        keep_gen = structured(await ca.call_tool("multiplexer_status", {}))["children"]["keep"]["connection_generation"]

        # remove "gone", add "new", change "edit" (new args: a schema-file makes its schema differ)
        servers2 = {"keep": child_entry(), "new": child_entry(),
                    "edit": child_entry("--schema-file", str(tmp_path / "v"))}
        config.write_text(json.dumps({"mcpServers": servers2}))
        st = await wait_status(ca, lambda ch: set(ch) == {"keep", "new", "edit"} and settled(ch), timeout=20)
        assert st["children"]["keep"]["connection_generation"] == keep_gen, "untouched child not touched"
        await anyio.sleep(0.5)
        names_a = {t.name for t in (await ca.list_tools()).tools}
        names_b = {t.name for t in (await cb.list_tools()).tools}
        assert "gone__add" not in names_a and "keep__add" in names_a
        assert {"keep__add", "edit__add"} <= names_b
        assert a.count >= 1, "session that loaded a removed tool was told"
        assert b.count >= 1, "session whose loaded tool changed schema was told"
        edit = next(t for t in (await cb.list_tools()).tools if t.name == "edit__add")
        assert "v1" in edit.input_schema["properties"], "no obsolete schema survives the reload"
        found = structured(await ca.call_tool("find_tools", {"query": "add two numbers", "top_k": 10}))
        assert "new__add" in [r["name"] for r in found["results"]]

        # a version whose entry is invalid: that entry keeps its previous version, the rest of the
        # version applies (new and edit are gone), and readiness is not affected
        config.write_text('{"mcpServers": {"keep": {"command": "x", "bogus": 1}}}')
        st = await wait_status(ca, lambda ch: set(ch) == {"keep"}, timeout=10)
        assert st["reload_error"] and st["reload_error"][0]["field"] == "bogus"
        code, body = gw.get("/readyz")
        assert code == 200 and "bogus" in body
        r = await ca.call_tool("keep__add", {"a": 1, "b": 1})
        assert r.content[0].text == "2"
        # a document that does not parse keeps the whole fleet
        config.write_text('{"mcpServers": ')
        await anyio.sleep(1.0)
        st = structured(await ca.call_tool("multiplexer_status", {}))
        assert set(st["children"]) == {"keep"} and st["reload_error"]


async def test_metrics_expose_per_child_series(write_fleet, http_gateway):
    config = write_fleet({"m": child_entry()})
    gw = http_gateway(config)
    async with Client(gw.url, mode="legacy") as client:
        await wait_status(client, settled)
        structured(await client.call_tool("load_tools", {"servers": ["m"]}))
        await client.call_tool("m__add", {"a": 1, "b": 1})
        await client.call_tool("m__fail", {})
    code, text = gw.get("/metrics")
    assert code == 200
    for series in ('graphos_child_calls_total{server="m",code="ok"} 1',
                   'graphos_child_calls_total{server="m",code="tool-error"} 1',
                   'graphos_child_call_seconds_count{server="m"} 2',
                   'graphos_child_in_flight{server="m"} 0',
                   'graphos_child_up{server="m"} 1',
                   'graphos_child_breaker_state{server="m"} 0'):
        assert series in text, series
    assert 'graphos_child_catalog_tools{server="m"}' in text
