"""Catalog generations: refresh, dispatch, projection, replica cohort and the REST twin."""
import json
import os
import shutil
import subprocess
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import ListChangedCounter as Notes, GRAPH_OS, child_entry, settled, structured, wait_status

pytestmark = pytest.mark.anyio


def gateway(config, state, *extra, env=None):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config), "--state-dir", str(state), *extra], env=env)


async def identity(client, timeout=20.0):
    """The served identity once the startup reconciliation has published generation ≥ 1."""
    deadline = time.monotonic() + timeout
    while True:
        ident = structured(await client.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        if ident["catalog_generation"] >= 1 or time.monotonic() > deadline:
            return ident
        await anyio.sleep(0.2)


def refresh_args(ident, **over):
    return {"request_id": "req-1", "expected_config_revision": ident["config_revision"],
            "expected_catalog_generation": ident["catalog_generation"], "expected_snapshot_digest": ident["snapshot_digest"],
            "deadline_ms": 10000, **over}


RESULT_FIELDS = {"request_id", "served_instance_id", "release_id", "config_revision", "catalog_generation",
                 "snapshot_digest", "changed", "reingestion_state", "reconciliation_receipt_digest"}
ERROR_FIELDS = {"request_id", "code", "retryable", "catalog_generation", "snapshot_digest"}


def code_of(result):
    assert result.is_error, result
    assert set(result.structured_content) == ERROR_FIELDS, result.structured_content
    return result.structured_content["code"]


async def test_refresh_wire_codes_and_changes(write_fleet, tmp_path):
    version = tmp_path / "version"
    config = write_fleet({"vary": child_entry("--schema-file", str(version), "--exit-after", "2"), "ok": child_entry()})
    state = tmp_path / "state"
    async with Client(gateway(config, state), mode="legacy") as client:
        await wait_status(client, settled)
        ident = await identity(client)
        assert ident["catalog_generation"] == 1

        unchanged = structured(await client.call_tool("catalog_refresh", refresh_args(ident)))
        assert set(unchanged) == RESULT_FIELDS
        assert (unchanged["changed"], unchanged["catalog_generation"], unchanged["snapshot_digest"]) == \
            (False, 1, ident["snapshot_digest"])

        assert code_of(await client.call_tool("catalog_refresh", {**refresh_args(ident), "extra": 1})) == "refresh-request-schema-mismatch"
        assert code_of(await client.call_tool("catalog_refresh", refresh_args(ident, deadline_ms=0))) == "refresh-request-schema-mismatch"
        assert code_of(await client.call_tool("catalog_refresh", refresh_args(ident, expected_config_revision="x"))) == "config-revision-stale"
        assert code_of(await client.call_tool("catalog_refresh", refresh_args(ident, expected_catalog_generation=9))) == "catalog-generation-stale"
        assert code_of(await client.call_tool("catalog_refresh", refresh_args(ident, expected_snapshot_digest="0" * 64))) == "catalog-digest-mismatch"

        # change one child's schema: it dies on its 2nd call and comes back with a new schema
        structured(await client.call_tool("load_tools", {"tools": ["vary__slow"]}))
        for _ in range(2):
            await client.call_tool("vary__slow", {"ms": 1})
        await wait_status(client, lambda ch: ch["vary"]["state"] == "up" and ch["vary"]["connection_generation"] == 2, timeout=20)
        changed = structured(await client.call_tool("catalog_refresh", refresh_args(ident, request_id="req-2")))
        assert changed["changed"] is True and changed["catalog_generation"] == 2
        assert changed["snapshot_digest"] != ident["snapshot_digest"]
        assert len(changed["reconciliation_receipt_digest"]) == 64
        diff = structured(await client.call_tool("fleet_graph", {"diff": [1, 2]}))
        assert "tool:vary__add" in diff["changed"], diff
        who = structured(await client.call_tool("fleet_graph", {"servers_providing": "Echo the given text"}))
        assert set(who["servers"]) == {"ok", "vary"}


async def test_failures_publish_nothing(write_fleet, tmp_path):
    config = write_fleet({"slow": child_entry("--slow-list-ms", "1500"), "ok": child_entry()})
    state = tmp_path / "state"
    async with Client(gateway(config, state), mode="legacy") as client:
        await wait_status(client, settled)
        ident = await identity(client)
        before = sorted(os.listdir(state))
        assert code_of(await client.call_tool("catalog_refresh", refresh_args(ident, deadline_ms=300))) == "refresh-deadline-exceeded"
        again = structured(await client.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        assert again == ident
        assert sorted(os.listdir(state)) == before


async def test_a_family_that_fails_to_list_during_a_refresh_is_incomplete(write_fleet, tmp_path):
    # "broken" lists at boot (so it is expected to answer) and fails its prompts at the refresh.
    config = write_fleet({"ok": child_entry(), "broken": child_entry("--fail-prompts-after", "1")})
    state = tmp_path / "state"
    async with Client(gateway(config, state), mode="legacy") as client:
        await wait_status(client, settled)
        ident = await identity(client)
        record = (state / "generation.json").read_text()
        assert code_of(await client.call_tool("catalog_refresh", refresh_args(ident))) == "catalog-snapshot-incomplete"
        assert (state / "generation.json").read_text() == record, "nothing published"


async def test_projection_failure_is_reingestion_unreconciled(write_fleet, tmp_path):
    config = write_fleet({"v": child_entry("--vary-each-list")})
    state = tmp_path / "state"
    async with Client(gateway(config, state), mode="legacy") as client:
        await wait_status(client, settled)
        ident = await identity(client)
        record = (state / "generation.json").read_text()
        (state / "projection.sqlite").unlink()
        (state / "projection.sqlite").mkdir()
        assert code_of(await client.call_tool("catalog_refresh", refresh_args(ident))) == "reingestion-unreconciled"
        assert (state / "generation.json").read_text() == record, "nothing published"
        after = structured(await client.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        assert after["catalog_generation"] == ident["catalog_generation"] and after["snapshot_digest"] == ident["snapshot_digest"]


async def test_dispatch_contract_and_unknown_tool_retry(write_fleet, tmp_path):
    config = write_fleet({
        "ro": child_entry("--unknown-once", "add"),
        "rw": child_entry("--unknown-once", "slow"),
    })
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        await wait_status(client, settled)
        ident = await identity(client)
        base = {"expected_catalog_generation": ident["catalog_generation"], "expected_snapshot_digest": ident["snapshot_digest"]}
        ok = await client.call_tool("catalog_dispatch", {"tool_name": "ro__add", "arguments": {"a": 2, "b": 5}, **base})
        assert not ok.is_error and ok.content[0].text == "7", "read-only Unknown-tool answer relisted and retried once"
        rw = await client.call_tool("catalog_dispatch", {"tool_name": "rw__slow", "arguments": {"ms": 1}, **base})
        assert rw.is_error and "Unknown tool" in rw.content[0].text, "non-read-only tools are not retried"
        assert code_of(await client.call_tool("catalog_dispatch", {"tool_name": "ro__add", "arguments": {}, **base,
                                                                   "expected_catalog_generation": 99})) == "catalog-generation-stale"
        assert code_of(await client.call_tool("catalog_dispatch", {"tool_name": "ro__add", "arguments": {}, **base,
                                                                   "expected_snapshot_digest": "1" * 64})) == "catalog-digest-mismatch"
        assert code_of(await client.call_tool("catalog_dispatch", {"tool_name": "ro__nope", "arguments": {}, **base})) == "dispatcher-target-not-visible"
        # a changed schema is not retried
    config2 = write_fleet({"vs": child_entry("--unknown-once", "add", "--vary-add-schema")}, name="fleet2.json")
    async with Client(gateway(config2, tmp_path / "state2"), mode="legacy") as client:
        await wait_status(client, settled)
        ident = await identity(client)
        r = await client.call_tool("catalog_dispatch", {"tool_name": "vs__add", "arguments": {"a": 1, "b": 1},
                                                        "expected_catalog_generation": ident["catalog_generation"],
                                                        "expected_snapshot_digest": ident["snapshot_digest"]})
        assert r.is_error and "Unknown tool" in r.content[0].text, "relisted schema differs: no retry"


async def test_three_replicas_share_a_state_dir(write_fleet, tmp_path):
    config = write_fleet({"v": child_entry("--vary-each-list")})
    state = tmp_path / "state"
    published = []
    async with Client(gateway(config, state, "--replica-id", "a"), mode="legacy") as a, \
            Client(gateway(config, state, "--replica-id", "b"), mode="legacy") as b, \
            Client(gateway(config, state, "--replica-id", "c"), mode="legacy") as c:
        for cl in (a, b, c):
            await wait_status(cl, settled)
        await anyio.sleep(6)  # heartbeats written

        async def rounds(cl, n):
            for i in range(n):
                ident = structured(await cl.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
                r = await cl.call_tool("catalog_refresh", refresh_args(ident, request_id=f"r{i}"))
                if not r.is_error and r.structured_content["changed"]:
                    published.append((r.structured_content["catalog_generation"], r.structured_content["snapshot_digest"]))

        async with anyio.create_task_group() as tg:
            for cl in (a, b, c):
                tg.start_soon(rounds, cl, 200)
    by_generation = {}
    for g, d in published:
        by_generation.setdefault(g, set()).add(d)
    print(f"{len(published)} publications/adoptions over {len(by_generation)} generations")
    assert len(by_generation) > 10
    assert all(len(ds) == 1 for ds in by_generation.values()), {g: ds for g, ds in by_generation.items() if len(ds) > 1}


async def test_a_divergent_replica_blocks_publication_until_it_converges(write_fleet, tmp_path):
    config = write_fleet({"v": child_entry("--vary-each-list")})
    other = write_fleet({"v": child_entry("--vary-each-list"), "extra": child_entry()}, name="other.json")
    state = tmp_path / "state"
    async with Client(gateway(config, state, "--replica-id", "a"), mode="legacy") as a, \
            Client(gateway(other, state, "--replica-id", "z"), mode="legacy") as z:
        await wait_status(a, settled)
        await wait_status(z, settled)
        await anyio.sleep(6)
        ident = structured(await a.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
        assert code_of(await a.call_tool("catalog_refresh", refresh_args(ident))) == "replica-generation-divergent"
        other.write_text(config.read_text())  # the divergent replica converges (hot reload)
        deadline = time.monotonic() + 30
        while True:
            await anyio.sleep(1)
            ident = structured(await a.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]
            r = await a.call_tool("catalog_refresh", refresh_args(ident))
            if not r.is_error:
                break
            assert time.monotonic() < deadline, r.structured_content
        assert r.structured_content["changed"] is True


async def test_rest_twin_auth_and_parity(write_fleet, tmp_path, http_gateway):
    config = write_fleet({"tc": child_entry()})
    env = {**os.environ, "ADMIN_TOKEN": "admin-secret-token-123456", "READ_TOKEN": "read-secret-token-123456"}
    gw = http_gateway(config, "--state-dir", str(tmp_path / "state"), "--token", "manage=env://ADMIN_TOKEN",
                      "--token", "discover=env://READ_TOKEN", env=env)

    call = gw.json

    deadline = time.monotonic() + 20
    while call("GET", "/api/mcp/catalog?include_tools=false", "read-secret-token-123456")[1]["catalog_identity"]["catalog_generation"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert call("GET", "/api/mcp/status")[0] == 401
    assert call("GET", "/api/mcp/status", "wrong-token")[0] == 401
    code, catalog = call("GET", "/api/mcp/catalog", "read-secret-token-123456")
    assert code == 200
    ident = catalog["catalog_identity"]
    assert call("POST", "/api/mcp/catalog/refresh", "read-secret-token-123456", refresh_args(ident))[0] == 403
    code, body = call("POST", "/api/mcp/catalog/refresh", "admin-secret-token-123456", refresh_args(ident, expected_catalog_generation=42))
    assert code == 409 and body["code"] == "catalog-generation-stale" and set(body) == ERROR_FIELDS
    code, rest_result = call("POST", "/api/mcp/catalog/refresh", "admin-secret-token-123456", refresh_args(ident))
    assert code == 200 and rest_result["changed"] is False
    code, spec = call("GET", "/api/mcp/openapi.json")
    assert code == 200 and spec["openapi"].startswith("3.1") and "/api/mcp/catalog/refresh" in spec["paths"]
    from openapi_spec_validator import validate

    validate(spec)  # raises on an invalid OpenAPI document
    from mcp.client.streamable_http import streamable_http_client
    import httpx2

    http = httpx2.AsyncClient(headers={"Authorization": "Bearer admin-secret-token-123456"}, timeout=30)
    async with Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as client:
        mcp_catalog = structured(await client.call_tool("list_catalog", {}))
        mcp_status = structured(await client.call_tool("multiplexer_status", {}))
        mcp_refresh = structured(await client.call_tool("catalog_refresh", refresh_args(ident)))
        mcp_stale = (await client.call_tool("catalog_refresh", refresh_args(ident, expected_catalog_generation=42))).structured_content
    # The exact twin for the same caller (the fleet file's path is shown to manage callers only).
    assert mcp_catalog == call("GET", "/api/mcp/catalog", "admin-secret-token-123456")[1]
    assert call("GET", "/api/mcp/catalog", "read-secret-token-123456")[1]["config"]["source"] is None
    rest_status = call("GET", "/api/mcp/status", "read-secret-token-123456")[1]
    assert mcp_status["catalog_identity"] == rest_status["catalog_identity"]
    assert set(mcp_status["children"]) == set(rest_status["children"])
    assert mcp_refresh == rest_result | {"request_id": mcp_refresh["request_id"]}
    assert mcp_stale == body
    # With tokens configured an anonymous MCP caller never gets in (401, see test_trust.py); a
    # discover token gets in and is refused the admin tool.
    reader = httpx2.AsyncClient(headers={"Authorization": "Bearer read-secret-token-123456"}, timeout=30)
    async with Client(streamable_http_client(gw.url, http_client=reader), mode="legacy") as discover:
        denied = await discover.call_tool("catalog_refresh", refresh_args(ident))
        assert code_of(denied) == "authorization-denied"
    assert "admin-secret-token-123456" not in gw.stderr_path.read_text()




async def test_refresh_that_finds_a_changed_schema_notifies_only_affected_sessions(write_fleet, tmp_path, http_gateway):
    # "vary" changes add's schema on every listing without announcing it: only a refresh finds out.
    config = write_fleet({"vary": child_entry("--vary-add-schema"), "ok": child_entry()})
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    env = {**os.environ, "T_ADMIN": "admin-token-abcdefghijkl"}
    gw = http_gateway(config, "--state-dir", str(tmp_path / "state"), "--token", "manage=env://T_ADMIN",
                      "--anonymous-scope", "delegate", env=env)
    a, b = Notes(), Notes()
    admin = httpx2.AsyncClient(headers={"Authorization": "Bearer admin-token-abcdefghijkl"}, timeout=30)
    async with Client(streamable_http_client(gw.url, http_client=admin), mode="legacy", message_handler=a.handler) as ca, \
            Client(gw.url, mode="legacy", message_handler=b.handler) as cb:
        await wait_status(ca, settled)
        ident = await identity(ca)
        structured(await ca.call_tool("load_tools", {"tools": ["vary__add"]}))
        structured(await cb.call_tool("load_tools", {"tools": ["ok__add"]}))
        await anyio.sleep(0.3)
        a.count = b.count = 0
        r = structured(await ca.call_tool("catalog_refresh", refresh_args(ident)))
        assert r["changed"] and r["catalog_generation"] == ident["catalog_generation"] + 1
        await anyio.sleep(0.5)
        assert (a.count, b.count) == (1, 0)
