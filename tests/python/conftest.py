"""Shared fixtures: the real graph-os binary, the real test child, real third-party peers."""
import json
import os
import pathlib
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug"
PEERS = pathlib.Path(os.environ.get("PEERS", ROOT / ".peers"))
GRAPH_OS = TARGET / "graph-os"
TESTCHILD = TARGET / "graph-os-testchild"
PYTHON = PEERS / "venv" / "bin" / "python"
EVERYTHING = PEERS / "node" / "node_modules" / ".bin" / "mcp-server-everything"
TINY = ROOT / "tests" / "peers" / "tiny_server.py"
META_TOOLS = ["find_tools", "list_catalog", "load_tools", "unload_tools", "multiplexer_status"]


def pytest_configure(config):
    for path in (GRAPH_OS, TESTCHILD):
        if not path.exists():
            raise pytest.UsageError(f"{path} is missing: run `cargo build --workspace` first")
    for path in (PYTHON, EVERYTHING):
        if not path.exists():
            raise pytest.UsageError(f"{path} is missing: run scripts/install-peers.sh first")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def write_fleet(tmp_path):
    """Writes an mcpServers document and returns its path."""

    def write(servers, name="fleet.json"):
        path = tmp_path / name
        path.write_text(json.dumps({"mcpServers": servers}, indent=2))
        return path

    return write


def child_entry(*args, **extra):
    return {"command": str(TESTCHILD), "args": list(args), **extra}


def structured(result):
    assert not result.is_error, result
    return result.structured_content


async def wait_status(client, predicate, timeout=60.0):
    """Polls multiplexer_status until predicate(children) holds; returns the status."""
    deadline = time.monotonic() + timeout
    while True:
        status = structured(await client.call_tool("multiplexer_status", {}))
        if predicate(status["children"]):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"status never satisfied the condition: {json.dumps(status, indent=1)}")
        import anyio

        await anyio.sleep(0.2)


def settled(children):
    return all(c["state"] in ("up", "failed") for c in children.values())
