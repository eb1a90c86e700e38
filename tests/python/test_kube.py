"""graph-os against the in-process Kubernetes API emulator (kube's real client, watcher and Leases)."""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import anyio
import pytest
from mcp import Client, StdioServerParameters, types

from conftest import GRAPH_OS, TARGET, TESTCHILD, settled, structured, wait_status

pytestmark = pytest.mark.anyio
EMULATOR = TARGET / "graph-os-kube-emulator"
FLEETS = "/apis/graphos.dev/v1alpha1/namespaces/mcp/mcpfleets"


class Emulator:
    def __init__(self, tmp_path):
        self.proc = subprocess.Popen([str(EMULATOR), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        self.base = "http://" + line.removeprefix("listening on ")
        self.kubeconfig = tmp_path / "kubeconfig"
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "emu",
            "clusters": [{"name": "emu", "cluster": {"server": self.base}}],
            "users": [{"name": "emu", "user": {}}],
            "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu", "namespace": "mcp"}}],
        }))

    def call(self, method, path, body=None, content_type="application/json"):
        req = urllib.request.Request(self.base + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def apply_fleet(self, name, servers):
        status, _ = self.call("POST", FLEETS, {"apiVersion": "graphos.dev/v1alpha1", "kind": "McpFleet",
                                               "metadata": {"name": name, "namespace": "mcp"}, "spec": {"mcpServers": servers}})
        assert status == 201, status

    def patch_spec(self, name, servers):
        status, _ = self.call("PATCH", f"{FLEETS}/{name}", {"spec": {"mcpServers": servers}}, "application/merge-patch+json")
        assert status == 200, status

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def emulator(tmp_path):
    if not EMULATOR.exists():
        raise AssertionError(f"{EMULATOR} is missing: run cargo build --workspace")
    emu = Emulator(tmp_path)
    yield emu
    emu.stop()


def gateway(emu, tmp_path, *args, state="state"):
    env = {**os.environ, "KUBECONFIG": str(emu.kubeconfig)}
    return StdioServerParameters(command=str(GRAPH_OS), args=[*args, "--state-dir", str(tmp_path / state)], env=env)


class Notes:
    def __init__(self):
        self.times = []

    async def handler(self, message):
        if isinstance(message, types.ToolListChangedNotification) or getattr(message, "method", "") == "notifications/tools/list_changed":
            self.times.append(time.monotonic())


async def test_mcpfleet_spec_drives_the_gateway_with_hot_reload_and_status(emulator, tmp_path):
    tc = {"command": str(TESTCHILD)}
    emulator.apply_fleet("default", {"tc": tc})
    notes = Notes()
    async with Client(gateway(emulator, tmp_path, "--fleet", "kube://mcp/default"), mode="legacy", message_handler=notes.handler) as client:
        await wait_status(client, lambda ch: "tc" in ch and settled(ch))
        structured(await client.call_tool("load_tools", {"tools": ["tc__add"]}))
        assert (await client.call_tool("tc__add", {"a": 1, "b": 2})).content[0].text == "3"
        await anyio.sleep(0.3)
        notes.times.clear()

        # edit the spec: the child restarts with a new schema; the session that loaded it is told
        edited = time.monotonic()
        emulator.patch_spec("default", {"tc": {**tc, "args": ["--schema-file", str(tmp_path / "v")]}})
        with anyio.fail_after(10):
            while not notes.times:
                await anyio.sleep(0.05)
        delay = notes.times[0] - edited
        print(f"spec edit -> list_changed in {delay * 1000:.0f} ms")
        assert delay < 2.0
        # The first list_changed may announce the restart (the tool gone for a moment); the
        # restarted child's catalog follows with the new schema.
        with anyio.fail_after(10):
            while True:
                tool = next((t for t in (await client.list_tools()).tools if t.name == "tc__add"), None)
                if tool is not None and "v1" in tool.input_schema["properties"]:
                    break
                await anyio.sleep(0.05)

        # an invalid spec: the old fleet keeps serving and the status says why
        emulator.patch_spec("default", {"tc": {**tc, "bogus": 1}})
        deadline = time.monotonic() + 15
        while True:
            _, obj = emulator.call("GET", f"{FLEETS}/default")
            conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
            if conds.get("Degraded", {}).get("status") == "True":
                break
            assert time.monotonic() < deadline, obj.get("status")
            await anyio.sleep(0.3)
        assert conds["Degraded"]["reason"] == "SpecRejected" and "bogus" in conds["Degraded"]["message"]
        assert (await client.call_tool("tc__add", {"a": 2, "b": 2})).content[0].text == "4"
        status = obj["status"]
        assert status["catalogGeneration"] >= 1 and len(status["snapshotDigest"]) == 64
        assert status["children"]["tc"]["state"] == "up"


async def identity(client):
    return structured(await client.call_tool("list_catalog", {"include_tools": False}))["catalog_identity"]


async def test_replicas_agree_through_leases_and_a_divergent_one_blocks_refresh(emulator, tmp_path):
    emulator.apply_fleet("default", {"tc": {"command": str(TESTCHILD), "args": ["--vary-each-list"]}})
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"mcpServers": {"x": {"command": str(TESTCHILD)}}}))
    async with Client(gateway(emulator, tmp_path, "--fleet", "kube://mcp/default", "--replica-id", "a", state="a"), mode="legacy") as a, \
            Client(gateway(emulator, tmp_path, "--fleet", "kube://mcp/default", "--replica-id", "b", state="b"), mode="legacy") as b:
        for c in (a, b):
            await wait_status(c, settled)
        deadline = time.monotonic() + 20
        while True:
            ia, ib = await identity(a), await identity(b)
            if ia["catalog_generation"] >= 1 and (ia["catalog_generation"], ia["snapshot_digest"]) == (ib["catalog_generation"], ib["snapshot_digest"]):
                break
            assert time.monotonic() < deadline, (ia, ib)
            await anyio.sleep(0.5)
        _, leases = emulator.call("GET", "/apis/coordination.k8s.io/v1/namespaces/mcp/leases")
        names = {l["metadata"]["name"] for l in leases["items"]}
        assert "default-catalog-generation" in names, names
        assert any(n.startswith("default-replica-a-") for n in names) and any(n.startswith("default-replica-b-") for n in names), names

        # a third replica with another config (a file, same Lease cohort) blocks publication
        async with Client(gateway(emulator, tmp_path, "--config", str(other), "--generation-store", "kube://mcp/default",
                                  "--replica-id", "c", state="c"), mode="legacy") as c:
            await wait_status(c, settled)
            await anyio.sleep(6)
            ident = await identity(a)
            req = {"request_id": "r1", "expected_config_revision": ident["config_revision"],
                   "expected_catalog_generation": ident["catalog_generation"],
                   "expected_snapshot_digest": ident["snapshot_digest"], "deadline_ms": 10000}
            r = await a.call_tool("catalog_refresh", req)
            assert r.is_error and r.structured_content["code"] == "replica-generation-divergent", r.structured_content


async def test_secret_references_resolve_from_kubernetes_secrets_and_stay_secret(emulator, tmp_path):
    import base64

    value = "kube-secret-value-5f1e"
    status, _ = emulator.call("POST", "/api/v1/namespaces/mcp/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": "mcp"},
        "data": {"token": base64.b64encode(value.encode()).decode()}})
    assert status == 201
    emulator.apply_fleet("default", {
        "tc": {"command": str(TESTCHILD), "env": {"API_TOKEN": "secret://mcp/creds#token"}},
        "missing": {"command": str(TESTCHILD), "env": {"API_TOKEN": "secret://mcp/creds#nope"}},
    })
    params = gateway(emulator, tmp_path, "--fleet", "kube://mcp/default")
    params.env["GRAPH_OS_LOG"] = "debug"
    async with Client(params, mode="legacy") as client:
        st = await wait_status(client, settled)
        assert st["children"]["missing"]["last_error"]["code"] == "secret-unavailable"
        structured(await client.call_tool("load_tools", {"tools": ["tc__env_get"]}))
        r = await client.call_tool("tc__env_get", {"name": "API_TOKEN"})
        assert r.content[0].text == value
        assert value not in json.dumps(structured(await client.call_tool("multiplexer_status", {})))
        await anyio.sleep(3)
    _, obj = emulator.call("GET", f"{FLEETS}/default")
    assert value not in json.dumps(obj)


def http_replica(emu, tmp_path, replica, *extra):
    """A gateway replica serving streamable HTTP on the McpFleet `default` (a raw process)."""
    from conftest import free_port

    port = free_port()
    log = open(tmp_path / f"replica-{len(replica)}-{replica[-5:]}.log", "w")
    proc = subprocess.Popen([str(GRAPH_OS), "--transport", "streamable-http", "--port", str(port), "--fleet", "kube://mcp/default",
                             "--replica-id", replica, "--state-dir", str(tmp_path / f"state-{replica[-5:]}"), *extra],
                            env={**os.environ, "KUBECONFIG": str(emu.kubeconfig)}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=log)
    return proc, port


def fleet_status(emu):
    _, obj = emu.call("GET", f"{FLEETS}/default")
    return (obj or {}).get("status") or {}


async def test_a_follower_takes_over_status_when_the_writer_dies(emulator, tmp_path):
    emulator.apply_fleet("default", {"tc": {"command": str(TESTCHILD)}})
    # Pod names of one ReplicaSet with a long fullname: equal in their first 40 characters.
    prefix = "graph-os-production-gateway-7d9f8c6b5d-zz"
    a_id, b_id = prefix + "-abcde", prefix + "-fghij"
    assert a_id[:40] == b_id[:40]
    a, _ = http_replica(emulator, tmp_path, a_id)
    await anyio.sleep(2.5)  # let a become the writer first
    b, _ = http_replica(emulator, tmp_path, b_id)
    try:
        deadline = time.monotonic() + 30
        while fleet_status(emulator).get("writer") is None:
            assert time.monotonic() < deadline, fleet_status(emulator)
            await anyio.sleep(0.3)
        first = fleet_status(emulator)["writer"]
        _, leases = emulator.call("GET", "/apis/coordination.k8s.io/v1/namespaces/mcp/leases")
        replicas = [l for l in leases["items"] if l["metadata"]["name"].startswith("default-replica-")]
        while len(replicas) < 2 and time.monotonic() < deadline:
            await anyio.sleep(0.5)
            _, leases = emulator.call("GET", "/apis/coordination.k8s.io/v1/namespaces/mcp/leases")
            replicas = [l for l in leases["items"] if l["metadata"]["name"].startswith("default-replica-")]
        holders = {l["spec"]["holderIdentity"] for l in replicas}
        assert holders == {a_id, b_id}, [l["metadata"]["name"] for l in replicas]
        # Kill the writer without a chance to release: the other takes over within one lease period.
        victim, survivor = (a, b) if first == a_id else (b, a)
        other = b_id if first == a_id else a_id
        victim.kill()
        victim.wait()
        killed = time.monotonic()
        # Make the status differ so a write is visible: the survivor reports its own id.
        while fleet_status(emulator).get("writer") != other:
            assert time.monotonic() - killed < 10 + 2 + 5, fleet_status(emulator)
            await anyio.sleep(0.3)
        print(f"status writer {first} killed; {other} wrote status {time.monotonic() - killed:.1f} s later")
        assert survivor.poll() is None
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=15)


async def test_a_stale_unpublished_projection_does_not_block_a_refresh(emulator, tmp_path):
    import sqlite3

    emulator.apply_fleet("default", {"tc": {"command": str(TESTCHILD), "args": ["--vary-each-list"]}})
    async with Client(gateway(emulator, tmp_path, "--fleet", "kube://mcp/default", "--replica-id", "a"), mode="legacy") as c:
        await wait_status(c, settled)
        ident = await identity(c)
        deadline = time.monotonic() + 20
        while ident["catalog_generation"] < 1:
            assert time.monotonic() < deadline
            await anyio.sleep(0.3)
            ident = await identity(c)
        # A crash between projection and CAS left the next generation projected, unpublished.
        db = sqlite3.connect(tmp_path / "state" / "projection.sqlite")
        g = ident["catalog_generation"] + 1
        db.execute("INSERT INTO kg_generations VALUES (?, ?, 0, 0)", (g, "f" * 64))
        db.execute("INSERT INTO kg_nodes VALUES (?, ?, 'tool:stale__ghost', 'tool', 'ghost', 'stale__ghost', 'ghostly', '{}')",
                   (g, "f" * 64))
        db.commit()
        db.close()
        req = {"request_id": "r2", "expected_config_revision": ident["config_revision"],
               "expected_catalog_generation": ident["catalog_generation"],
               "expected_snapshot_digest": ident["snapshot_digest"], "deadline_ms": 10000}
        r = structured(await c.call_tool("catalog_refresh", req))
        assert r["changed"] and r["catalog_generation"] == g, r
        graph = structured(await c.call_tool("fleet_graph", {"servers_providing": "echo"}))
        assert graph["generation"] == g and "tc" in graph["servers"], graph
        ghost = structured(await c.call_tool("fleet_graph", {"servers_providing": "ghostly"}))
        assert ghost["servers"] == {}, ghost
