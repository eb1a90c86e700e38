#!/usr/bin/env bash
# Offline checks of everything we ship to Kubernetes: the chart (lint + render with default values and
# each overrides/*.yaml), the rendered manifests, deploy/ and crds/ (kubernetes-validate --strict), the chart's
# copy of the CRD (must equal crds/), and the Dockerfile (hadolint).
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS="${PEERS:-$PWD/.peers}"
PY="$PEERS/venv/bin/python"
KV="$PEERS/venv/bin/kubernetes-validate"
K8S_VERSION="${K8S_VERSION:-1.33.0}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

cmp -s crds/mcpfleet.yaml charts/graph-os/crds/mcpfleet.yaml || {
  echo "charts/graph-os/crds/mcpfleet.yaml differs from crds/mcpfleet.yaml: copy it" >&2; exit 1; }

"$PY" - "$out" <<'PYEOF'
import json, pathlib, sys
import helm_python as helm
out = pathlib.Path(sys.argv[1])
lint = helm.lint("charts/graph-os", strict=True)
errors = [m for m in lint.get("messages", []) if str(m.get("severity", "")).lower() in ("error", "warning")]
print("helm lint:", json.dumps({k: v for k, v in lint.items() if k != "messages"}), f"{len(lint.get('messages', []))} messages")
if lint.get("errors") or errors:
    print(json.dumps(lint, indent=1)); sys.exit(1)
variants = {"default": {}}
for f in sorted(pathlib.Path("overrides").glob("*.yaml")):
    import yaml  # bundled with kubernetes-validate's dependencies
    variants[f.stem] = yaml.safe_load(f.read_text()) or {}
with helm.Chart.load("charts/graph-os") as chart:
    for name, values in variants.items():
        chart.validate_schema(values)
        rendered = chart.render(values, name="graph-os", namespace="graph-os")
        docs = "".join(f"---\n{v}\n" for k, v in sorted(rendered.items()) if v.strip())
        (out / f"chart-{name}.yaml").write_text(docs)
        print(f"rendered chart with {name} values: {docs.count('kind:')} kinds")
PYEOF

for f in "$out"/chart-*.yaml; do
  # ServiceMonitor is a CRD kind (prometheus-operator): kubernetes-validate only warns about unknown kinds.
  "$KV" --strict -k "$K8S_VERSION" "$f"
done
"$KV" --strict -k "$K8S_VERSION" crds/mcpfleet.yaml deploy/base/namespace.yaml deploy/base/gateway.yaml
"$PEERS/venv/bin/hadolint" Dockerfile
echo "k8s checks: ok"
