"""Domain-first discovery through the real gateway: a query that names a server still starting waits
for it (at most the discovery budget for the whole request) and ranks its tool over look-alikes of
other servers; a query that names no starting server answers at once and lists it as unavailable.
Real gateway, real test children (one slow to initialize), the official Python SDK client."""
import os
import time

import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, child_entry, structured, wait_status

pytestmark = pytest.mark.anyio

GITLAB_TOOL = "create_merge_request=Create a merge request to merge a source branch into a target branch"
GITHUB_TOOL = "create_pull_request=Create a pull request (merge request) to merge a branch into another branch"


def gateway(config, state, *args):
    return StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(config), "--state-dir", str(state), *args],
                                 env=dict(os.environ))


async def timed_find(client, query):
    started = time.monotonic()
    found = structured(await client.call_tool("find_tools", {"query": query, "top_k": 5}))
    return found, time.monotonic() - started


async def test_a_query_naming_a_starting_server_waits_for_it_and_others_never_wait(write_fleet, tmp_path):
    config = write_fleet({
        "gitlab": child_entry("--init-delay-ms", "4000", "--extra-tool", GITLAB_TOOL),
        "github": child_entry("--extra-tool", GITHUB_TOOL),
    })
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        started = time.monotonic()
        await wait_status(client, lambda ch: ch["github"]["state"] == "up", timeout=20)
        status = structured(await client.call_tool("multiplexer_status", {}))
        assert status["children"]["gitlab"]["state"] == "starting", "gitlab came up too early for this test"

        # Names no server that is starting: answered at once, gitlab listed as unavailable.
        found, took = await timed_find(client, "add two numbers")
        print(f"unrelated query with gitlab starting: {took * 1000:.0f} ms")
        assert took < 1.0, took
        assert found["unavailable"] == {"gitlab": "child-starting"}, found
        assert "waited_for" not in found
        assert (found["results"][0]["server"], found["results"][0]["tool"]) == ("github", "add"), found
        # Names github (up): no wait either, and its look-alike is what there is.
        found, took = await timed_find(client, "open a merge request on github")
        assert took < 1.0, took
        assert found["results"][0]["tool"] == "create_pull_request", found

        # Names gitlab, still starting: waits for it (within the 5 s budget), then ranks it first.
        assert time.monotonic() - started < 3.5, "gitlab may be up already"
        found, took = await timed_find(client, "open a merge request in GitLab")
        print(f"query naming gitlab while it starts: waited {took * 1000:.0f} ms")
        assert found["waited_for"] == ["gitlab"], found
        assert 0.3 < took < 5.0 + 1.0, took
        assert found["unavailable"] == {}, found
        assert (found["results"][0]["server"], found["results"][0]["tool"]) == ("gitlab", "create_merge_request"), found
        servers = [r["server"] for r in found["results"]]
        assert "github" in servers, "the look-alike is still listed, below"


async def test_the_wait_for_a_named_server_is_bounded_by_the_discovery_budget(write_fleet, tmp_path):
    config = write_fleet({
        "gitlab": child_entry("--hang-init", "--extra-tool", GITLAB_TOOL),
        "github": child_entry("--extra-tool", GITHUB_TOOL),
    })
    async with Client(gateway(config, tmp_path / "state", "--discovery-budget", "1.5"), mode="legacy") as client:
        await wait_status(client, lambda ch: ch["github"]["state"] == "up", timeout=20)
        found, took = await timed_find(client, "open a merge request in GitLab")
        print(f"query naming a hanging gitlab, budget 1.5 s: {took * 1000:.0f} ms")
        assert 1.2 < took < 1.5 + 1.0, took
        assert found["unavailable"] == {"gitlab": "child-starting"}, found
        assert found["results"][0]["server"] == "github", "answers with what is ready"
