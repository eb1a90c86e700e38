"""find_tools ranking tiers through the real gateway: ranker identity, fallback, vector cache reuse."""
import os
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, child_entry, settled, structured, wait_status

pytestmark = pytest.mark.anyio


def gateway(config, state, env=None):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config), "--state-dir", str(state)],
                                 env={**os.environ, **(env or {})})


async def vectors_ready(client, timeout=60.0):
    """Polls multiplexer_status until every child's vectors are installed; returns the discovery facts."""
    deadline = time.monotonic() + timeout
    while True:
        status = structured(await client.call_tool("multiplexer_status", {}))
        d = status["discovery"]
        if settled(status["children"]) and not d["models_loading"] and d["vectors_pending"] == 0:
            return status
        assert time.monotonic() < deadline, status
        await anyio.sleep(0.1)


async def test_default_tier_is_static_and_ranks(write_fleet, tmp_path):
    config = write_fleet({"calc": child_entry(), "other": child_entry()})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        await wait_status(client, settled)
        status = await vectors_ready(client)
        assert status["ranker"] == "static"
        assert status["discovery"]["model"] == "potion-base-2M"
        found = structured(await client.call_tool("find_tools", {"query": "add two numbers", "top_k": 3}))
        assert found["ranker"] == "static"
        assert found["results"][0]["tool"] == "add", found
        assert 0.0 <= found["results"][0]["score"] <= 1.0


async def test_ranker_cap_falls_back_to_lexical(write_fleet, tmp_path):
    config = write_fleet({"calc": child_entry()})
    async with Client(gateway(config, tmp_path / "state", {"GRAPH_OS_RANKER": "lexical"}), mode="legacy") as client:
        await wait_status(client, settled)
        status = await vectors_ready(client)
        assert status["ranker"] == "lexical"
        found = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))
        assert found["ranker"] == "lexical"
        assert found["results"][0]["tool"] == "add"


async def test_restart_reuses_cached_vectors_and_a_changed_child_recomputes_alone(write_fleet, tmp_path):
    # `--schema-file` makes the child change its `add` tool on every start; `plain` never changes.
    config = write_fleet({"changing": child_entry("--schema-file", str(tmp_path / "schema")),
                          "plain": child_entry()})
    state = tmp_path / "state"
    async with Client(gateway(config, state), mode="legacy") as client:
        first = (await vectors_ready(client))["discovery"]
    assert first["vectors_computed"] == first["documents"] > 0
    assert first["vectors_reused"] == 0
    assert list((state / "discovery" / "vectors" / "potion-base-2M").glob("*.vec"))

    async with Client(gateway(config, state), mode="legacy") as client:
        second = (await vectors_ready(client))["discovery"]
        found = structured(await client.call_tool("find_tools", {"query": "add two numbers", "top_k": 2}))
        assert found["ranker"] == "static"
    # Only the changed tool of the changed child is embedded again.
    assert second["documents"] == first["documents"]
    assert second["vectors_computed"] == 1, second
    assert second["vectors_reused"] == first["documents"] - 1
