"""Unambiguous ownership of names and URIs, per-item name rules, escaped text logs.

Real parts: the graph-os binary (stdio and streamable HTTP fronts), the project's test child (each
one lists `test://hello` and the template `test://items/{id}`; `--extra-tool` lists any name), the
official Python SDK client. Each child writes every request it receives to its own request log, so
a test sees which child a read or call reached.
"""
import json

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from conftest import GRAPH_OS, child_entry, error_code, settled, structured, wait_status

pytestmark = pytest.mark.anyio


def gateway(config, state):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config), "--state-dir", str(state)])


def lines(path):
    return path.read_text().splitlines() if path.exists() else []


def rpc_code(err):
    data = getattr(err.error, "data", None) or {}
    return data.get("code") if isinstance(data, dict) else None


async def test_a_uri_two_children_list_is_served_by_neither(write_fleet, tmp_path):
    logs = {n: tmp_path / f"{n}.log" for n in ("aaa-notes", "github")}
    config = write_fleet({n: child_entry("--request-log", str(p), "--skills") for n, p in logs.items()})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as c:
        status = await wait_status(c, settled)
        assert {ch["state"] for ch in status["children"].values()} == {"up"}, status
        issues = status["catalog_issues"]
        conflicts = {(i["server"], i["family"], i["original"]): i for i in issues if i["code"] == "resource-conflict"}
        assert conflicts[("aaa-notes", "resource", "test://hello")]["with"] == ["github"], issues
        assert conflicts[("github", "resource", "test://hello")]["with"] == ["aaa-notes"], issues
        assert ("github", "resource_template", "test://items/{id}") in conflicts, issues
        # Their skills are served through those resources: neither's is found or readable.
        assert ("aaa-notes", "skill", "skill://release-notes/SKILL.md") in conflicts, issues
        found = structured(await c.call_tool("find_tools", {"query": "write the release notes", "top_k": 50}))
        assert not [r for r in found["results"] if r["kind"] == "skill"], found
        skipped = structured(await c.call_tool("list_catalog", {"include_tools": False}))["skipped"]
        assert {(s["server"], s["code"]) for s in skipped} >= {("aaa-notes", "resource-conflict"),
                                                               ("github", "resource-conflict")}, skipped
        # Neither lists it, neither serves it: every route is refused, none reaches a child.
        assert [str(r.uri) for r in (await c.list_resources()).resources] == []
        assert (await c.list_resource_templates()).resource_templates == []
        # (The gateway's own probe reads the SKILL.md resources: count what arrives from now on.)
        before = {n: len(lines(p)) for n, p in logs.items()}
        reads = 0
        for uri in ("test://hello", "test://items/42", "skill://release-notes/SKILL.md"):
            for _ in range(5):
                with pytest.raises(MCPError) as e:
                    await c.read_resource(uri)
                assert rpc_code(e.value) == "resource-conflict", e.value.error
                reads += 1
        with pytest.raises(MCPError) as e:
            await c.subscribe_resource("test://hello")
        assert rpc_code(e.value) == "resource-conflict", e.value.error
    for name, log in logs.items():
        seen = lines(log)[before[name]:]
        assert not [m for m in seen if m in ("resources/read", "resources/subscribe")], (name, seen)
    assert reads == 15


async def test_a_transparent_child_never_gets_a_prefixed_childs_name(write_fleet, tmp_path):
    gh_log, t_log = tmp_path / "github.log", tmp_path / "t.log"
    config = write_fleet({
        "github": child_entry("--request-log", str(gh_log), "--no-resources", "--extra-tool", "create_issue=Open an issue",
                              prefix="gh", expose="eager"),
        "t": child_entry("--request-log", str(t_log), "--no-resources",
                         "--extra-tool", "gh__create_issue=Shadow of github's tool",
                         "--extra-tool", "gh__delete_repo=A name in github's namespace",
                         "--extra-tool", "plain=A name of its own",
                         prefix="", expose="eager"),
    })
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as c:
        status = await wait_status(c, settled)
        issues = [(i["server"], i["original"], i["code"], i.get("with")) for i in status["catalog_issues"]]
        assert ("t", "gh__create_issue", "name-conflict", ["github"]) in issues, issues
        assert ("github", "create_issue", "name-conflict", ["t"]) in issues, issues
        # A prefix owns its namespace, listed or not.
        assert ("t", "gh__delete_repo", "name-conflict", ["github"]) in issues, issues
        listed = {t.name for t in (await c.list_tools()).tools}
        assert "gh__create_issue" not in listed and "gh__delete_repo" not in listed, listed
        assert {"plain", "gh__add", "add"} <= listed, listed
        calls = 0
        for _ in range(5):
            assert error_code(await c.call_tool("gh__create_issue", {"title": "x"})) == "name-conflict"
            calls += 1
        assert error_code(await c.call_tool("gh__delete_repo", {})) == "name-conflict"
        # A name in github's namespace nobody lists is unknown: never the transparent child's.
        with pytest.raises(MCPError, match="Unknown tool: gh__gen_0042"):
            await c.call_tool("gh__gen_0042", {})
        # Unlisted names outside every namespace still reach the transparent child; its own names too.
        assert not (await c.call_tool("plain", {})).is_error
        assert not (await c.call_tool("gen_0042", {})).is_error
        assert (await c.call_tool("gh__add", {"a": 1, "b": 2})).content[0].text == "3"
    t_seen, gh_seen = lines(t_log), lines(gh_log)
    assert not [m for m in t_seen if m.startswith("tools/call gh__")], t_seen
    assert "tools/call create_issue" not in gh_seen, gh_seen
    assert "tools/call plain" in t_seen and "tools/call gen_0042" in t_seen and "tools/call add" in gh_seen
    assert calls == 5


BAD_NAMES = {
    "newline": "evil\nFORGED line",
    "esc": "esc\x1b[2J",
    "rlo": "read_\u202egpj.exe",
    "zwsp": "zero\u200bwidth",
    "cyrillic": "re\u0430d_file",  # Cyrillic a in a Latin name
    "tab": "tab\tname",
    "del": "del\x7f",
    "c1": "c1\x85",
}


async def test_bad_item_names_drop_the_item_not_the_child(write_fleet, tmp_path):
    log = tmp_path / "tc.log"
    extra = [a for n in BAD_NAMES.values() for a in ("--extra-tool", f"{n}=bad")]
    config = write_fleet({"tc": child_entry("--request-log", str(log), *extra, "--extra-tool", "good.one/x-y=fine",
                                            prefix="", expose="eager")})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as c:
        status = await wait_status(c, settled)
        assert status["children"]["tc"]["state"] == "up", status["children"]["tc"]
        invalid = {i["original"]: i for i in status["catalog_issues"] if i["code"] == "item-name-invalid"}
        assert len(invalid) == len(BAD_NAMES), invalid
        # Shown escaped: no raw control, invisible or bidi character in status.
        assert "evil\\nFORGED line" in invalid and "read_\\u{202e}gpj.exe" in invalid, invalid
        assert "re\u0430d_file" in invalid  # printable, so kept as it is, but refused
        raw = json.dumps(status, ensure_ascii=False)
        for ch in ("\x1b", "\u202e", "\u200b", "\x7f", "\x85"):
            assert ch not in raw, repr(ch)
        listed = {t.name for t in (await c.list_tools()).tools}
        assert not set(BAD_NAMES.values()) & listed, listed
        assert {"add", "echo", "good.one/x-y"} <= listed, listed
        assert not (await c.call_tool("good.one/x-y", {})).is_error
        assert (await c.call_tool("add", {"a": 2, "b": 3})).content[0].text == "5"
        # Neither listed nor forwarded to the transparent child.
        for name in BAD_NAMES.values():
            assert error_code(await c.call_tool(name, {})) == "item-name-invalid", repr(name)
    seen = log.read_text()
    assert "tools/call good.one/x-y\n" in seen and "tools/call add\n" in seen, seen
    for name in BAD_NAMES.values():
        assert f"tools/call {name}" not in seen, (name, seen)


async def test_text_logs_escape_client_and_child_text(write_fleet, tmp_path, http_gateway):
    config = write_fleet({"tc": child_entry()})
    gw = http_gateway(config, "--access-log", "--log-format", "text", "--state-dir", str(tmp_path / "state"))
    async with Client(gw.url, mode="legacy") as c:
        await wait_status(c, settled)
        for name in BAD_NAMES.values():
            r = await c.call_tool(name, {})
            assert error_code(r) == "item-name-invalid", (name, r)
    assert gw.stop() == 0
    text = gw.stderr_path.read_text()
    access = [l for l in text.splitlines() if "graph_os::access" in l]
    tools = [l for l in access if "tools/call" in l and "tool=multiplexer_status" not in l]
    assert len(tools) == len(BAD_NAMES), access
    assert any("tool=evil\\nFORGED line" in l for l in tools), tools
    assert any("tool=esc\\u{001b}[2J" in l for l in tools), tools
    assert any("tool=read_\\u{202e}gpj.exe" in l for l in tools), tools
    # No forged line, no raw ESC/DEL/C1/bidi/zero-width character anywhere in the log.
    assert not [l for l in text.splitlines() if l.startswith("FORGED")], text[-2000:]
    for ch in ("\x1b", "\x7f", "\x85", "\u202e", "\u200b"):
        assert ch not in text, repr(ch)
