"""Tenant-exact association of a child's logs and child→client requests (sampling, elicitation,
roots): they reach a session only on exact evidence — the request stream they arrived on
(streamable HTTP), or a connection that is the session's own (per-session) — never "the one
session with a call in flight" on a shared connection.

Real parts only: the real graph-os binary over streamable HTTP, the official Python SDK client,
the project's test child (`--late`: a log line and an elicitation sent after its call answered).
"""
import json
import re

import anyio
import pytest
from mcp import types

from conftest import child_entry, settled, structured, wait_status
from test_trust import DELEGATE, TOKEN_ARGS, client, http_child, text, token_env  # noqa: F401 (fixture)

pytestmark = pytest.mark.anyio

RUNS = 20


class Tenant:
    """One front session's view: the log lines and elicitations that reached it."""

    def __init__(self, name):
        self.name, self.logs, self.asked = name, [], []

    async def logging(self, params):
        self.logs.append(json.dumps(params.data))

    async def elicitation(self, ctx, params):
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": f"from-{self.name}"})


def metric(metrics, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in metrics.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_late_logs_and_requests_of_a_shared_child_never_reach_another_session(write_fleet, http_gateway):
    """A's call ends; its child then logs A's data and asks an elicitation while only B has a
    call in flight on the shared connection: B gets neither (both orders, RUNS runs)."""
    gw = http_gateway(write_fleet({"tc": child_entry("--late")}), *TOKEN_ARGS, env=token_env())
    a, b = Tenant("A"), Tenant("B")
    async with client(gw, DELEGATE, elicitation_callback=a.elicitation, logging_callback=a.logging) as ca, \
            client(gw, DELEGATE, elicitation_callback=b.elicitation, logging_callback=b.logging) as cb:
        await wait_status(ca, settled)
        for c in (ca, cb):
            structured(await c.call_tool("load_tools", {"tools": ["tc__late", "tc__late_seen", "tc__slow"]}))
        pairs = [((a, ca), (b, cb)), ((b, cb), (a, ca))]
        for run in range(RUNS):
            (first, cf), (second, cs) = pairs[run % 2]
            secret = f"secret-of-{first.name}-{run}"
            assert text(await cf.call_tool("tc__late", {"text": secret, "ms": 250})) == "late 250 ms"
            # The other tenant's call is the only one in flight when the late traffic arrives.
            assert text(await cs.call_tool("tc__slow", {"ms": 700})) == "slept 700 ms"
            for t in (a, b):
                assert not any(secret in line for line in t.logs), (t.name, t.logs)
                assert not any(secret in m for m in t.asked), (t.name, t.asked)
        seen = []
        for _ in range(50):
            seen = json.loads(text(await ca.call_tool("tc__late_seen", {})))
            if len(seen) == RUNS:
                break
            await anyio.sleep(0.1)
    assert len(seen) == RUNS, seen
    # Every late request was refused to the child with the stable code's JSON-RPC error.
    assert all(re.search(r"elicit-error: -32001 ", s) for s in seen), seen
    assert (a.logs, b.logs, a.asked, b.asked) == ([], [], [], []), (a.logs, b.logs, a.asked, b.asked)
    metrics = gw.get("/metrics")[1]
    dropped = metric(metrics, "graphos_child_logs_dropped_total", server="tc", reason="unassociated")
    refused = metric(metrics, "graphos_relay_refused_total", server="tc", reason="relay-unassociated")
    print(f"{RUNS} runs: {dropped:.0f} late log lines dropped, {refused:.0f} late requests refused, 0 delivered")
    assert dropped >= RUNS and refused >= RUNS, (dropped, refused)


async def test_a_shared_http_child_relays_by_request_stream_with_both_sessions_in_flight(write_fleet, http_gateway,
                                                                                     request):
    """Streamable HTTP carries the association: the child's elicitation rides the calling request's
    response stream, so each of two overlapping sessions is asked exactly once, by its own call."""
    url = request.getfixturevalue("http_child")
    gw = http_gateway(write_fleet({"hc": {"url": url}}), *TOKEN_ARGS, env=token_env())
    a, b = Tenant("A"), Tenant("B")
    async with client(gw, DELEGATE, elicitation_callback=a.elicitation) as ca, \
            client(gw, DELEGATE, elicitation_callback=b.elicitation) as cb:
        await wait_status(ca, settled)
        for c in (ca, cb):
            structured(await c.call_tool("load_tools", {"tools": ["hc__elicit", "hc__slow"]}))
        for run in range(5):
            answers = {}

            async def ask(name, c):
                answers[name] = text(await c.call_tool("hc__elicit", {"message": f"{name}-{run}"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(cb.call_tool, "hc__slow", {"ms": 600})
                tg.start_soon(ask, "A", ca)
                tg.start_soon(ask, "B", cb)
            assert answers == {"A": 'elicited: accept {"answer":"from-A"}',
                               "B": 'elicited: accept {"answer":"from-B"}'}, answers
        assert a.asked == [f"A-{i}" for i in range(5)] and b.asked == [f"B-{i}" for i in range(5)], (a.asked, b.asked)
