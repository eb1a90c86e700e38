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
        notes = "".join(v for k, v in rendered.items() if k.endswith("NOTES.txt"))
        assert notes.strip(), f"NOTES.txt rendered empty with {name} values"
        warned = "WARNING: sessionStore.type is memory" in notes
        memory = (values.get("sessionStore") or {}).get("type", "memory") == "memory"
        assert warned == (memory and int(values.get("replicaCount", 2)) > 1), (name, notes)
        docs = "".join(f"---\n{v}\n" for k, v in sorted(rendered.items()) if v.strip() and not k.endswith("NOTES.txt"))
        affinity = "sessionAffinity: ClientIP" in docs
        assert affinity == warned, (name, "sessionAffinity must follow the session store")
        if not memory:
            assert "--session-store" in docs and "env://GRAPH_OS_SESSION_STORE_URL" in docs, name
        (out / f"chart-{name}.yaml").write_text(docs)
        print(f"rendered chart with {name} values: {docs.count('kind:')} kinds")
    for bad in ({"sessionStore": {"type": "redis"}},
                {"sessionStore": {"type": "redis", "redis": {"existingSecret": "s", "bundled": {"enabled": True}}}}):
        try:
            chart.render(bad, name="graph-os", namespace="graph-os")
        except Exception as e:
            assert "sessionStore" in str(e), e
            print("refused as expected:", str(e).splitlines()[-1][:160])
        else:
            print("rendered a session store without a Redis:", bad); sys.exit(1)
PYEOF

for f in "$out"/chart-*.yaml; do
  # ServiceMonitor is a CRD kind (prometheus-operator): kubernetes-validate only warns about unknown kinds.
  "$KV" --strict -k "$K8S_VERSION" "$f"
done
"$KV" --strict -k "$K8S_VERSION" crds/mcpfleet.yaml deploy/base/namespace.yaml deploy/base/gateway.yaml
# deploy/overlays/*: their JSON 6902 patches applied to the base (as kustomize does), then validated.
"$PY" - "$out" <<'PYEOF'
import copy, pathlib, sys, yaml
out = pathlib.Path(sys.argv[1])
base = list(yaml.safe_load_all(pathlib.Path("deploy/base/gateway.yaml").read_text()))
def apply(doc, ops):
    for op in ops:
        *parents, last = [p for p in op["path"].split("/")[1:]]
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if op["op"] == "add":
            if isinstance(node, list):
                node.append(op["value"]) if last == "-" else node.insert(int(last), op["value"])
            else:
                node[last] = op["value"]
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise SystemExit(f"unsupported op {op['op']}")
for overlay in sorted(pathlib.Path("deploy/overlays").glob("*/kustomization.yaml")):
    k = yaml.safe_load(overlay.read_text())
    docs = copy.deepcopy(base)
    for patch in k.get("patches", []):
        target = patch["target"]
        ops = yaml.safe_load((overlay.parent / patch["path"]).read_text())
        hits = [d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]]
        assert hits, (overlay, target)
        for d in hits:
            apply(d, ops)
    (out / f"overlay-{overlay.parent.name}.yaml").write_text(yaml.safe_dump_all(docs))
    print(f"overlay {overlay.parent.name}: {len(k.get('patches', []))} patches applied")
PYEOF
"$KV" --strict -k "$K8S_VERSION" "$out"/overlay-*.yaml
"$PEERS/venv/bin/hadolint" Dockerfile
echo "k8s checks: ok"
