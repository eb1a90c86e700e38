"""Replicas that share sessions through Redis, behind a real round-robin load balancer.

Real parts only: Debian's redis-server (with a password, passed to graph-os by reference) and
nginx (round-robin upstream, no affinity), three real graph-os processes, the official Python SDK
client in 2025 and 2026 mode, and the project's test child. Every response carries the replica
that served it (`Graph-Os-Replica`), so the tests prove requests spread over the replicas.
"""
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import HttpGateway, ListChangedCounter, child_entry, error_code, free_port, settled, structured, wait_status

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
HAVE_PARTS = bool(shutil.which("redis-server") and shutil.which("redis-cli") and NGINX)
if not HAVE_PARTS and os.environ.get("GRAPH_OS_REQUIRE_SHARED") == "1":
    raise RuntimeError("redis-server, redis-cli and nginx are required here (scripts/install-peers.sh installs them)")
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not HAVE_PARTS, reason="needs Debian's redis-server and nginx (scripts/install-peers.sh)"),
]

REDIS_PASSWORD = "redis-canary-pw-5f1c9a0e7d"
TOKENS = {"T_DELEGATE": "delegate-canary-token-0123456789", "T_MANAGE": "manage-canary-token-0123456789"}
TOKEN_ARGS = ["--token", "delegate=env://T_DELEGATE", "--token", "manage=env://T_MANAGE"]
DELEGATE, MANAGE = TOKENS["T_DELEGATE"], TOKENS["T_MANAGE"]


class Redis:
    """A real redis-server on a loopback port, stoppable and restartable on the same port."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.dir = tmp_path / "redis"
        self.dir.mkdir()
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), "--requirepass", REDIS_PASSWORD],
            stdout=open(self.dir / "redis.log", "a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while self.cli("PING") != "PONG":
            if time.monotonic() > deadline:
                raise AssertionError((self.dir / "redis.log").read_text())
            time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-p", str(self.port), "--no-auth-warning", "-a", REDIS_PASSWORD, *args],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    def dump(self):
        """Every key and its whole value, as text."""
        out = []
        for key in filter(None, self.cli("--scan").splitlines()):
            kind = self.cli("TYPE", key)
            value = {"hash": ["HGETALL"], "set": ["SMEMBERS"], "zset": ["ZRANGE", key, "0", "-1", "WITHSCORES"],
                     "string": ["GET"]}.get(kind, ["TYPE"])
            args = value if kind == "zset" else [*value, key]
            out.append(f"{key} ({kind}): {self.cli(*args)}")
        return out


class Nginx:
    """Debian's nginx, round-robin over the replicas, no session affinity."""

    def __init__(self, tmp_path, ports, port):
        self.port = port
        self.dir = tmp_path / "nginx"
        self.dir.mkdir()
        servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=30s;" for p in ports)
        conf = self.dir / "nginx.conf"
        conf.write_text(f"""
worker_processes 1;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log {self.dir}/access.log;
  client_body_temp_path {self.dir}/body;
  proxy_temp_path {self.dir}/proxy;
  fastcgi_temp_path {self.dir}/fastcgi;
  uwsgi_temp_path {self.dir}/uwsgi;
  scgi_temp_path {self.dir}/scgi;
  upstream graphos {{
{servers}
  }}
  server {{
    listen 127.0.0.1:{self.port};
    location / {{
      proxy_pass http://graphos;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
      # a replica that is down never received the request: retrying a POST elsewhere is safe
      proxy_next_upstream error timeout non_idempotent;
    }}
  }}
}}
""")
        self.proc = subprocess.Popen([NGINX, "-p", str(self.dir), "-c", str(conf), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr.log", "w"))
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise AssertionError((self.dir / "stderr.log").read_text() + (self.dir / "error.log").read_text())
                time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path, write_fleet):
    """Redis, three graph-os replicas sharing it, nginx in front."""
    redis = Redis(tmp_path)
    fleet = write_fleet({"tc": child_entry()})
    env = {**os.environ, **TOKENS, "REDIS_PW": REDIS_PASSWORD}
    lb_port = free_port()
    replicas = []
    for i in range(3):
        replicas.append(HttpGateway(fleet, [
            "--session-store", f"redis://127.0.0.1:{redis.port}", "--session-store-password", "env://REDIS_PW",
            "--replica-id", f"replica-{i}", "--state-dir", str(tmp_path / f"state-{i}"), *TOKEN_ARGS,
            "--allowed-host", f"127.0.0.1:{lb_port}",
        ], env=env))
    nginx = Nginx(tmp_path, [g.port for g in replicas], lb_port)

    class Cluster:
        pass

    c = Cluster()
    c.redis, c.replicas, c.nginx, c.url = redis, replicas, nginx, nginx.url
    yield c
    nginx.stop()
    for g in replicas:
        g.stop()
    if redis.proc.poll() is None:
        redis.stop()
    logs = "".join(g.stderr_path.read_text() for g in replicas)
    assert "panicked" not in logs, logs[-4000:]
    assert REDIS_PASSWORD not in logs and DELEGATE not in logs and MANAGE not in logs, "a secret reached a log"


class Served:
    """Records the replica that served each response."""

    def __init__(self):
        self.by = []

    async def hook(self, response):
        self.by.append(response.headers.get("graph-os-replica"))


def client(url, token, mode, served=None, **kw):
    hooks = {"response": [served.hook]} if served else {}
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60, event_hooks=hooks)
    return Client(streamable_http_client(url, http_client=http), mode=mode, **kw)


def post(url, body, headers=None, timeout=10):
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **(headers or {})}
    req = urllib.request.Request(url, method="POST", headers=h, data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


async def settle_everywhere(c, rounds=6):
    """Every replica's child is up (status requests spread over the replicas)."""
    for _ in range(rounds):
        await wait_status(c, lambda ch: settled(ch) and ch["tc"]["state"] == "up")


async def names(c):
    return {t.name for t in (await c.list_tools()).tools}


async def test_2025_session_is_served_by_every_replica(cluster):
    served, notes = Served(), ListChangedCounter()
    async with client(cluster.url, DELEGATE, "legacy", served, message_handler=notes.handler) as c:
        assert c.protocol_version.startswith("2025")
        await settle_everywhere(c)
        found = structured(await c.call_tool("find_tools", {"query": "add two numbers"}))
        assert "tc__add" in [r["name"] for r in found["results"]], found
        assert structured(await c.call_tool("load_tools", {"tools": ["tc__add"]}))["loaded"] == ["tc__add"]
        # the list change reaches the GET stream, whichever replica holds it
        with anyio.fail_after(10):
            while notes.count < 1:
                await anyio.sleep(0.05)
        for _ in range(6):
            assert "tc__add" in await names(c)
        r = await c.call_tool("tc__add", {"a": 2, "b": 3})
        assert not r.is_error and r.content[0].text == "5", r
        assert structured(await c.call_tool("unload_tools", {"tools": ["tc__add"]}))["unloaded"] == ["tc__add"]
        for _ in range(6):
            assert "tc__add" not in await names(c)
        assert error_code(await c.call_tool("tc__add", {"a": 1, "b": 1})) == "tool-not-loaded"
    replicas = [r for r in served.by if r]
    print("2025 responses by replica:", {r: replicas.count(r) for r in set(replicas)})
    assert len(set(replicas)) >= 2, replicas


async def test_2026_principal_is_served_by_every_replica(cluster):
    served = Served()
    async with client(cluster.url, DELEGATE, "auto", served) as c:
        assert c.protocol_version == "2026-07-28"
        await settle_everywhere(c)
        found = structured(await c.call_tool("find_tools", {"query": "echo text back"}))
        assert "tc__echo" in [r["name"] for r in found["results"]], found
        async with c.listen(tools_list_changed=True) as sub:
            structured(await c.call_tool("load_tools", {"tools": ["tc__echo"]}))
            with anyio.fail_after(10):
                await sub.__anext__()
            for _ in range(6):
                assert "tc__echo" in await names(c)
            r = await c.call_tool("tc__echo", {"text": "hi"})
            assert not r.is_error and "hi" in r.content[0].text, r
            structured(await c.call_tool("unload_tools", {"tools": ["tc__echo"]}))
            with anyio.fail_after(10):
                await sub.__anext__()
        for _ in range(6):
            assert "tc__echo" not in await names(c)
    replicas = [r for r in served.by if r]
    print("2026 responses by replica:", {r: replicas.count(r) for r in set(replicas)})
    assert len(set(replicas)) >= 2, replicas


async def test_concurrent_loads_into_one_principal_lose_nothing(cluster):
    async with client(cluster.url, DELEGATE, "auto") as a, client(cluster.url, DELEGATE, "auto") as b:
        await settle_everywhere(a)
        for i in range(100):
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.call_tool, "load_tools", {"tools": ["tc__add"]})
                tg.start_soon(b.call_tool, "load_tools", {"tools": ["tc__echo"]})
            seen = await names(a)
            assert {"tc__add", "tc__echo"} <= seen, (i, seen)
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.call_tool, "unload_tools", {"tools": ["tc__add"]})
                tg.start_soon(b.call_tool, "unload_tools", {"tools": ["tc__echo"]})
            seen = await names(b)
            assert not ({"tc__add", "tc__echo"} & seen), (i, seen)


async def test_a_killed_replica_loses_no_session(cluster):
    served = Served()
    async with client(cluster.url, DELEGATE, "legacy", served) as c:
        await settle_everywhere(c)
        structured(await c.call_tool("load_tools", {"tools": ["tc__add"]}))
        victim = cluster.replicas[1]
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        served.by.clear()
        for _ in range(8):
            assert "tc__add" in await names(c)
            r = await c.call_tool("tc__add", {"a": 20, "b": 22})
            assert not r.is_error and r.content[0].text == "42", r
        assert "replica-1" not in served.by and len({r for r in served.by if r}) == 2, served.by
    async with client(cluster.url, DELEGATE, "legacy") as fresh:
        assert "tc__add" not in await names(fresh), "a new session starts empty"
        structured(await fresh.call_tool("load_tools", {"tools": ["tc__echo"]}))
        assert "tc__echo" in await names(fresh)


async def test_redis_down_gives_503_then_recovers_without_restart(cluster):
    async with client(cluster.url, DELEGATE, "legacy") as c:
        await settle_everywhere(c)
        structured(await c.call_tool("load_tools", {"tools": ["tc__slow"]}))
        assert "tc__slow" in await names(c)  # the SDK caches the schema: no tools/list after the call
        results = {}

        async def in_flight():
            results["slow"] = await c.call_tool("tc__slow", {"ms": 1500})

        async with anyio.create_task_group() as tg:
            tg.start_soon(in_flight)
            await anyio.sleep(0.3)
            cluster.redis.stop()
            t0 = time.monotonic()
            status, headers, body = await anyio.to_thread.run_sync(
                lambda: post(cluster.url, INIT, {"Authorization": f"Bearer {DELEGATE}"}))
            elapsed = time.monotonic() - t0
            print(f"new session while Redis is down: HTTP {status} in {elapsed * 1000:.0f} ms: {body}")
            assert status == 503 and json.loads(body)["code"] == "session-store-unavailable", (status, body)
            assert headers.get("retry-after") == "1" and elapsed < 1.0, (headers, elapsed)
        assert not results["slow"].is_error and "slept 1500 ms" in results["slow"].content[0].text, results
        # the session's own requests need the store too: refused, never served from a private copy
        status, body = await anyio.to_thread.run_sync(lambda: cluster.replicas[0].get("/readyz"))
        store = json.loads(body)["session_store"]
        assert status == 200 and store["kind"] == "redis", body
    cluster.redis.start()
    deadline = time.monotonic() + 20
    while True:
        status, _, body = await anyio.to_thread.run_sync(
            lambda: post(cluster.url, INIT, {"Authorization": f"Bearer {DELEGATE}"}))
        if status == 200:
            break
        assert time.monotonic() < deadline, (status, body)
        await anyio.sleep(0.2)
    for g in cluster.replicas:
        body = json.loads(g.get("/readyz")[1])
        deadline = time.monotonic() + 15
        while not body["session_store"]["reachable"]:
            assert time.monotonic() < deadline, body
            await anyio.sleep(0.2)
            body = json.loads(g.get("/readyz")[1])
    async with client(cluster.url, DELEGATE, "legacy") as c:
        structured(await c.call_tool("load_tools", {"tools": ["tc__add"]}))
        for _ in range(4):
            assert "tc__add" in await names(c)


async def test_a_session_id_replayed_with_another_token_is_refused_and_redis_holds_no_secret(cluster):
    status, headers, _ = post(cluster.url, INIT, {"Authorization": f"Bearer {DELEGATE}"})
    assert status == 200
    sid = headers["mcp-session-id"]
    assert len(sid) >= 43, "at least 256 bits, base64url"
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    # every replica refuses the id with another principal's token (checked against the store,
    # not only the replica that created it)
    for g in cluster.replicas:
        status, _, body = post(g.url, ping, {"Authorization": f"Bearer {MANAGE}", "Mcp-Session-Id": sid,
                                              "Mcp-Protocol-Version": "2025-11-25"})
        assert status == 404 and json.loads(body)["code"] == "session-not-found", (g.port, status, body)
    for g in cluster.replicas:
        status, _, body = post(g.url, ping, {"Authorization": f"Bearer {DELEGATE}", "Mcp-Session-Id": sid,
                                              "Mcp-Protocol-Version": "2025-11-25"})
        assert status == 200, (g.port, status, body)
    async with client(cluster.url, DELEGATE, "auto") as c:
        structured(await c.call_tool("load_tools", {"tools": ["tc__add"]}))
    dump = "\n".join(cluster.redis.dump())
    print(dump)
    assert f"s:{sid}" in dump and ":loaded" in dump
    for secret in (REDIS_PASSWORD, DELEGATE, MANAGE):
        assert secret not in dump, "a secret was written to Redis"


async def test_rediss_with_a_tls_profile_and_mtls(tmp_path, write_fleet, http_gateway):
    """The session store over TLS with a client certificate (Redis's own TLS, `--tls-auth-clients yes`);
    a profile without the client certificate is refused by Redis, and requests get the stable 503."""
    from trust_peers import Pki

    pki = Pki(tmp_path / "pki")
    srv_cert, srv_key, _ = pki.issue("redis", names=("localhost", "127.0.0.1"))
    cli_cert, _, cli_key_pem = pki.issue("graph-os", names=("graph-os",), client=True)
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                              "--tls-cert-file", str(srv_cert), "--tls-key-file", str(srv_key),
                              "--tls-ca-cert-file", str(pki.ca_file), "--tls-auth-clients", "yes",
                              "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                             stdout=open(tmp_path / "redis-tls.log", "w"), stderr=subprocess.STDOUT)
    try:
        import socket
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and redis.poll() is None, (tmp_path / "redis-tls.log").read_text()
            time.sleep(0.05)
        good = tmp_path / "tls.json"
        good.write_text(json.dumps({"caFile": str(pki.ca_file), "clientCertFile": str(cli_cert),
                                    "clientKey": "env://CLIENT_KEY_PEM"}))
        no_cert = tmp_path / "no-cert.json"
        no_cert.write_text(json.dumps({"caFile": str(pki.ca_file)}))
        fleet = write_fleet({"tc": child_entry()})
        env = {**os.environ, **TOKENS, "CLIENT_KEY_PEM": cli_key_pem}
        common = ["--session-store", f"rediss://127.0.0.1:{port}", *TOKEN_ARGS]
        gw = http_gateway(fleet, *common, "--session-store-tls-profile", str(good), env=env)
        async with client(gw.url, DELEGATE, "legacy") as c:
            await wait_status(c, settled)
            structured(await c.call_tool("load_tools", {"tools": ["tc__add"]}))
            assert "tc__add" in await names(c)
        bad = http_gateway(fleet, *common, "--session-store-tls-profile", str(no_cert), env=env)
        status, _, body = post(bad.url, INIT, {"Authorization": f"Bearer {DELEGATE}"})
        assert status == 503 and json.loads(body)["code"] == "session-store-unavailable", (status, body)
        assert cli_key_pem not in gw.stderr_path.read_text() + bad.stderr_path.read_text()
    finally:
        redis.terminate()
        redis.wait(timeout=10)
