"""Skills over MCP through the real gateway: a real skills server from PyPI (agentskills-mcp-server)
and the test child's `--skills` serve `skill://<name>/SKILL.md` resources; find_tools ranks those
skills with tools in one list, and resources/read of a returned uri through the gateway gives the
SKILL.md. A child without resources still probes fine. Real processes, the official Python SDK
client."""
import json
import os
import re

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, PEERS, child_entry, settled, structured, wait_status

pytestmark = pytest.mark.anyio

SKILLS_VENV = PEERS / "skills-venv"
SKILLS_PYTHON = SKILLS_VENV / "bin" / "python"


def gateway(config, state, *args):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config), "--state-dir", str(state), *args],
                                 env=dict(os.environ))


def skills_server_entry(tmp_path):
    """The real agentskills-mcp-server (its own Python >= 3.12 venv) serving two skill folders."""
    if not SKILLS_PYTHON.exists():
        reason = SKILLS_VENV / ".unavailable"
        if reason.exists():
            pytest.skip(f"agentskills-mcp-server not installed: {reason.read_text().strip()}")
        pytest.fail(f"{SKILLS_PYTHON} is missing: run scripts/install-peers.sh")
    root = tmp_path / "skills"
    docs = {
        "pdf-form-filling": "Fill in PDF forms, list the form fields, fill them and flatten the filled PDF document.",
        "incident-response": "Triage a production outage, page the on-call engineer and write the postmortem.",
    }
    for name, description in docs.items():
        (root / name).mkdir(parents=True)
        (root / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n# {name}\n\nSteps.\n")
    (root / "pdf-form-filling" / "references").mkdir()
    (root / "pdf-form-filling" / "references" / "fields.md").write_text("# Field types\n")
    config = tmp_path / "skills-server.json"
    config.write_text(json.dumps({
        "name": "Skills Server",
        "skills": [{"id": name, "provider": "fs", "options": {"root": str(root)}} for name in docs],
    }))
    # Note: the server parses front matter as strict YAML, so a description with an unquoted ": " would
    # make it refuse to start; graph-os's own parser reads such values as text.
    entry = {"command": str(SKILLS_PYTHON), "args": ["-m", "agentskills_mcp_server", "--config", str(config)]}
    return entry, (root / "pdf-form-filling" / "SKILL.md").read_text()


def rows(found, kind):
    return [r for r in found["results"] if r["kind"] == kind]


def assert_row_shape(row):
    """Tool rows carry tool, input_schema and loaded; skill rows carry uri instead; both staleness."""
    assert isinstance(row["staleness"], (int, float)) and row["staleness"] >= 0, row
    assert re.fullmatch(r"\d+(\.\d)?", str(row["staleness"])), row
    if row["kind"] == "skill":
        assert set(row) == {"kind", "name", "server", "uri", "description", "score", "staleness"}, row
    else:
        assert set(row) == {"kind", "name", "server", "tool", "description", "score", "input_schema", "loaded",
                            "staleness"}, row


async def test_a_real_skills_server_is_found_and_its_skill_read_through_the_gateway(write_fleet, tmp_path):
    entry, pdf_skill = skills_server_entry(tmp_path)
    config = write_fleet({"skills": entry, "calc": child_entry()})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        status = await wait_status(client, settled)
        assert status["children"]["skills"]["state"] == "up", status
        found = structured(await client.call_tool("find_tools", {"query": "fill in a PDF form", "top_k": 5}))
        top = found["results"][0]
        assert top["kind"] == "skill", found
        assert top["uri"] == "skill://pdf-form-filling/SKILL.md", found
        assert top["server"] == "skills" and top["name"] == "pdf-form-filling", top
        for row in found["results"]:
            assert_row_shape(row)
        # Only SKILL.md resources are skills (references/fields.md is a resource, not a skill).
        assert all(r["uri"].endswith("/SKILL.md") for r in rows(found, "skill"))
        read = await client.read_resource(top["uri"])
        assert read.contents[0].text == pdf_skill
        other = structured(await client.call_tool("find_tools", {"query": "production outage postmortem"}))
        assert other["results"][0]["uri"] == "skill://incident-response/SKILL.md", other
        # Tools are still found beside the skills.
        add = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))
        assert add["results"][0]["kind"] == "tool" and add["results"][0]["tool"] == "add", add


async def test_a_child_without_resources_probes_fine_and_its_tools_are_found(write_fleet, tmp_path):
    config = write_fleet({"bare": child_entry("--no-resources")})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        status = await wait_status(client, settled)
        assert status["children"]["bare"]["state"] == "up", status
        assert status["children"]["bare"]["last_error"] is None
        found = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))
        assert found["results"][0]["name"] == "bare__add", found
        assert rows(found, "skill") == []
        catalog = structured(await client.call_tool("list_catalog", {"server": "bare"}))
        assert catalog["server"]["resource_count"] == 0


async def test_test_child_skills_rank_among_tools_and_a_broken_skill_is_left_out(write_fleet, tmp_path):
    # (Two children serving the same skill URIs serve neither: tests/python/test_ownership.py.)
    config = write_fleet({"tc": child_entry("--skills"), "calc": child_entry("--no-resources")})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        await wait_status(client, settled)
        found = structured(await client.call_tool("find_tools", {"query": "write the release notes for a new version",
                                                                 "top_k": 10}))
        assert found["results"][0]["kind"] == "skill", found
        assert found["results"][0]["uri"] == "skill://release-notes/SKILL.md"
        assert found["results"][0]["server"] == "tc"
        assert rows(found, "tool"), "tools rank in the same list"
        for row in found["results"]:
            assert_row_shape(row)
        # CRLF and a folded description in the front matter.
        triage = structured(await client.call_tool("find_tools", {"query": "page the on-call engineer"}))
        assert triage["results"][0]["uri"] == "skill://incident-triage/SKILL.md", triage
        assert triage["results"][0]["description"] == (
            "Triage a production incident: gather the logs, page the on-call engineer and draft the postmortem.")
        add = structured(await client.call_tool("find_tools", {"query": "add two numbers", "top_k": 3}))
        assert add["results"][0]["kind"] == "tool" and add["results"][0]["tool"] == "add"
        assert "uri" not in add["results"][0]
        # The SKILL.md without front matter is a resource but never a skill.
        broken = structured(await client.call_tool("find_tools", {"query": "SKILL.md without front matter",
                                                                  "top_k": 100}))
        assert "skill://broken/SKILL.md" not in [r.get("uri") for r in broken["results"]]
        listed = [r.uri for r in (await client.list_resources()).resources]
        assert "skill://broken/SKILL.md" in [str(u) for u in listed]
        text = (await client.read_resource("skill://release-notes/SKILL.md")).contents[0].text
        assert text.startswith("---\nname: release-notes\n")
        both = structured(await client.call_tool("find_tools", {"query": "release notes incident triage",
                                                                "top_k": 100}))
        assert sorted((r["server"], r["uri"]) for r in rows(both, "skill")) == [
            ("tc", "skill://incident-triage/SKILL.md"), ("tc", "skill://release-notes/SKILL.md")], both


async def test_staleness_is_the_age_of_the_served_catalog(write_fleet, tmp_path):
    config = write_fleet({"calc": child_entry()})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        await wait_status(client, settled)
        first = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))["results"][0]
        await anyio.sleep(1.5)
        later = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))["results"][0]
        assert later["staleness"] >= first["staleness"] + 1.0, (first, later)
        # A refresh lists every child again: the served catalog is confirmed, its age starts over.
        status = structured(await client.call_tool("list_catalog", {"include_tools": False}))
        identity = status["catalog_identity"]
        refreshed = await client.call_tool("catalog_refresh", {
            "request_id": "stale-1", "expected_config_revision": identity["config_revision"],
            "expected_catalog_generation": identity["catalog_generation"],
            "expected_snapshot_digest": identity["snapshot_digest"], "deadline_ms": 30000})
        assert not refreshed.is_error, refreshed
        again = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))["results"][0]
        assert again["staleness"] < later["staleness"], (later, again)
