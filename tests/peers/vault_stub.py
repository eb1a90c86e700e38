"""A test-only stand-in for HashiCorp Vault: exactly the HTTP API graph-os uses, as documented.

No Vault server can be installed here, so this implements, over HTTPS, the documented endpoints:

- KV secrets engine version 2 (https://developer.hashicorp.com/vault/api-docs/secret/kv/kv-v2):
  ``GET /v1/{mount}/data/{path}`` -> ``{"request_id", "lease_id": "", "renewable": false,
  "lease_duration": 0, "data": {"data": {...}, "metadata": {...}}, "wrap_info": null,
  "warnings": null, "auth": null, "mount_type": "kv"}``; 404 ``{"errors": []}`` for a missing
  secret; 403 ``{"errors": ["permission denied"]}`` without a valid ``X-Vault-Token``.
  ``POST``/``PUT /v1/{mount}/data/{path}`` with ``{"data": {...}}`` writes a new version.
- Kubernetes auth (https://developer.hashicorp.com/vault/api-docs/auth/kubernetes):
  ``POST /v1/auth/{mount}/login`` with ``{"role", "jwt"}`` -> ``{"auth": {"client_token",
  "accessor", "policies", "token_policies", "metadata", "lease_duration", "renewable": true,
  "entity_id", "token_type": "service", "orphan": true}, ...}``. Real Vault verifies the JWT with
  the Kubernetes TokenReview API; this stand-in compares it with ``--k8s-jwt`` (the only part that
  is not the real protocol: no API server runs here).
- ``GET /v1/sys/health``.

Test-only introspection (not Vault API): ``GET /_stub/requests`` -> the list of
``[method, path]`` received, so tests can count reads (caching).

Usage: vault_stub.py --port 0 --cert C --key K --root-token T [--k8s-role R --k8s-jwt J]
       [--secret mount/path '{"k": "v"}' ...] ; prints ``READY <port>`` on stdout.
"""
import argparse
import json
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class State:
    def __init__(self, args):
        self.lock = threading.Lock()
        self.tokens = {args.root_token: None}  # token -> expiry (None = never)
        self.k8s = (args.k8s_mount, args.k8s_role, args.k8s_jwt, args.k8s_ttl)
        self.secrets = {}  # "mount/path" -> list of versions (dicts)
        self.mounts = set(args.mount)
        self.requests = []
        for path, data in args.secret or []:
            self.put(path, json.loads(data))

    def put(self, path, data):
        with self.lock:
            self.mounts.add(path.split("/", 1)[0])
            self.secrets.setdefault(path, []).append({"data": data, "created": time.time()})
            return len(self.secrets[path])

    def token_ok(self, token):
        with self.lock:
            if token not in self.tokens:
                return False
            exp = self.tokens[token]
            return exp is None or exp > time.time()


def envelope(data=None, auth=None, lease_duration=0):
    return {"request_id": str(uuid.uuid4()), "lease_id": "", "renewable": False,
            "lease_duration": lease_duration, "data": data, "wrap_info": None, "warnings": None,
            "auth": auth, "mount_type": "kv" if data is not None else ""}


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, status, body):
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}") if n else {}

        def record(self):
            with state.lock:
                state.requests.append([self.command, self.path])

        def do_GET(self):
            self.record()
            path = self.path.split("?", 1)[0]
            if path == "/_stub/requests":
                with state.lock:
                    return self.reply(200, state.requests)
            if path == "/v1/sys/health":
                return self.reply(200, {"initialized": True, "sealed": False, "standby": False,
                                        "version": "stub", "cluster_name": "stub"})
            if not state.token_ok(self.headers.get("X-Vault-Token", "")):
                return self.reply(403, {"errors": ["permission denied"]})
            parts = path.removeprefix("/v1/").split("/", 2)
            if len(parts) == 3 and parts[1] == "data" and parts[0] in state.mounts:
                key = f"{parts[0]}/{parts[2]}"
                with state.lock:
                    versions = state.secrets.get(key)
                if not versions:
                    return self.reply(404, {"errors": []})
                v = versions[-1]
                created = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(v["created"]))
                return self.reply(200, envelope({"data": v["data"], "metadata": {
                    "created_time": created, "custom_metadata": None, "deletion_time": "",
                    "destroyed": False, "version": len(versions)}}))
            return self.reply(404, {"errors": []})

        def do_PUT(self):
            return self.do_POST()

        def do_POST(self):
            self.record()
            path = self.path.split("?", 1)[0]
            mount, role, jwt, ttl = state.k8s
            if path == f"/v1/auth/{mount}/login":
                body = self.body()
                if not role or body.get("role") != role:
                    return self.reply(400, {"errors": [f"invalid role name \"{body.get('role')}\""]})
                if body.get("jwt") != jwt:
                    return self.reply(403, {"errors": ["permission denied"]})
                token = "hvs." + uuid.uuid4().hex
                with state.lock:
                    state.tokens[token] = time.time() + ttl
                return self.reply(200, envelope(auth={
                    "client_token": token, "accessor": uuid.uuid4().hex, "policies": ["default"],
                    "token_policies": ["default"], "metadata": {"role": role, "service_account_name": "graph-os",
                                                                "service_account_namespace": "mcp"},
                    "lease_duration": ttl, "renewable": True, "entity_id": str(uuid.uuid4()),
                    "token_type": "service", "orphan": True}))
            if not state.token_ok(self.headers.get("X-Vault-Token", "")):
                return self.reply(403, {"errors": ["permission denied"]})
            parts = path.removeprefix("/v1/").split("/", 2)
            if len(parts) == 3 and parts[1] == "data":
                version = state.put(f"{parts[0]}/{parts[2]}", self.body().get("data") or {})
                return self.reply(200, envelope({"created_time": "", "custom_metadata": None, "deletion_time": "",
                                                 "destroyed": False, "version": version}))
            return self.reply(404, {"errors": []})

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--root-token", required=True)
    p.add_argument("--mount", action="append", default=["secret"])
    p.add_argument("--k8s-mount", default="kubernetes")
    p.add_argument("--k8s-role", default="")
    p.add_argument("--k8s-jwt", default="")
    p.add_argument("--k8s-ttl", type=int, default=3600)
    p.add_argument("--secret", nargs=2, action="append", metavar=("PATH", "JSON"))
    args = p.parse_args()
    state = State(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(state))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
