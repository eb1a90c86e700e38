"""Real clients at their default settings: pydantic-ai's `MCPToolset` (built on FastMCP's client,
which speaks 2026-07-28 by default and caches `tools/list` until it sees
`notifications/tools/list_changed` while a request is in flight) sees the tools it loads and
unloads through graph-os, over stdio and over streamable HTTP."""
import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai.mcp import MCPToolset

from conftest import GRAPH_OS, child_entry

pytestmark = pytest.mark.anyio


async def names(toolset):
    return {t.name for t in await toolset.list_tools()}


async def load_call_unload(toolset):
    async with toolset:
        assert "tc__add" not in await names(toolset)
        loaded = await toolset.direct_call_tool("load_tools", {"tools": ["tc__add"]})
        assert loaded["loaded"] == ["tc__add"], loaded
        # The cached list was invalidated by the notification on the load_tools response.
        assert "tc__add" in await names(toolset)
        assert await toolset.direct_call_tool("tc__add", {"a": 2, "b": 3}) in (5, {"result": 5}, "5")
        unloaded = await toolset.direct_call_tool("unload_tools", {"tools": ["tc__add"]})
        assert unloaded["unloaded"] == ["tc__add"], unloaded
        assert "tc__add" not in await names(toolset)


async def test_pydantic_ai_sees_loaded_and_unloaded_tools_over_http(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({"tc": child_entry()}))
    await load_call_unload(MCPToolset(gw.url))


async def test_pydantic_ai_sees_loaded_and_unloaded_tools_over_stdio(write_fleet, tmp_path):
    config = write_fleet({"tc": child_entry()})
    transport = StdioTransport(str(GRAPH_OS), ["--config", str(config), "--state-dir", str(tmp_path / "state")])
    await load_call_unload(MCPToolset(transport))
