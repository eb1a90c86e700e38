#!/usr/bin/env bash
# The whole test suite: Rust unit/integration tests (nextest when available) and the Python SDK
# acceptance tests against the real binary, real children and real clients.
set -euo pipefail
cd "$(dirname "$0")/.."
export PEERS="${PEERS:-$PWD/.peers}"
[ -x "$PEERS/venv/bin/python" ] && [ -x "$PEERS/tasks-venv/bin/python" ] && [ -f "$PEERS/models/all-MiniLM-L6-v2-int8/SHA256SUMS" ] \
  && command -v redis-server >/dev/null && command -v redis-cli >/dev/null || scripts/install-peers.sh
# The semantic tier's and the shared-session tests must run here, not skip (install-peers.sh
# installs the model, redis-server and nginx).
export GRAPH_OS_REQUIRE_SEMANTIC=1 GRAPH_OS_REQUIRE_SHARED=1
cargo build --workspace --all-targets --locked
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
"$PEERS/venv/bin/python" -m pytest tests/python -q -p no:cacheprovider --durations=15
# Native 2025-11-25 Tasks, on the 2025 Python SDK (its own venv: see tests/tasks/conftest.py).
"$PEERS/tasks-venv/bin/python" -m pytest tests/tasks -q -p no:cacheprovider
