"""Child runtime hardening (issue "Hardening III", items 7, 13, 14), with the real gateway and real children:

- fair share: one principal saturating a shared child with slow calls neither takes every slot nor opens the
  child's breaker for another principal (src/child/share.rs, src/child/breaker.rs, `ChildRuntime::admit`);
- the crash retry of a read-only call goes through the same resolution as a fresh call: under `driftPolicy: hold`
  a restarted child whose tool changed answers `drift-pending` and never receives the call, on the typed path
  and on the raw hot path (`ChildRuntime::crash_retry`, `mux::forward::Resolution`);
- optional families are best effort: a child whose prompts/list errors keeps its tools (findable, callable),
  status shows the family unavailable, an explicit refresh reports the candidate incomplete (src/probe.rs).
"""
import os
import re
import time
import urllib.request

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import child_entry, error_code, settled, structured, wait_status

pytestmark = pytest.mark.anyio

NOISY = "noisy-principal-token-0123456789"
VICTIM = "victim-principal-token-0123456789"
ADMIN = "admin-principal-token-0123456789"
TOKEN_ENV = {"NOISY": NOISY, "VICTIM": VICTIM, "ADMIN": ADMIN}
TOKEN_ARGS = ("--token", "delegate=env://NOISY", "--token", "delegate=env://VICTIM", "--token", "manage=env://ADMIN")


def start(http_gateway, config, *extra):
    return http_gateway(config, *TOKEN_ARGS, *extra, env={**os.environ, **TOKEN_ENV})


def client(gw, token, mode="legacy"):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(gw.url, http_client=http), mode=mode)


def hot_calls(gw):
    status, text = gw.get("/metrics")  # as an operator: the gateway's own token
    assert status == 200, text
    m = re.search(r'graphos_hot_path_calls_total\{kind="http"\} (\d+)', text)
    return int(m.group(1)) if m else 0


async def test_one_principals_slow_calls_leave_slots_and_the_breaker_to_the_others(write_fleet, http_gateway):
    # 4 slots, so 2 per principal; slow calls time out after 1 s; 3 consecutive timeouts would open a breaker.
    config = write_fleet({"tc": child_entry(expose="eager", maxConcurrency=4, callTimeout=1.0, queueTimeout=0.5,
                                            breakerThreshold=3, breakerCooldown=1)})
    gw = start(http_gateway, config)
    noisy_codes = []
    victim_results = []
    async with client(gw, NOISY) as noisy, client(gw, VICTIM) as victim:
        await wait_status(victim, settled)

        async def saturate(until):
            # Far more slow calls than slots, for as long as the victim calls.
            while time.monotonic() < until:
                r = await noisy.call_tool("tc__slow", {"ms": 4000})
                noisy_codes.append(error_code(r) if r.is_error else "ok")

        until = time.monotonic() + 7
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(saturate, until)
            await anyio.sleep(0.5)  # the noisy principal holds its slots first
            for i in range(20):
                r = await victim.call_tool("tc__add", {"a": i, "b": 1})
                victim_results.append(error_code(r) if r.is_error else r.content[0].text)
                await anyio.sleep(0.25)
        status = structured(await victim.call_tool("multiplexer_status", {}))["children"]["tc"]
    print("victim:", victim_results)
    print("noisy:", {c: noisy_codes.count(c) for c in set(noisy_codes)})
    assert victim_results == [str(i + 1) for i in range(20)], victim_results
    assert status["breaker"] == "closed", status
    assert status["max_concurrency"] == 4
    # The noisy principal really saturated its share: its calls timed out, queued out or failed fast on its own
    # breaker, and none of that reached the other principal.
    assert noisy_codes.count("child-call-timeout") >= 3, noisy_codes
    assert set(noisy_codes) <= {"child-call-timeout", "child-busy", "child-circuit-open"}, noisy_codes


def request_log_calls(log, tool):
    return [line for line in log.read_text().splitlines() if line == f"tools/call {tool}"]


@pytest.mark.parametrize("path", ["hot", "typed"])
async def test_crash_retry_under_hold_answers_drift_pending_and_never_reaches_the_changed_child(
        path, write_fleet, http_gateway, tmp_path):
    log, schema = tmp_path / "requests.log", tmp_path / "schema"
    # `add` is read-only; the child dies on its first call; its restart serves a changed `add` schema.
    config = write_fleet({"tc": child_entry("--schema-file", str(schema), "--exit-after", "1", "--request-log",
                                            str(log), expose="eager", driftPolicy="hold")})
    gw = start(http_gateway, config, "--state-dir", str(tmp_path / "state"))
    # A 2025 client's call of a loaded tool takes the raw hot path; a 2026 client's the typed path.
    async with client(gw, VICTIM, mode="legacy" if path == "hot" else "2026-07-28") as c:
        await wait_status(c, lambda ch: ch["tc"]["state"] == "up" and (ch["tc"]["drift"] or {}).get("state") == "approved")
        before = hot_calls(gw)
        r = await c.call_tool("tc__add", {"a": 1, "b": 2})
        assert error_code(r) == "drift-pending", r
        if path == "hot":
            assert hot_calls(gw) == before + 1, "the hot path served the call"
        else:
            assert hot_calls(gw) == before, "the typed path served the call"
        status = structured(await c.call_tool("multiplexer_status", {}))["children"]["tc"]
        assert status["connection_generation"] == 2, status
        assert status["drift"]["state"] == "drift-pending" and status["drift"]["diff"]["schema_changed"] == ["add"]
    # The first process received the call (and died on it); the restarted, changed one never did.
    assert len(request_log_calls(log, "add")) == 1, log.read_text()
    assert log.read_text().count("initialize") >= 2, log.read_text()


async def test_a_read_only_call_is_still_retried_when_the_restarted_child_is_unchanged(write_fleet, http_gateway,
                                                                                     tmp_path):
    log = tmp_path / "requests.log"
    config = write_fleet({"tc": child_entry("--exit-after", "1", "--request-log", str(log), expose="eager",
                                            driftPolicy="hold")})
    gw = start(http_gateway, config, "--state-dir", str(tmp_path / "state"))
    async with client(gw, VICTIM) as c:
        await wait_status(c, settled)
        r = await c.call_tool("tc__add", {"a": 1, "b": 2})
        # Retried on the unchanged restarted child (which dies on its first call too: the retry is not retried).
        assert error_code(r) == "child-transport-closed", r
    assert len(request_log_calls(log, "add")) == 2, log.read_text()


async def test_a_failing_prompts_listing_keeps_the_tools_and_fails_only_an_explicit_refresh(write_fleet,
                                                                                           http_gateway):
    config = write_fleet({"tc": child_entry("--fail-prompts", maxRestarts=0)})
    gw = start(http_gateway, config)
    async with client(gw, ADMIN) as c:
        status = await wait_status(c, settled, timeout=20)
        tc = status["children"]["tc"]
        assert tc["state"] == "up", tc
        assert tc["tool_count"] > 0 and tc["last_error"] is None, tc
        assert tc["unavailable_families"]["prompts"]["code"] == "catalog-list-failed", tc
        assert "resources" not in tc["unavailable_families"]
        # The tools are findable and callable.
        found = structured(await c.call_tool("find_tools", {"query": "add two numbers"}))
        assert any(r.get("server") == "tc" and r.get("tool") == "add" for r in found["results"]), found
        structured(await c.call_tool("load_tools", {"tools": ["tc__add"]}))
        r = await c.call_tool("tc__add", {"a": 2, "b": 3})
        assert r.content[0].text == "5", r
        row = structured(await c.call_tool("list_catalog", {"server": "tc"}))["server"]
        assert row["unavailable_families"]["prompts"]["code"] == "catalog-list-failed", row
        assert row["prompt_count"] == 0 and row["resource_count"] >= 1
        # The REST status says the same.
        code, rest_status = gw.json("GET", "/api/mcp/status", ADMIN)
        assert code == 200
        assert rest_status["children"]["tc"]["unavailable_families"]["prompts"]["code"] == "catalog-list-failed"
        # An explicit refresh calls the candidate incomplete (and changes nothing).
        ident = structured(await c.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        refresh = {"request_id": "refresh-prompts-1", "expected_config_revision": ident["config_revision"],
                   "expected_catalog_generation": ident["catalog_generation"],
                   "expected_snapshot_digest": ident["snapshot_digest"], "deadline_ms": 10000}
        code, body = gw.json("POST", "/api/mcp/catalog/refresh", ADMIN, refresh)
        assert code == 409 and body["code"] == "catalog-snapshot-incomplete", (code, body)
        assert "prompts" in body.get("detail", body.get("message", "")) or "prompts" in str(body), body
        r = await c.call_tool("catalog_refresh", {**refresh, "request_id": "refresh-prompts-2"})
        assert "catalog-snapshot-incomplete" in str(r.structured_content or r.content[0].text), r
        assert structured(await c.call_tool("multiplexer_status", {}))["children"]["tc"]["state"] == "up"


async def test_a_family_that_fails_on_a_relist_keeps_the_child_up_with_its_new_tools(write_fleet, http_gateway):
    # prompts list at boot and fail from the 2nd listing on; `grow` adds a tool and announces list_changed.
    config = write_fleet({"tc": child_entry("--fail-prompts-after", "1", expose="eager")})
    gw = start(http_gateway, config)
    async with client(gw, ADMIN) as c:
        status = await wait_status(c, settled)
        assert "unavailable_families" not in status["children"]["tc"] or \
            status["children"]["tc"]["unavailable_families"] is None
        structured_or_text = await c.call_tool("tc__grow", {})
        assert not structured_or_text.is_error, structured_or_text
        # The relist after list_changed fails prompts: before, the child went `failed` (schema-refresh-failed).
        status = await wait_status(c, lambda ch: (ch["tc"].get("unavailable_families") or {}).get("prompts"),
                                   timeout=20)
        tc = status["children"]["tc"]
        assert tc["state"] == "up" and tc["last_error"] is None, tc
        assert tc["unavailable_families"]["prompts"]["code"] == "catalog-list-failed"
        # The view is rebuilt after the child's catalog (and its status) changed: give it a moment.
        for _ in range(100):
            tools = {t.name for t in (await c.list_tools()).tools}
            if any(n.startswith("tc__grown") for n in tools):
                break
            await anyio.sleep(0.1)
        assert any(n.startswith("tc__grown") for n in tools), tools
        assert (await c.call_tool("tc__echo", {"text": "still"})).content[0].text == "still"
