"""Shared fixtures: the real graph-os binary, the real test child, real third-party peers."""
import json
import os
import pathlib
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# GRAPH_OS_PROFILE=release runs the suite against release binaries (acceptance numbers).
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / os.environ.get("GRAPH_OS_PROFILE", "debug")
PEERS = pathlib.Path(os.environ.get("PEERS", ROOT / ".peers"))
GRAPH_OS = TARGET / "graph-os"
TESTCHILD = TARGET / "graph-os-testchild"
PYTHON = PEERS / "venv" / "bin" / "python"
EVERYTHING = PEERS / "node" / "node_modules" / ".bin" / "mcp-server-everything"
TINY = ROOT / "tests" / "peers" / "tiny_server.py"
META_TOOLS = ["find_tools", "list_catalog", "load_tools", "unload_tools", "multiplexer_status", "catalog_refresh",
              "catalog_dispatch", "fleet_graph"]


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


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_headers(args, env):
    """An Authorization header with a `--token SCOPE=env://NAME` token the gateway was given."""
    args = list(args)
    for flag, spec in zip(args, args[1:]):
        if flag == "--token" and "=env://" in spec:
            name = spec.split("=env://", 1)[1]
            if env and env.get(name):
                return {"Authorization": f"Bearer {env[name]}"}
    return {}


class HttpGateway:
    """A real graph-os process serving streamable HTTP on a free loopback port."""

    def __init__(self, config, extra_args=(), env=None):
        import subprocess

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.base = f"http://127.0.0.1:{self.port}"
        self.stderr_path = config.parent / f"gateway-{self.port}.log"
        self.stderr = open(self.stderr_path, "w")
        # "{port}" in an argument stands for the port chosen here (e.g. an OAuth audience URL).
        extra_args = [a.replace("{port}", str(self.port)) for a in extra_args]
        self.operator = operator_headers(extra_args, env)
        self.proc = subprocess.Popen(
            [str(GRAPH_OS), "--transport", "streamable-http", "--port", str(self.port), "--config", str(config), *extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr, env=env,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.get("/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"gateway did not start: {self.stderr_path.read_text()}")
            time.sleep(0.05)

    def get(self, path, headers=None):
        """GET `path`: as an operator (a configured token of the discover scope or above, which
        /metrics and /readyz's details need) unless `headers` are given (`{}`: anonymous)."""
        if headers is None:
            headers = self.operator
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def json(self, method, path, token=None, body=None):
        """One JSON request to the admin API: (status, decoded body)."""
        import urllib.error
        import urllib.request

        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.base + path, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def stop(self):
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except Exception:
                self.proc.kill()
        self.stderr.close()
        return self.proc.returncode


@pytest.fixture
def http_gateway():
    started = []

    def start(config, *extra_args, env=None):
        gw = HttpGateway(config, extra_args, env=env)
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


def error_code(result):
    """The stable graph-os code of a tool-error result."""
    assert result.is_error, result
    return result.content[0].text.split(":", 1)[0]


class ListChangedCounter:
    """Counts `notifications/tools/list_changed` a client receives (use `.handler` as message_handler)."""

    def __init__(self):
        self.count = 0

    async def handler(self, message):
        from mcp import types

        if isinstance(message, types.ToolListChangedNotification) or getattr(message, "method", "") == "notifications/tools/list_changed":
            self.count += 1


OAUTH_AS = ROOT / "tests" / "peers" / "oauth_as.py"


@pytest.fixture
def oauth_as(tmp_path):
    """A real local OAuth 2.1 authorization server (tests/peers/oauth_as.py): its issuer URL."""
    import subprocess

    proc = subprocess.Popen([str(PYTHON), str(OAUTH_AS), "--port", "0", "--audience", "http://127.0.0.1:9/default",
                             "--keys-dir", str(tmp_path / "keys")],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "oauth_as.log", "w"), text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    yield f"http://127.0.0.1:{int(line.split()[1])}"
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
