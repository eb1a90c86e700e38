"""Fleet file compatibility, served: the configuration files of Claude Desktop, Claude Code, Cursor,
VS Code, Windsurf and Cline (tests/fixtures/client-configs, written from each client's documentation,
cited in the README there) are given to a real graph-os unchanged; every child starts, its tools
load and are listed, secrets given by reference reach the child and nothing else, and a VS Code
`${input:ID}` without GRAPH_OS_INPUT_<ID> fails that child closed with `secret-unavailable`.
Validation of the same files is tests/config_compat.rs."""
import contextlib
import json
import os
import subprocess
import time

import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, ROOT, TESTCHILD, free_port, settled, structured, wait_status

pytestmark = pytest.mark.anyio

FIXTURES = ROOT / "tests" / "fixtures" / "client-configs"
CANARIES = {
    "GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_CANARY_desktop_51d2",
    "API_KEY": "CANARY_claude_code_77a1",
    "CURSOR_REMOTE_TOKEN": "CANARY_cursor_3c9e",
    "WINDSURF_API_KEY": "CANARY_windsurf_aa02",
    "CLINE_API_KEY": "CANARY_cline_0b7d",
    "CLINE_REMOTE_TOKEN": "CANARY_cline_remote_e41f",
}


@contextlib.contextmanager
def http_child(tmp_path):
    """The test child over streamable HTTP on a free loopback port (for url / serverUrl entries)."""
    port = free_port()
    proc = subprocess.Popen([str(TESTCHILD), "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "http-child.log", "w"))
    try:
        deadline = time.monotonic() + 10
        import socket
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def environment(tmp_path, port, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPH_OS_INPUT_")}
    env.update(CANARIES)
    env.update({"GRAPH_OS_TESTCHILD": str(TESTCHILD), "HOME": str(tmp_path), "GRAPH_OS_TEST_HTTP_PORT": str(port),
                "API_BASE_URL": f"http://127.0.0.1:{port}", "GRAPH_OS_STATE_DIR": str(tmp_path / "state")})
    env.update(extra)
    return env


def gateway(config, env):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config)], env=env)


async def load_and_list(client, server):
    """load_tools for one server, then tools/list must show its tools under their exposed names."""
    loaded = structured(await client.call_tool("load_tools", {"servers": [server]}))["loaded"]
    echo = [name for name in loaded if name.endswith("__echo")]
    assert echo, loaded
    listed = [t.name for t in (await client.list_tools()).tools]
    assert echo[0] in listed, listed
    return echo[0].rsplit("__", 1)[0]


async def env_of(client, prefix, name):
    result = await client.call_tool(f"{prefix}__env_get", {"name": name})
    assert not result.is_error, result
    return result.content[0].text


# (fixture, servers that must come up, {server: {variable: expected value in the child}})
CASES = [
    ("claude-desktop/claude_desktop_config.json", ["filesystem", "github"],
     {"github": {"GITHUB_PERSONAL_ACCESS_TOKEN": CANARIES["GITHUB_PERSONAL_ACCESS_TOKEN"]}}),
    ("claude-code/.mcp.json", ["shared-server", "api-server"],
     {"shared-server": {"CACHE_DIR": "/tmp/graph-os-cache"}}),
    ("cursor/.cursor/mcp.json", ["local-tools", "remote-server"],
     {"local-tools": {"SERVICE_TOKEN": "from-env-file-0f3a", "LOG_LEVEL": "debug",
                      "PROJECT_ROOT": str(FIXTURES / "cursor")}}),
    ("windsurf/mcp_config.json", ["remote-http-mcp", "local"], {}),
    ("cline/cline_mcp_settings.json", ["local-server", "with-type", "remote-server"],
     {"local-server": {"API_KEY": CANARIES["CLINE_API_KEY"]}}),
]


@pytest.mark.parametrize("fixture,servers,child_env", CASES, ids=[c[0].split("/")[0] for c in CASES])
async def test_a_client_file_serves_unchanged(tmp_path, fixture, servers, child_env):
    with http_child(tmp_path) as port:
        async with Client(gateway(FIXTURES / fixture, environment(tmp_path, port)), mode="legacy") as client:
            status = await wait_status(client, lambda ch: all(ch.get(s, {}).get("state") == "up" for s in servers))
            assert set(status["children"]) == set(servers), status["children"]  # disabled entries never start
            for server in servers:
                prefix = await load_and_list(client, server)
                for name, value in child_env.get(server, {}).items():
                    assert await env_of(client, prefix, name) == value, (server, name)
            shown = json.dumps(structured(await client.call_tool("multiplexer_status", {})))
            shown += json.dumps(structured(await client.call_tool("list_catalog", {})))
            for canary in list(CANARIES.values()) + ["from-env-file-0f3a"]:
                assert canary not in shown
    if fixture.startswith("claude-desktop"):
        # `${HOME}` in args was expanded: the child wrote its request log there.
        assert (tmp_path / "filesystem-requests.log").exists()
    if fixture.startswith("cursor"):
        assert (tmp_path / "cursor-requests.log").exists()  # ${userHome}


async def test_vs_code_inputs_come_from_graph_os_input_variables(tmp_path):
    config = FIXTURES / "vscode" / ".vscode" / "mcp.json"
    secret = "pplx-CANARY-9d1e"
    env = environment(tmp_path, 9, GRAPH_OS_INPUT_PERPLEXITY_KEY=secret)
    async with Client(gateway(config, env), mode="legacy") as client:
        await wait_status(client, lambda ch: ch.get("Perplexity", {}).get("state") == "up"
                          and ch.get("fetch", {}).get("state") == "up")
        prefix = await load_and_list(client, "Perplexity")
        assert await env_of(client, prefix, "PERPLEXITY_API_KEY") == secret
        fetch = await load_and_list(client, "fetch")
        assert await env_of(client, fetch, "WORKSPACE") == str(FIXTURES / "vscode")
        assert secret not in json.dumps(structured(await client.call_tool("multiplexer_status", {})))


async def test_a_vs_code_input_without_its_variable_fails_that_child_closed(tmp_path):
    config = FIXTURES / "vscode" / ".vscode" / "mcp.json"
    async with Client(gateway(config, environment(tmp_path, 9)), mode="legacy") as client:
        status = await wait_status(client, settled)
        assert status["children"]["Perplexity"]["state"] == "failed"
        assert status["children"]["Perplexity"]["last_error"]["code"] == "secret-unavailable"
        assert status["children"]["fetch"]["state"] == "up"
        await load_and_list(client, "fetch")
