"""Trust boundary II, secrets everywhere: `secret://` for a ConfigMap-fed gateway (Kubernetes
API emulator), `MCP_FLEET_SECRET_REFS` aliases to env, secret and vault references, `vault://`
(KV v2 over HTTPS, token and Kubernetes auth, through the egress policy) failing closed when
Vault is down, value-free errors, attestation (a changed declaration re-resolves, logged as an
event) and the keyed freshness identity — and canaries that never appear in logs (trace level),
status, metrics, readyz, errors, the snapshot or the projection.

Real parts: the graph-os binary, the official Python SDK client, the project's test child (its
`env_digest` tool proves what a secret resolved to without the value crossing the gateway), the
Kubernetes API emulator, and a Vault stand-in implementing the documented KV v2 and
Kubernetes-auth HTTP API over HTTPS (tests/peers/vault_stub.py).
"""
import base64
import hashlib
import json
import os
import pathlib
import sqlite3
import subprocess
import time
import urllib.request

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, TARGET, TESTCHILD, child_entry, settled, structured, wait_status
from test_kube import Emulator as KubeEmulator
from trust_peers import Pki, VaultStub

pytestmark = pytest.mark.anyio

EMULATOR = TARGET / "graph-os-kube-emulator"
ROOT_TOKEN = "hvs.root-token-for-tests-0123"
SA_JWT = "eyJhbGciOiJSUzI1NiJ9.service-account.sig"


def digest(v):
    return hashlib.sha256(v.encode()).hexdigest()


class Emulator(KubeEmulator):
    """The API emulator of test_kube.py, plus Secrets and raw reads."""

    def secret(self, name, data):
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "mcp"},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
        req = urllib.request.Request(self.base + "/api/v1/namespaces/mcp/secrets", method="POST",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 201

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return r.read().decode()


@pytest.fixture
def emulator(tmp_path):
    emu = Emulator(tmp_path)
    yield emu
    emu.stop()


@pytest.fixture
def pki(tmp_path):
    return Pki(tmp_path / "pki")


@pytest.fixture
def vault(tmp_path, pki):
    started = []

    def start(**kw):
        v = VaultStub(tmp_path, pki, ROOT_TOKEN, **kw)
        started.append(v)
        return v

    yield start
    for v in started:
        v.stop()


def stdio_gateway(fleet, tmp_path, *args, env=None, log=None):
    """graph-os over stdio; its stderr (the log) goes to `log` when given."""
    env = {**os.environ, **(env or {})}
    env.setdefault("GRAPH_OS_LOG", "debug")
    argv = ["--config", str(fleet), "--state-dir", str(tmp_path / "state"), *args]
    if log is None:
        return StdioServerParameters(command=str(GRAPH_OS), args=argv, env=env)
    return StdioServerParameters(command="/bin/sh", args=["-c", f'exec "$0" "$@" 2>>"{log}"', str(GRAPH_OS), *argv],
                                 env=env)


async def resolved(c, server, name):
    """The SHA-256 of what `name` resolved to in `server`'s environment."""
    structured(await c.call_tool("load_tools", {"servers": [server]}))
    tools = [t.name for t in (await c.list_tools()).tools if t.name.endswith("__env_digest")]
    prefix = next(t for t in tools if t.startswith(server[:2]))
    r = await c.call_tool(prefix, {"name": name})
    assert not r.is_error, r
    return r.content[0].text


async def digest_of(c, tool, name):
    r = await c.call_tool(tool, {"name": name})
    assert not r.is_error, r
    return r.content[0].text


async def test_secret_references_resolve_for_a_configmap_fed_gateway(tmp_path, write_fleet, emulator):
    value = "kube-secret-CANARY-6b1d"
    emulator.secret("creds", {"token": value})
    fleet = write_fleet({"kc": child_entry(env={"API_TOKEN": "secret://mcp/creds#token"}),
                         "gone": child_entry(env={"API_TOKEN": "secret://mcp/creds#nope"})})
    # A file (ConfigMap) fleet, the generation record in Leases: no --fleet kube://.
    params = stdio_gateway(fleet, tmp_path, "--generation-store", "kube://mcp/cm-fleet",
                           env={"KUBECONFIG": str(emulator.kubeconfig)})
    async with Client(params, mode="legacy") as c:
        st = await wait_status(c, settled)
        assert st["children"]["kc"]["state"] == "up", st["children"]["kc"]
        assert st["children"]["gone"]["last_error"]["code"] == "secret-unavailable"
        structured(await c.call_tool("load_tools", {"servers": ["kc"]}))
        assert await digest_of(c, "kc__env_digest", "API_TOKEN") == digest(value)
        assert value not in json.dumps(structured(await c.call_tool("multiplexer_status", {})))
    assert "cm-fleet" in emulator.get("/apis/coordination.k8s.io/v1/namespaces/mcp/leases")


async def test_fleet_secret_refs_map_aliases_to_env_secret_and_vault(tmp_path, write_fleet, emulator, vault, pki):
    v = vault(secrets={"secret/apps/gh": {"token": "vault-CANARY-41ac"}})
    emulator.secret("db", {"password": "kube-CANARY-93f0"})
    refs = {"FROM_ENV": "env://REAL_VAR", "FROM_KUBE": "secret://mcp/db#password",
            "FROM_VAULT": "vault://secret/apps/gh#token", "LIVE_WINS": "env://NOT_SET_ANYWHERE"}
    fleet = write_fleet({"m": child_entry(env={
        "A_TOKEN": "env://FROM_ENV", "B_PASSWORD": "env://FROM_KUBE", "C_TOKEN": "env://FROM_VAULT",
        "D_TOKEN": "env://LIVE_WINS"}),
        "unmapped": child_entry(env={"X_TOKEN": "env://NOT_MAPPED_NOR_SET"})})
    env = {"KUBECONFIG": str(emulator.kubeconfig), "MCP_FLEET_SECRET_REFS": json.dumps(refs),
           "REAL_VAR": "env-CANARY-77e2", "LIVE_WINS": "live-CANARY-0c55", "VAULT_TOKEN": ROOT_TOKEN}
    params = stdio_gateway(fleet, tmp_path, "--vault-addr", v.addr, "--vault-token", "env://VAULT_TOKEN",
                           "--vault-ca-file", str(v.ca_file), env=env)
    async with Client(params, mode="legacy") as c:
        st = await wait_status(c, settled)
        assert st["children"]["m"]["state"] == "up", st["children"]["m"]
        assert st["children"]["unmapped"]["last_error"]["code"] == "secret-unavailable"
        structured(await c.call_tool("load_tools", {"servers": ["m"]}))
        assert await digest_of(c, "m__env_digest", "A_TOKEN") == digest("env-CANARY-77e2")
        assert await digest_of(c, "m__env_digest", "B_PASSWORD") == digest("kube-CANARY-93f0")
        assert await digest_of(c, "m__env_digest", "C_TOKEN") == digest("vault-CANARY-41ac")
        assert await digest_of(c, "m__env_digest", "D_TOKEN") == digest("live-CANARY-0c55")
    # A malformed mapping fails closed and never echoes itself.
    bad = json.dumps({"FROM_ENV": "literal-CANARY-ffff"})
    errlog = tmp_path / "bad-refs.log"
    bad_env = {k: val for k, val in {**env, "MCP_FLEET_SECRET_REFS": bad}.items() if k != "REAL_VAR"}
    params = stdio_gateway(fleet, tmp_path, env=bad_env, log=errlog)
    params.env.pop("REAL_VAR", None)
    async with Client(params, mode="legacy") as c:
        st = await wait_status(c, settled)
        assert st["children"]["m"]["last_error"]["code"] == "secret-unavailable", st["children"]["m"]
    text = errlog.read_text()
    assert "MCP_FLEET_SECRET_REFS: the value of FROM_ENV must be one env://" in text, text
    assert "CANARY" not in text


async def test_vault_kubernetes_auth_and_failing_closed_when_vault_is_down(tmp_path, write_fleet, vault):
    jwt_file = tmp_path / "sa-token"
    jwt_file.write_text(SA_JWT + "\n")
    v = vault(secrets={"secret/apps/api": {"key": "vault-k8s-CANARY-5e3a"}}, k8s_jwt=SA_JWT)
    fleet = write_fleet({"vk": child_entry(env={"API_KEY": "vault://secret/apps/api#key"}),
                         "missing": child_entry(env={"API_KEY": "vault://secret/apps/api#nope"})})
    args = ("--vault-addr", v.addr, "--vault-k8s-role", "graph-os", "--vault-sa-token-file", str(jwt_file),
            "--vault-ca-file", str(v.ca_file))
    async with Client(stdio_gateway(fleet, tmp_path, *args), mode="legacy") as c:
        st = await wait_status(c, settled)
        assert st["children"]["vk"]["state"] == "up", st["children"]["vk"]
        assert st["children"]["missing"]["last_error"]["code"] == "secret-unavailable"
        structured(await c.call_tool("load_tools", {"servers": ["vk"]}))
        assert await digest_of(c, "vk__env_digest", "API_KEY") == digest("vault-k8s-CANARY-5e3a")
    seen = v.requests()
    assert ["POST", "/v1/auth/kubernetes/login"] in seen, seen
    assert ["GET", "/v1/secret/data/apps/api"] in seen, seen
    # Wrong CA: the TLS check fails closed.
    other = Pki(tmp_path / "other-pki", name="another CA")
    bad_ca = ("--vault-addr", v.addr, "--vault-k8s-role", "graph-os", "--vault-sa-token-file", str(jwt_file),
              "--vault-ca-file", str(other.ca_file))
    async with Client(stdio_gateway(fleet, tmp_path, *bad_ca), mode="legacy") as c:
        st = await wait_status(c, settled)
        assert st["children"]["vk"]["last_error"]["code"] == "secret-unavailable"
    # Vault down: fails closed, other children unaffected.
    v.stop()
    fleet2 = write_fleet({"vk": child_entry(env={"API_KEY": "vault://secret/apps/api#key"}), "ok": child_entry()},
                         name="f2.json")
    async with Client(stdio_gateway(fleet2, tmp_path, *args), mode="legacy") as c:
        st = await wait_status(c, settled)
        assert st["children"]["vk"]["state"] == "failed"
        assert st["children"]["vk"]["last_error"]["code"] == "secret-unavailable"
        assert st["children"]["ok"]["state"] == "up"


def test_validate_and_token_errors_never_echo_the_value(write_fleet):
    path = write_fleet({"a": {"command": "x", "env": "GITHUB_TOKEN=ghp_CANARY"},
                        "b": {"command": "x", "env": {"DB_PASSWORD": 12345678}},
                        "c": {"command": "x", "env": {"API_KEY": "sk-inline${HOME}"}}})
    r = subprocess.run([str(GRAPH_OS), "validate", "--config", str(path)], capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode == 1
    assert "server 'a' field 'env': wrong type: expected an object" in out, out
    assert "server 'b' field 'env.DB_PASSWORD': wrong type: expected a string" in out, out
    assert "server 'c' field 'env.API_KEY': inline credential refused" in out, out
    for canary in ("CANARY", "12345678", "sk-inline"):
        assert canary not in out, out
    # (A reference's *name* may be named in an error — `${NAME} is unavailable` — never a value.)
    for arg in ("sk-LIVE-CANARY-0123456789", "manage=sk-LIVE-CANARY-0123456789", "sk-LIVE-CANARY=x",
                "manage=env://sk-LIVE-CANARY", "manage=Bearer sk-LIVE-CANARY"):
        r = subprocess.run([str(GRAPH_OS), "--transport", "streamable-http", "--port", "1", "--token", arg],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert "--token" in out, out
        assert "CANARY" not in out, (arg, out)


async def test_a_changed_declaration_re_resolves_and_the_freshness_identity_follows_it(tmp_path, write_fleet, vault):
    v = vault(secrets={"secret/apps/x": {"token": "first-CANARY-aaaa"}})
    entry = child_entry(env={"API_TOKEN": "vault://secret/apps/x#token"})
    fleet = write_fleet({"att": entry})
    args = ("--vault-addr", v.addr, "--vault-token", "env://VAULT_TOKEN", "--vault-ca-file", str(v.ca_file),
            "--attestation-key", "env://ATT_KEY")
    env = {"VAULT_TOKEN": ROOT_TOKEN, "ATT_KEY": "attestation-key-for-tests-0123456789"}
    log1 = tmp_path / "gw1.log"

    async def identity(c):
        st = await wait_status(c, lambda k: k["att"]["state"] == "up")
        return st["children"]["att"]["declaration_identity"]

    async with Client(stdio_gateway(fleet, tmp_path, *args, env=env, log=log1), mode="legacy") as c:
        id1 = await identity(c)
        structured(await c.call_tool("load_tools", {"servers": ["att"]}))
        assert await digest_of(c, "att__env_digest", "API_TOKEN") == digest("first-CANARY-aaaa")
        # Rotate the secret: the identity does not move (credentials count only as present).
        v.write("secret/apps/x", {"token": "second-CANARY-bbbb"})
        reads_before = [r for r in v.requests() if r == ["GET", "/v1/secret/data/apps/x"]]
        # Change the declaration (args): the reload restarts the child, its material is re-resolved.
        fleet.write_text(json.dumps({"mcpServers": {"att": {**entry, "args": ["--name", "changed"]}}}))
        deadline = time.monotonic() + 30
        while True:
            st = structured(await c.call_tool("multiplexer_status", {}))
            if st["children"]["att"]["declaration_identity"] != id1 and st["children"]["att"]["state"] == "up":
                break
            assert time.monotonic() < deadline, st
            await anyio.sleep(0.2)
        id2 = st["children"]["att"]["declaration_identity"]
        structured(await c.call_tool("load_tools", {"servers": ["att"]}))
        assert await digest_of(c, "att__env_digest", "API_TOKEN") == digest("second-CANARY-bbbb")
        reads_after = [r for r in v.requests() if r == ["GET", "/v1/secret/data/apps/x"]]
        assert len(reads_after) > len(reads_before), "the changed declaration was served from cached material"
    assert id1 != id2
    # Same key, rotated value, same declaration: the identity of the changed declaration is stable.
    v.write("secret/apps/x", {"token": "third-CANARY-cccc"})
    async with Client(stdio_gateway(fleet, tmp_path, *args, env=env), mode="legacy") as c:
        assert await identity(c) == id2
    # The rebinding was logged as an event, without values.
    text = log1.read_text()
    assert "secret-material-rebound" in text and "server=att" in text, text[-3000:]
    assert "CANARY" not in text


async def test_canaries_never_appear_in_logs_status_metrics_readyz_errors_snapshot_or_projection(
        tmp_path, write_fleet, emulator, vault, http_gateway):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from trust_peers import start_http_testchild

    canaries = {
        "env": "CANARY-env-9d1f27c4", "vault": "CANARY-vault-5a0be713", "kube": "CANARY-kube-c3e88f02",
        "mapped": "CANARY-mapped-7b41aa90", "header": "CANARY-header-1e5cd6b8", "gw": "CANARY-gwtoken-44f0e2a9",
    }
    v = vault(secrets={"secret/apps/c": {"token": canaries["vault"]}, "secret/apps/m": {"token": canaries["mapped"]}})
    emulator.secret("c", {"token": canaries["kube"]})
    http_child, port = start_http_testchild(TESTCHILD)
    try:
        fleet = write_fleet({
            "env": child_entry(env={"API_TOKEN": "env://CANARY_ENV"}),
            "vlt": child_entry(env={"API_TOKEN": "vault://secret/apps/c#token"}),
            "kub": child_entry(env={"DB_PASSWORD": "secret://mcp/c#token"}),
            "map": child_entry(env={"X_TOKEN": "env://MAPPED_ALIAS"}),
            "hdr": {"url": f"http://127.0.0.1:{port}/mcp", "headers": {"Authorization": "Bearer ${HDR_CANARY}"}},
        })
        env = {**os.environ, "GRAPH_OS_LOG": "trace", "KUBECONFIG": str(emulator.kubeconfig),
               "CANARY_ENV": canaries["env"], "HDR_CANARY": canaries["header"], "GW_MANAGE": canaries["gw"],
               "VAULT_TOKEN": ROOT_TOKEN,
               "MCP_FLEET_SECRET_REFS": json.dumps({"MAPPED_ALIAS": "vault://secret/apps/m#token"})}
        state = tmp_path / "state"
        gw = http_gateway(fleet, "--token", "manage=env://GW_MANAGE", "--state-dir", str(state),
                          "--vault-addr", v.addr, "--vault-token", "env://VAULT_TOKEN", "--vault-ca-file", str(v.ca_file),
                          env=env)
        seen = []
        auth = {"Authorization": f"Bearer {canaries['gw']}"}
        async with Client(streamable_http_client(gw.url, http_client=httpx2.AsyncClient(headers=auth, timeout=60)),
                          mode="legacy") as c:
            st = await wait_status(c, settled)
            seen.append(json.dumps(st))
            for name in ("env", "vlt", "kub", "map", "hdr"):
                assert st["children"][name]["state"] == "up", (name, st["children"][name])
            structured(await c.call_tool("load_tools", {"servers": ["env", "vlt", "kub", "map"]}))
            await wait_status(c, lambda k: True)
            for server, var, key in (("env", "API_TOKEN", "env"), ("vlt", "API_TOKEN", "vault"),
                                     ("kub", "DB_PASSWORD", "kube"), ("map", "X_TOKEN", "mapped")):
                assert await digest_of(c, f"{server}__env_digest", var) == digest(canaries[key]), server
            # An error path: a tool that fails, a dispatch to nothing.
            seen.append(json.dumps((await c.call_tool("env__fail", {})).model_dump()))
            for tool, args in (("list_catalog", {}), ("list_catalog", {"server": "hdr"}), ("find_tools", {"query": "token"}),
                               ("multiplexer_status", {})):
                seen.append(json.dumps(structured(await c.call_tool(tool, args))))
            ident = structured(await c.call_tool("list_catalog", {}))["catalog_identity"]
            refresh = await c.call_tool("catalog_refresh", {
                "request_id": "canary-1", "expected_config_revision": ident["config_revision"],
                "expected_catalog_generation": ident["catalog_generation"],
                "expected_snapshot_digest": ident["snapshot_digest"], "deadline_ms": 20000})
            seen.append(json.dumps(refresh.structured_content))
        for path in ("/metrics", "/readyz", "/healthz"):
            seen.append(gw.get(path)[1])
        seen.append(gw.get("/api/mcp/status", headers=auth)[1])
        seen.append(gw.get("/api/mcp/catalog", headers=auth)[1])
        gw.stop()
        files = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
        assert any(p.name.endswith(".sqlite") for p in files), sorted(map(str, files))
        projection = next(p for p in files if p.name.endswith(".sqlite"))
        with sqlite3.connect(projection) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            assert "kg_nodes" in tables, tables
            rows = json.dumps([db.execute(f"SELECT * FROM {t}").fetchall() for t in tables])
        log = gw.stderr_path.read_text()
        assert "TRACE" in log, "the gateway did not log at trace level"
        print(f"canary scan: {len(log) // 1024} KiB of trace log, {len(files)} state files, {len(seen)} answers")
        for key, canary in canaries.items():
            assert canary not in log, f"{key} canary in the trace log"
            for text in seen:
                assert canary not in text, f"{key} canary in an answer: {text[:300]}"
            for p, data in files.items():
                assert canary.encode() not in data, f"{key} canary in {p}"
            assert canary not in rows
    finally:
        http_child.kill()
        http_child.wait()
