"""What an HTTP client's connection can make the gateway hold (src/server/listener.rs, the REST
authentication layer in src/server/rest.rs): raw-socket clients that stall mid-body, trickle, or
open connection after connection, against a real gateway with small deadlines, while a legitimate
MCP session calls a child's tool in a loop and the gateway's memory is sampled from /proc."""
import os
import re
import selectors
import socket
import threading
import time

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import child_entry, settled, structured, wait_status

pytestmark = pytest.mark.anyio

TOKENS = {"GW_LIMITS_DELEGATE": "delegate-token-limits-0123456789",
          "GW_LIMITS_DISCOVER": "discover-token-limits-0123456789"}
PER_IP = 100
GLOBAL = 300
BODY_TIMEOUT = 3.0
ARGS = ("--token", "delegate=env://GW_LIMITS_DELEGATE", "--token", "discover=env://GW_LIMITS_DISCOVER",
        "--request-body-timeout", str(BODY_TIMEOUT), "--request-body-grace", "1",
        "--request-body-min-rate", "65536",
        "--max-connections", str(GLOBAL), "--max-connections-per-ip", str(PER_IP))
STALL_AFTER = 1_900_000
MB = 1 << 20


def memory(pid):
    """(VmRSS, VmHWM) of a process, bytes."""
    text = open(f"/proc/{pid}/status").read()
    kb = lambda name: int(re.search(rf"^{name}:\s+(\d+) kB", text, re.M).group(1)) * 1024
    return kb("VmRSS"), kb("VmHWM")


class RssSampler(threading.Thread):
    """The largest VmRSS seen while it runs (sampled every 20 ms)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, memory(pid)[0], threading.Event()

    def run(self):
        while not self.done.wait(0.02):
            self.peak = max(self.peak, memory(self.pid)[0])

    def stop(self):
        self.done.set()
        self.join()
        return self.peak


def connect(port, source):
    """A TCP connection to the gateway from the loopback address `source` (127/8 is all loopback:
    distinct sources are distinct peers for the per-IP cap)."""
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    return s


def post_head(port, path, length, token=None):
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {length}\r\n")
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    return (head + "\r\n").encode()


def push(s, data, timeout=1.0):
    """Sends what the server takes of `data` within `timeout`; the bytes sent (a server that
    answered and closed makes the send fail, which is fine)."""
    s.settimeout(timeout)
    sent = 0
    try:
        while sent < len(data):
            sent += s.send(data[sent:sent + 65536])
    except (socket.timeout, BrokenPipeError, ConnectionResetError):
        pass
    return sent


def answers(socks, timeout):
    """Reads every socket until the server closes it: {socket: (time.monotonic() of the answer's
    first byte, raw bytes)}; sockets still open at `timeout` are left out."""
    sel = selectors.DefaultSelector()
    got, first = {s: b"" for s in socks}, {}
    start = time.monotonic()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    done = {}
    while sel.get_map() and time.monotonic() - start < timeout:
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            try:
                chunk = s.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                chunk = b""
            if chunk:
                first.setdefault(s, time.monotonic())
                got[s] += chunk
            else:
                sel.unregister(s)
                done[s] = (first.get(s), got[s])
    sel.close()
    return done


def parse(raw):
    """(status, lower-cased headers, body) of one HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/1.1 ") else 0
    headers = dict((k.strip().lower(), v.strip()) for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l))
    return status, headers, body


def metric(base, name, reason):
    import urllib.request

    # /metrics is for operators (a discover-scope token where credentials are configured).
    req = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {TOKENS['GW_LIMITS_DISCOVER']}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf'{name}\{{\w+="{re.escape(reason)}"\}} (\d+)', text)
    return int(m.group(1)) if m else 0


async def test_stalled_bodies_and_connection_floods_hold_nothing(write_fleet, http_gateway):
    gw = http_gateway(write_fleet({"tc": child_entry()}), *ARGS, env={**os.environ, **TOKENS})
    port, pid = gw.port, gw.proc.pid
    progress = {"calls": 0, "errors": []}
    stop = anyio.Event()

    async def legitimate():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS['GW_LIMITS_DELEGATE']}"}, timeout=30)
        async with Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as client:
            await wait_status(client, settled)
            structured(await client.call_tool("load_tools", {"servers": ["tc"]}))
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    r = await client.call_tool("tc__add", {"a": i, "b": 1})
                    assert not r.is_error and r.content[0].text == str(i + 1), r
                    progress["calls"] += 1
                except Exception as e:  # recorded, asserted below
                    progress["errors"].append(repr(e))
                await anyio.sleep(0.02)

    async def calls_go_on(label):
        before = progress["calls"]
        deadline = time.monotonic() + 10
        while progress["calls"] < before + 3:
            assert time.monotonic() < deadline, f"the legitimate session stalled {label}"
            await anyio.sleep(0.05)
        assert not progress["errors"], progress["errors"]

    def unauthenticated_flood():
        """200 unauthenticated POSTs (REST and /mcp, from 4 source addresses) that send their
        headers and ~1.9 MB of a larger body, then stall, all open at once."""
        socks = []
        for i in range(200):
            s = connect(port, f"127.0.0.{10 + i % 4}")
            path, length = ("/api/mcp/dispatch", 2_000_000) if i % 2 else ("/mcp", 8_000_000)
            s.sendall(post_head(port, path, length))
            push(s, b"x" * STALL_AFTER, timeout=0.5)
            socks.append(s)
        got = answers(socks, timeout=10)
        for s in socks:
            s.close()
        return got

    def authenticated_stalls():
        """Authenticated bodies that stall (REST and /mcp) and one that trickles."""
        socks, kinds, started = [], {}, {}
        for i in range(4):
            s = connect(port, "127.0.0.30")
            if i % 2:
                s.sendall(post_head(port, "/api/mcp/dispatch", 2_000_000, TOKENS["GW_LIMITS_DELEGATE"]))
            else:
                s.sendall(post_head(port, "/mcp", 8_000_000, TOKENS["GW_LIMITS_DISCOVER"]))
            started[s] = time.monotonic()
            push(s, b"x" * STALL_AFTER, timeout=1.0)
            socks.append(s)
            kinds[s] = "stalled"
        # A credential whose scope is too small is refused from the headers as well (403).
        small = connect(port, "127.0.0.30")
        small.sendall(post_head(port, "/api/mcp/dispatch", 2_000_000, TOKENS["GW_LIMITS_DISCOVER"]))
        started[small] = time.monotonic()
        push(small, b"x" * STALL_AFTER, timeout=1.0)
        socks.append(small)
        kinds[small] = "scope"
        trickle = connect(port, "127.0.0.31")
        trickle.sendall(post_head(port, "/mcp", 1000, TOKENS["GW_LIMITS_DELEGATE"]))
        started[trickle] = time.monotonic()
        kinds[trickle] = "trickle"
        stop_trickle = threading.Event()

        def drip():
            while not stop_trickle.wait(0.25):
                try:
                    trickle.send(b"x" * 10)
                except OSError:
                    return
        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        got = answers(socks + [trickle], timeout=BODY_TIMEOUT + 7)
        stop_trickle.set()
        dripper.join()
        for s in socks + [trickle]:
            s.close()
        late = {"stalled": [], "trickle": [], "scope": []}
        for s, (at, raw) in got.items():
            late[kinds[s]].append((at - started[s] if at else None, raw))
        return late, len(socks) - 1

    def connection_caps():
        """PER_IP idle connections from one address, then one more; then connections from other
        addresses until the global cap."""
        held = [connect(port, "127.0.0.20") for _ in range(PER_IP)]
        over_peer = connect(port, "127.0.0.20")
        peer_answer = answers([over_peer], timeout=5)
        quiet = answers(held, timeout=0.5)
        more = [connect(port, f"127.0.0.{21 + i // 100}") for i in range(200)]
        last = [connect(port, "127.0.0.23") for _ in range(5)]
        refused = answers(more + last, timeout=2)
        for s in held + more + last + [over_peer]:
            s.close()
        return peer_answer.get(over_peer), quiet, refused, more, last

    rss0, hwm0 = None, None
    async with anyio.create_task_group() as tg:
        tg.start_soon(legitimate)
        await calls_go_on("at start")
        rss0, hwm0 = memory(pid)
        sampler = RssSampler(pid)
        sampler.start()

        # 1. Unauthenticated stalled bodies: answered 401 from the headers, the body unread.
        refused_before = metric(gw.base, "graphos_auth_refused_total", "authentication-required")
        t0 = time.monotonic()
        flood = await anyio.to_thread.run_sync(unauthenticated_flood)
        flood_seconds = time.monotonic() - t0
        assert len(flood) == 200, f"{200 - len(flood)} unauthenticated connections still open"
        statuses = [parse(raw)[0] for _, raw in flood.values()]
        assert statuses == [401] * 200, statuses
        for _, raw in flood.values():
            _, headers, body = parse(raw)
            assert headers.get("connection") == "close" and b"authentication-required" in body, raw[:300]
        assert metric(gw.base, "graphos_auth_refused_total", "authentication-required") - refused_before == 200
        flood_peak = sampler.peak
        await calls_go_on("during the unauthenticated flood")

        # 2. Authenticated stalled bodies end at the deadline (408), a trickle at the minimum rate.
        t0 = time.monotonic()
        late, n_stalled = await anyio.to_thread.run_sync(authenticated_stalls)
        assert len(late["stalled"]) == n_stalled, late
        for t, raw in late["stalled"]:
            status, headers, body = parse(raw)
            assert status == 408 and b"request-body-timeout" in body and headers.get("connection") == "close", raw[:300]
            assert BODY_TIMEOUT - 1.5 <= t <= BODY_TIMEOUT + 3, f"closed after {t:.2f} s"
        assert len(late["scope"]) == 1
        t, raw = late["scope"][0]
        status, headers, body = parse(raw)
        assert status == 403 and b"authorization-denied" in body and headers.get("connection") == "close", raw[:300]
        assert t < 1.5, f"403 after {t:.2f} s"
        assert len(late["trickle"]) == 1
        t, raw = late["trickle"][0]
        status, _, body = parse(raw)
        assert status == 408 and b"request-body-too-slow" in body, raw[:300]
        assert t < BODY_TIMEOUT, f"the trickle was cut after {t:.2f} s: the whole-body deadline, not the rate"
        await calls_go_on("after the stalled bodies")

        # 3. Connection caps: 503 + Retry-After written on the accepted socket.
        peer_answer, quiet, refused, more, last = await anyio.to_thread.run_sync(connection_caps)
        assert peer_answer is not None, "the connection over the per-IP cap was not answered"
        status, headers, body = parse(peer_answer[1])
        assert status == 503 and headers.get("retry-after") == "1" and b"peer-connections-exhausted" in body, peer_answer
        assert not quiet, "connections under the per-IP cap were answered or closed"
        for s in last:
            assert s in refused, "a connection over the global cap was kept"
        codes = [parse(raw)[0:3:2] for _, raw in refused.values()]
        assert all(c == 503 and b"connections-exhausted" in b and b"peer-" not in b for c, b in codes), codes
        kept = len(more) - sum(1 for s in more if s in refused)
        # PER_IP held + `kept` + the legitimate client's few connections = GLOBAL.
        assert GLOBAL - PER_IP - 5 <= kept <= GLOBAL - PER_IP - 1, kept
        await calls_go_on("after the connection caps")

        stop.set()

    peak = sampler.stop()
    rss1, hwm1 = memory(pid)
    print(f"\nflood: 200 x 401 in {flood_seconds:.2f} s; RSS {rss0 / MB:.1f} MiB at start, peak {peak / MB:.1f} "
          f"(flood peak {flood_peak / MB:.1f}), end {rss1 / MB:.1f}; VmHWM {hwm0 / MB:.1f} -> {hwm1 / MB:.1f} MiB; "
          f"legitimate calls {progress['calls']}; stalled closed after "
          f"{[round(t, 2) for t, _ in late['stalled']]} s, trickle after {late['trickle'][0][0]:.2f} s")
    assert not progress["errors"], progress["errors"]
    assert peak - rss0 < 20 * MB, f"RSS grew by {(peak - rss0) / MB:.1f} MiB"
    assert hwm1 - max(hwm0, rss0) < 20 * MB, f"VmHWM grew by {(hwm1 - hwm0) / MB:.1f} MiB"
    for reason, least in (("peer-connections-exhausted", 1), ("connections-exhausted", 5),
                          ("request-body-timeout", 4), ("request-body-too-slow", 1)):
        assert metric(gw.base, "graphos_http_refused_total", reason) >= least, reason
