"""Transparent mode: a child with prefix "" and expose eager gets the names and URIs graph-os does
not list (its own answer or error comes back), within the fleet's filters and the drift guard."""
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from conftest import GRAPH_OS, child_entry, settled, wait_status

pytestmark = pytest.mark.anyio


def gateway(config, state):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config), "--state-dir", str(state)])


async def test_a_transparent_child_gets_what_graph_os_does_not_list(write_fleet, tmp_path):
    log = tmp_path / "requests.log"
    config = write_fleet({"tc": child_entry("--request-log", str(log), prefix="", expose="eager",
                                            disabledTools=["env_get"])})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as c:
        await wait_status(c, settled)
        listed = {t.name for t in (await c.list_tools()).tools}
        assert "add" in listed and "gen_0042" not in listed and "env_get" not in listed
        # Not listed, served by the child: forwarded unchanged.
        r = await c.call_tool("gen_0042", {})
        assert not r.is_error, r
        # Unknown to the child too: its own error comes back.
        with pytest.raises(MCPError, match="Unknown tool: no_such_tool"):
            await c.call_tool("no_such_tool", {})
        with pytest.raises(MCPError, match="no resource test://unlisted"):
            await c.read_resource("test://unlisted")
        with pytest.raises(MCPError, match="unknown prompt nope"):
            await c.get_prompt("nope")
        # disabledTools still apply: never forwarded.
        with pytest.raises(MCPError, match="Unknown tool: env_get"):
            await c.call_tool("env_get", {"name": "HOME"})
    seen = log.read_text().splitlines()
    assert "tools/call gen_0042" in seen and "tools/call no_such_tool" in seen
    assert "resources/read" in seen and "prompts/get" in seen
    assert "tools/call env_get" not in seen


async def test_with_two_transparent_children_nothing_unlisted_is_forwarded(write_fleet, tmp_path):
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    config = write_fleet({
        "a": child_entry("--request-log", str(logs[0]), prefix="", expose="eager"),
        "b": child_entry("--request-log", str(logs[1]), "--gen-prefix", "other", prefix="", expose="eager"),
    })
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as c:
        await wait_status(c, settled)
        with pytest.raises(MCPError, match="Unknown tool: gen_0042"):
            await c.call_tool("gen_0042", {})
    for log in logs:
        assert "tools/call gen_0042" not in log.read_text().splitlines()


async def test_a_transparent_child_held_by_the_drift_guard_gets_nothing_unlisted(write_fleet, tmp_path):
    describe, log, state = tmp_path / "describe.txt", tmp_path / "requests.log", tmp_path / "state"
    describe.write_text("approved wording")
    entry = child_entry("--describe-file", str(describe), "--request-log", str(log), prefix="", expose="eager",
                        driftPolicy="hold")
    config = write_fleet({"tc": entry})
    async with Client(gateway(config, state), mode="legacy") as c:
        await wait_status(c, settled)
        assert not (await c.call_tool("gen_0042", {})).is_error
    describe.write_text("changed wording")
    async with Client(gateway(config, state), mode="legacy") as c:
        await wait_status(c, lambda ch: (ch["tc"].get("drift") or {}).get("state") == "drift-pending")
        with pytest.raises(MCPError, match="Unknown tool: gen_0043"):
            await c.call_tool("gen_0043", {})
        # Approved, listed tools still work under hold.
        r = await c.call_tool("echo", {"text": "hi"})
        assert not r.is_error and r.content[0].text == "hi"
    assert "tools/call gen_0043" not in log.read_text().splitlines()
