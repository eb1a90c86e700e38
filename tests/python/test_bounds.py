"""Trust boundary II, bounded child input while it streams: a 600 MB SSE line, a 500 MB stderr
line and a 100 MB stdout line each leave the gateway's peak RSS under 100 MB; the offending
child fails with `child-frame-too-large` (stderr is not a protocol stream: that child keeps
serving), and the other children keep serving.

Real parts: the graph-os binary over stdio with the official Python SDK client, the project's
test child (fault modes --stdout-flood / --stderr-flood) and a raw legacy-SSE child.
"""
import os
import time

import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, child_entry, settled, structured, wait_status
from trust_peers import SseStub, children_of, peak_rss_mb

pytestmark = pytest.mark.anyio

MB = 1 << 20


def gateway_pid():
    """The graph-os process started by the SDK client (a child of this test process)."""
    found = [p for p, state, comm in children_of(os.getpid()) if comm.startswith("graph-os")]
    assert len(found) == 1, found
    return found[0]


async def add_works(c, server):
    """Loads the server's tools and calls its `add` through the gateway."""
    loaded = structured(await c.call_tool("load_tools", {"servers": [server]}))
    names = [n for n in loaded["loaded"] + loaded["already_loaded"] if n.endswith("__add")]
    assert names, loaded
    r = await c.call_tool(names[0], {"a": 20, "b": 22})
    assert not r.is_error and r.content[0].text == "42", r


async def test_a_600_mb_sse_line_is_cut_at_its_bound(tmp_path, write_fleet):
    def script(send):
        send(b"event: endpoint\ndata: /messages\n\ndata: ")
        chunk = b"a" * MB
        try:
            for _ in range(600):
                send(chunk)
        except OSError:
            pass

    sse = SseStub(script)
    try:
        fleet = write_fleet({"sse": {"url": sse.url, "transport": "sse"}, "ok": child_entry()})
        params = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)], env=dict(os.environ))
        started = time.monotonic()
        async with Client(params, mode="legacy") as c:
            st = await wait_status(c, settled, timeout=120)
            pid = gateway_pid()
            peak = peak_rss_mb(pid)
            elapsed = time.monotonic() - started
            sse_state = st["children"]["sse"]
            assert sse_state["state"] == "failed", sse_state
            assert sse_state["last_error"]["code"] == "child-frame-too-large", sse_state
            assert st["children"]["ok"]["state"] == "up"
            await add_works(c, "ok")
            print(f"SSE flood: child sent {sse.sent / MB:.0f} MiB before the drop; gateway peak RSS {peak:.1f} MiB; "
                  f"{elapsed:.1f} s")
            assert peak < 100, peak
            # The connection was dropped at the bound: the child could not push 600 MB.
            assert sse.sent < 200 * MB, sse.sent
    finally:
        sse.close()


async def test_a_500_mb_stderr_line_is_drained_in_bounded_chunks(tmp_path, write_fleet):
    fleet = write_fleet({"noisy": child_entry("--stderr-flood", str(500 * MB)), "ok": child_entry()})
    params = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)],
                                   env={**os.environ, "RUST_LOG": "info,graph_os::child_stderr=debug"})
    started = time.monotonic()
    async with Client(params, mode="legacy") as c:
        await wait_status(c, settled, timeout=120)
        pid = gateway_pid()
        # Wait until the child has written all of it (it logs a marker line afterwards) — the
        # gateway keeps draining while the child serves.
        deadline = time.monotonic() + 180
        noisy_pid = None
        while time.monotonic() < deadline:
            kids = [p for p, s, comm in children_of(pid) if comm.startswith("graph-os-testch")]
            io = {}
            for p in kids:
                try:
                    io[p] = int(next(ln for ln in open(f"/proc/{p}/io") if ln.startswith("wchar:")).split()[1])
                except (OSError, StopIteration):
                    pass
            big = [p for p, w in io.items() if w >= 500 * MB]
            if big:
                noisy_pid = big[0]
                break
            await __import__("anyio").sleep(0.5)
        assert noisy_pid, "the child never finished writing its stderr line"
        await __import__("anyio").sleep(1.0)
        peak = peak_rss_mb(pid)
        st = await wait_status(c, settled)
        print(f"stderr flood: 500 MiB line drained; gateway peak RSS {peak:.1f} MiB; {time.monotonic() - started:.1f} s")
        assert peak < 100, peak
        assert st["children"]["noisy"]["state"] == "up" and st["children"]["ok"]["state"] == "up", st
        await add_works(c, "noisy")
        await add_works(c, "ok")


async def test_a_100_mb_stdout_line_fails_the_child_with_a_typed_code(tmp_path, write_fleet):
    fleet = write_fleet({"flood": child_entry("--stdout-flood", str(100 * MB)), "ok": child_entry()})
    params = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet)], env=dict(os.environ))
    started = time.monotonic()
    async with Client(params, mode="legacy") as c:
        st = await wait_status(c, settled, timeout=120)
        peak = peak_rss_mb(gateway_pid())
        print(f"stdout flood: 100 MiB line; gateway peak RSS {peak:.1f} MiB; {time.monotonic() - started:.1f} s")
        flood = st["children"]["flood"]
        assert flood["state"] == "failed", flood
        assert flood["last_error"]["code"] == "child-frame-too-large", flood
        assert peak < 100, peak
        await add_works(c, "ok")
