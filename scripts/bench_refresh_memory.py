#!/usr/bin/env python3
"""Refresh memory benchmark: a fleet of CHILDREN test children × TOOLS tools each (realistic
descriptions), N catalog refreshes that each change every child's catalog, and the gateway's RSS
before the first and after each refresh. Prints the ratio after/before (target ≤ 1.3).

    scripts/bench_refresh_memory.py [--children 200] [--tools 500] [--refreshes 10]
"""
import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / os.environ.get("PROFILE", "debug")


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=200)
    ap.add_argument("--tools", type=int, default=500)
    ap.add_argument("--refreshes", type=int, default=10)
    ap.add_argument("--pad", type=int, default=400, help="bytes of description padding per tool")
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="graph-os-refresh-bench-"))
    child = str(TARGET / "graph-os-testchild")
    fleet = {f"c{i:03d}": {"command": child, "args": ["--tools", str(args.tools), "--pad-bytes", str(args.pad),
                                                       "--gen-prefix", f"g{i:03d}", "--vary-each-list"],
                           "initializationTimeout": 120, "probeTimeout": 120}
             for i in range(args.children)}
    (tmp / "fleet.json").write_text(json.dumps({"mcpServers": fleet}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "bench-manage-token-0123456789"
    gw = subprocess.Popen([str(TARGET / "graph-os"), "--transport", "streamable-http", "--port", str(port),
                           "--config", str(tmp / "fleet.json"), "--state-dir", str(tmp / "state"),
                           "--token", "manage=env://BENCH_TOKEN"],
                          env={**os.environ, "BENCH_TOKEN": token}, stdout=subprocess.DEVNULL,
                          stderr=open(tmp / "gateway.log", "w"))
    base = f"http://127.0.0.1:{port}"

    def api(method, path, body=None):
        req = urllib.request.Request(base + path, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")
    try:
        deadline = time.monotonic() + 1800
        # Settled: every child up with its tools (at least TOOLS each) in the view, discovery
        # vectors computed, and the generation and tool count stable for 10 s.
        stable_since, last_seen = None, None
        while True:
            try:
                code, status = api("GET", "/api/mcp/status")
                kids = status["children"].values() if code == 200 else []
                up = sum(c["state"] == "up" and c["tool_count"] >= args.tools for c in kids)
                gen = status["catalog_identity"]["catalog_generation"] if code == 200 else 0
                pending = status.get("discovery", {}).get("vectors_pending", 0) if code == 200 else 1
                seen = (gen, status.get("total_tools")) if code == 200 else None
                if up == args.children and gen >= 1 and not pending:
                    if seen != last_seen:
                        stable_since, last_seen = time.monotonic(), seen
                    elif time.monotonic() - stable_since >= 10:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or gw.poll() is not None:
                sys.exit(f"fleet did not come up: {(tmp / 'gateway.log').read_text()[-2000:]}")
            time.sleep(1)
        before = rss_mb(gw.pid)
        tools = status["total_tools"]
        print(f"{args.children} children x {args.tools} tools = {tools} tools; RSS before the first refresh: {before:.0f} MB")
        for i in range(args.refreshes):
            for _attempt in range(5):
                _, cat = api("GET", "/api/mcp/catalog?include_tools=false")
                ident = cat["catalog_identity"]
                t = time.monotonic()
                code, r = api("POST", "/api/mcp/catalog/refresh", {
                    "request_id": f"bench-{i}", "expected_config_revision": ident["config_revision"],
                    "expected_catalog_generation": ident["catalog_generation"],
                    "expected_snapshot_digest": ident["snapshot_digest"], "deadline_ms": 120000})
                secs = time.monotonic() - t
                if r.get("code") not in ("catalog-generation-stale", "catalog-digest-mismatch"):
                    break
            print(f"refresh {i + 1}: {code} {r.get('code', 'generation %s' % r.get('catalog_generation'))} "
                  f"in {secs:.1f} s; RSS {rss_mb(gw.pid):.0f} MB")
        time.sleep(2)
        after = rss_mb(gw.pid)
        if os.environ.get("TRIM_PROBE"):
            subprocess.run(["gdb", "-p", str(gw.pid), "-batch", "-ex", "call (int) malloc_trim(0)"], capture_output=True)
            print(f"after malloc_trim(0) (probe): {rss_mb(gw.pid):.0f} MB")
        print(f"RSS before {before:.0f} MB, after {args.refreshes} refreshes {after:.0f} MB: ratio {after / before:.2f} (target <= 1.30)")
    finally:
        gw.terminate()
        gw.wait(timeout=60)


if __name__ == "__main__":
    main()
