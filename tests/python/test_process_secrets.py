"""Process isolation of secrets (docs/threat-model.md), against the real gateway and real children.

- A stdio child cannot read the gateway's /proc/<pid>/environ or mem, nor a sibling's environ.
  The test proves it aimed at the right processes: the gateway is the child's parent (and, when
  the test runs as root, the test itself reads the gateway's and the sibling's environ and finds
  the secrets there), the sibling's pid is the one the sibling reports itself.
- A child's environment holds exactly the documented allowlist plus its declared env: parent
  variables such as XDG_SESSION_COOKIE or SSL_CERT_EVIL never cross.
- A child at the gateway's allowed host is graph-os itself on any port (its ingress on 443):
  refused with `self-registration-refused`, while a child at another host is admitted.
"""
import os
import pathlib
import re

import pytest
from mcp import Client

from conftest import PYTHON, ROOT, structured, wait_status

pytestmark = pytest.mark.anyio

PROBE = ROOT / "tests" / "peers" / "proc_probe.py"
GATEWAY_CANARY = "gateway-canary-5be1f0c2"
SECRET_A = "child-a-secret-9c1d44"
SECRET_B = "child-b-secret-07aa3e"
IS_ROOT = os.geteuid() == 0


def documented_allowlist():
    """The allowlist as docs/threat-model.md documents it, checked against the one constant."""
    doc = (ROOT / "docs" / "threat-model.md").read_text()
    block = doc.split("<!-- env-allowlist -->", 2)[1]
    documented = re.findall(r"^\| `([A-Z_]+)` \|", block, re.M)
    source = (ROOT / "src" / "transport" / "stdio.rs").read_text()
    constant = source.split("pub const ENV_ALLOWLIST: &[&str] = &[", 1)[1].split("];", 1)[0]
    assert documented == re.findall(r'"([A-Z_]+)"', constant), "docs/threat-model.md and ENV_ALLOWLIST disagree"
    return set(documented)


def probe_entry(secret_alias):
    return {"command": str(PYTHON), "args": [str(PROBE)], "env": {"API_TOKEN": f"env://{secret_alias}"}}


async def tool(c, server, name, args=None):
    return structured(await c.call_tool(f"{server}__{name}", args or {}))


def contents(path):
    with open(path, "rb") as f:
        return f.read()


async def test_children_cannot_read_the_gateway_or_each_other(write_fleet, http_gateway):
    fleet = write_fleet({"a": probe_entry("ALIAS_A"), "b": probe_entry("ALIAS_B")})
    env = {**os.environ, "GATEWAY_CANARY": GATEWAY_CANARY, "ALIAS_A": SECRET_A, "ALIAS_B": SECRET_B}
    gw = http_gateway(fleet, env=env)
    async with Client(gw.url, mode="legacy") as c:
        st = await wait_status(c, lambda k: all(k[n]["state"] == "up" for n in ("a", "b")))
        structured(await c.call_tool("load_tools", {"servers": ["a", "b"]}))
        a = await tool(c, "a", "whoami")
        b = await tool(c, "b", "whoami")
        print(f"\nchild a: {a}\nchild b: {b}")
        # The right processes: the gateway is both children's parent; each reports its own pid.
        assert a["ppid"] == gw.proc.pid and b["ppid"] == gw.proc.pid, (a, b, gw.proc.pid)
        assert a["pid"] != b["pid"]
        if IS_ROOT:
            # The test (root, all capabilities) can: the targets hold what a child must not see.
            assert GATEWAY_CANARY.encode() in contents(f"/proc/{gw.proc.pid}/environ")
            assert SECRET_B.encode() in contents(f"/proc/{b['pid']}/environ")
        targets = [f"/proc/{gw.proc.pid}/environ", f"/proc/{gw.proc.pid}/mem"]
        if IS_ROOT:
            targets += [f"/proc/{b['pid']}/environ", f"/proc/{b['pid']}/mem"]
        # The probe works: a child reads its own environ.
        own = await tool(c, "a", "try_read", {"paths": [f"/proc/{a['pid']}/environ"]})
        assert own[f"/proc/{a['pid']}/environ"].startswith("ok:"), own
        seen = await tool(c, "a", "try_read", {"paths": targets})
        print(f"child a reading the gateway and its sibling: {seen}")
        leaked = {p: r for p, r in seen.items() if not r.startswith("error:")}
        assert not leaked, f"a child read what it must not: {leaked}"
        # And the other way round.
        back = await tool(c, "b", "try_read", {"paths": [f"/proc/{gw.proc.pid}/environ"]
                                               + ([f"/proc/{a['pid']}/environ"] if IS_ROOT else [])})
        assert all(r.startswith("error:") for r in back.values()), back
        if IS_ROOT:
            # Root children keep uid 0 but hold no capability and run non-dumpable.
            assert a["uid"].split()[0] == "0"
            assert int(a["cap_eff"], 16) == 0 and int(a["cap_prm"], 16) == 0, a
            assert int(a["cap_bnd"], 16) == 0 and int(a["cap_inh"], 16) == 0, a
            assert a["dumpable"] == 0 and b["dumpable"] == 0, (a, b)
            assert a["gid"].split()[:2] == ["65534", "0"], a
        assert SECRET_A not in str(st) and SECRET_B not in str(st)


@pytest.mark.skipif(IS_ROOT, reason="as root, siblings are isolated (the test above)")
async def test_non_root_siblings_share_the_uid_a_documented_limit(write_fleet, http_gateway):
    """Without CAP_SETGID the platform offers no more: siblings stay readable to each other."""
    fleet = write_fleet({"a": probe_entry("ALIAS_A"), "b": probe_entry("ALIAS_B")})
    gw = http_gateway(fleet, env={**os.environ, "ALIAS_A": SECRET_A, "ALIAS_B": SECRET_B})
    async with Client(gw.url, mode="legacy") as c:
        await wait_status(c, lambda k: all(k[n]["state"] == "up" for n in ("a", "b")))
        structured(await c.call_tool("load_tools", {"servers": ["a", "b"]}))
        b = await tool(c, "b", "whoami")
        seen = await tool(c, "a", "try_read", {"paths": [f"/proc/{b['pid']}/environ"]})
        assert seen[f"/proc/{b['pid']}/environ"].startswith("ok:"), seen


async def test_only_the_documented_names_reach_a_child(write_fleet, http_gateway):
    allowlist = documented_allowlist()
    fleet = write_fleet({"a": {**probe_entry("ALIAS_A"), "env": {"API_TOKEN": "env://ALIAS_A", "DECLARED": "x"}}})
    hostile = {"XDG_SESSION_COOKIE": "cookie-1", "SSL_CERT_EVIL": "evil", "XDG_EVIL": "e", "LC_CTYPE_X": "x",
               "PATHS": "p", "AWS_SECRET_ACCESS_KEY": "aws"}
    inherited = {name: "/tmp" for name in allowlist if name not in os.environ}
    env = {**os.environ, **inherited, **hostile, "ALIAS_A": SECRET_A}
    gw = http_gateway(fleet, env=env)
    async with Client(gw.url, mode="legacy") as c:
        await wait_status(c, lambda k: k["a"]["state"] == "up")
        structured(await c.call_tool("load_tools", {"servers": ["a"]}))
        names = set((await tool(c, "a", "env_names"))["names"])
        print(f"\nchild environment: {sorted(names)}")
        outside = names - allowlist - {"API_TOKEN", "DECLARED"}
        assert not outside, f"names outside the documented allowlist reached the child: {outside}"
        assert not names & set(hostile), names & set(hostile)
        assert {"API_TOKEN", "DECLARED", "PATH", "HOME"} <= names
        # Names the kernel keeps for a set-gid exec (AT_SECURE) all arrive.
        assert {"SSL_CERT_FILE", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "LC_CTYPE"} <= names


async def test_an_allowed_host_is_graph_os_on_any_port(write_fleet, http_gateway):
    fleet = write_fleet({
        "ingress": {"url": "https://gw.example.test/mcp"},
        "ingress-port": {"url": "https://GW.example.test:443/other"},
        "elsewhere": {"url": "https://other.example.test/mcp"},
    })
    gw = http_gateway(fleet, "--allowed-host", "gw.example.test")
    async with Client(gw.url, mode="legacy") as c:
        st = structured(await c.call_tool("multiplexer_status", {}))
    issues = {i["server"]: i for i in st["config_issues"]}
    print(f"\nconfig issues: {issues}")
    for name in ("ingress", "ingress-port"):
        assert name not in st["children"], st["children"]
        assert issues[name]["field"] == "url"
        assert issues[name]["reason"].startswith("self-registration-refused: "), issues[name]
    assert "elsewhere" in st["children"] and "elsewhere" not in issues, st
