#!/usr/bin/env python3
"""Soak: SESSIONS concurrent 2025-era HTTP sessions for MINUTES against a fleet with one
crash-looping child, one child that hangs at initialize and two healthy children. Each session
initializes, loads tools of the healthy and the crash-looping child, then keeps calling them
(and find_tools) with jitter. Prints errors by cause — separating those the faulty children
explain from everything else — and the gateway's RSS growth over the run after warm-up.

    .peers/venv/bin/python scripts/soak.py [--sessions 1000] [--minutes 10] [--warmup 2]

Exit status 1 when an error not caused by a faulty child occurred or RSS grew ≥ 5 % after warm-up.
"""
import argparse
import asyncio
import collections
import json
import os
import pathlib
import random
import socket
import subprocess
import sys
import tempfile
import time

import httpx2

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / os.environ.get("PROFILE", "debug")
FAULTY = {"crashy", "hang"}
# Codes a call to a crash-looping child may legitimately end with.
CRASH_CODES = {"child-transport-closed", "child-unavailable", "child-circuit-open", "child-busy", "child-call-timeout"}


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def sse_messages(text):
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]


class Session:
    def __init__(self, http, url, stats):
        self.http, self.url, self.stats, self.sid, self.next = http, url, stats, None, 0

    async def rpc(self, method, params=None, notify=False):
        body = {"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})}
        if not notify:
            self.next += 1
            body["id"] = self.next
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.sid:
            headers.update({"Mcp-Session-Id": self.sid, "MCP-Protocol-Version": "2025-11-25"})
        r = await self.http.post(self.url, content=json.dumps(body), headers=headers)
        if r.status_code >= 400:
            raise RuntimeError(f"http-{r.status_code}")
        if method == "initialize":
            self.sid = r.headers.get("mcp-session-id")
        if notify:
            return None
        for m in sse_messages(r.text) if "event-stream" in r.headers.get("content-type", "") else [r.json()]:
            if m.get("id") == body["id"]:
                if "error" in m:
                    raise RuntimeError(f"rpc-{m['error'].get('code')}")
                return m["result"]
        raise RuntimeError("no-response")

    async def call(self, tool, args, server):
        started = time.monotonic()
        try:
            result = await self.rpc("tools/call", {"name": tool, "arguments": args})
        except Exception as e:  # noqa: BLE001 - every failure is counted by cause
            self.stats[(server, type(e).__name__ + ":" + str(e)[:40])] += 1
            return
        if result.get("isError"):
            code = result["content"][0]["text"].split(":", 1)[0]
            self.stats[(server, code)] += 1
        else:
            self.stats[(server, "ok")] += 1
        self.stats[("latency", "max_ms")] = max(self.stats[("latency", "max_ms")], int((time.monotonic() - started) * 1000))


async def run_session(i, url, stats, stop, limits, delay):
    await asyncio.sleep(delay)  # sessions ramp up over the first half of the warm-up
    async with httpx2.AsyncClient(timeout=60, limits=limits) as http:
        s = Session(http, url, stats)
        try:
            await s.rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                       "clientInfo": {"name": f"soak-{i}", "version": "0"}})
            await s.rpc("notifications/initialized", notify=True)
            await s.rpc("tools/call", {"name": "load_tools", "arguments": {"tools": ["h1__add", "h2__echo", "crashy__add"]}})
        except Exception as e:  # noqa: BLE001
            stats[("session", f"setup:{type(e).__name__}:{str(e)[:30]}")] += 1
            return
        stats[("session", "ok")] += 1
        n = 0
        while not stop.is_set():
            await asyncio.sleep(random.uniform(0.5, 1.5))
            n += 1
            await s.call("h1__add", {"a": i, "b": n}, "h1")
            await s.call("h2__echo", {"text": f"s{i}-{n}"}, "h2")
            await s.call("crashy__add", {"a": 1, "b": 1}, "crashy")
            if n % 10 == 0:
                try:
                    found = await s.rpc("tools/call", {"name": "find_tools", "arguments": {"query": "add numbers"}})
                    if found.get("isError"):
                        stats[("find_tools", "error")] += 1
                    else:
                        stats[("find_tools", "ok")] += 1
                except Exception as e:  # noqa: BLE001
                    stats[("find_tools", str(e)[:40])] += 1


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=2, help="minutes of the run (after setup) excluded from the RSS growth figure")
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="graph-os-soak-"))
    child = str(TARGET / "graph-os-testchild")
    fleet = {
        "h1": {"command": child, "prefix": "h1", "maxConcurrency": 64},
        "h2": {"command": child, "prefix": "h2", "maxConcurrency": 64},
        # 100 restarts per second: a budget that never runs out, so the child keeps crash-looping.
        "crashy": {"command": child, "args": ["--exit-after", "25"], "prefix": "crashy", "maxRestarts": 100,
                   "restartWindow": 1, "maxConcurrency": 64, "callTimeout": 5},
        "hang": {"command": child, "args": ["--hang-init"], "prefix": "hang", "initializationTimeout": 3,
                 "maxRestarts": 100, "restartWindow": 1},
    }
    (tmp / "fleet.json").write_text(json.dumps({"mcpServers": fleet}))
    check = subprocess.run([str(TARGET / "graph-os"), "validate", "--config", str(tmp / "fleet.json")],
                           capture_output=True, text=True)
    if check.returncode != 0:
        sys.exit(f"soak fleet invalid: {check.stdout}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gw = subprocess.Popen([str(TARGET / "graph-os"), "--transport", "streamable-http", "--port", str(port),
                           "--config", str(tmp / "fleet.json"), "--state-dir", str(tmp / "state"),
                           "--max-sessions", str(args.sessions + 100), "--max-sessions-per-principal", str(args.sessions + 100)],
                          stdout=subprocess.DEVNULL, stderr=open(tmp / "gateway.log", "w"))
    url = f"http://127.0.0.1:{port}/mcp"
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            await asyncio.sleep(0.1)
    await asyncio.sleep(3)
    stats, stop = collections.Counter(), asyncio.Event()
    limits = httpx2.Limits(max_connections=1, max_keepalive_connections=1)
    ramp = args.warmup * 30  # seconds: half the warm-up
    tasks = [asyncio.create_task(run_session(i, url, stats, stop, limits, ramp * i / args.sessions))
             for i in range(args.sessions)]
    # The run is `minutes` long with every session set up: the clock starts once the last session
    # finished its setup (a Python client needs minutes to open 1,000 sessions), so the RSS window
    # (after the warm-up) never includes the ramp.
    begun, started, samples = time.monotonic(), None, []
    try:
        while started is None or time.monotonic() - started < args.minutes * 60:
            await asyncio.sleep(10)
            set_up = sum(n for (target, _), n in stats.items() if target == "session")
            if started is None and (set_up >= args.sessions or time.monotonic() - begun > 900):
                started = time.monotonic()
                print(f"all {set_up} sessions set up after {started - begun:.0f} s: the {args.minutes} min run starts", flush=True)
            t = time.monotonic() - (started or time.monotonic())
            samples.append((t, rss_mb(gw.pid)))
            print(f"t={t:.0f}s RSS {samples[-1][1]:.0f} MB sessions {stats[('session', 'ok')]} "
                  f"h1 ok {stats[('h1', 'ok')]} crashy ok {stats[('crashy', 'ok')]}", flush=True)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        gw.terminate()
        gw.wait(timeout=60)
    print("\nresults by (target, cause):")
    unexpected = 0
    for (target, cause), n in sorted(stats.items()):
        if cause == "ok" or target == "latency":
            print(f"  {target:10} {cause:40} {n}")
            continue
        explained = target in FAULTY and cause in CRASH_CODES
        unexpected += 0 if explained else n
        print(f"  {target:10} {cause:40} {n}  {'(faulty child)' if explained else 'UNEXPECTED'}")
    after_warmup = [r for t, r in samples if t >= args.warmup * 60]  # t < 0 never: set before the run
    growth = (after_warmup[-1] - after_warmup[0]) / after_warmup[0] * 100 if len(after_warmup) >= 2 else 0.0
    print(f"\nRSS after warm-up: {after_warmup[0] if after_warmup else 0:.0f} -> {after_warmup[-1] if after_warmup else 0:.0f} MB "
          f"({growth:+.1f} %); errors not caused by the faulty children: {unexpected}")
    sys.exit(1 if unexpected or growth >= 5 else 0)


if __name__ == "__main__":
    asyncio.run(main())
