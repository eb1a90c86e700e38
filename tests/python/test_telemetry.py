"""Logs, traces and metrics (docs/operations.md "Logs, traces and metrics").

Real parts: the graph-os binary (streamable HTTP and stdio fronts), the project's test child, a
FastMCP child over streamable HTTP that answers with the trace headers of its own HTTP request,
the official Python SDK client, and an OTLP/HTTP receiver written here that decodes the
protobuf export with the official `opentelemetry-proto` package.

- Traces: a `tools/call` over HTTP is a `POST /mcp` server span (the caller's `traceparent`
  header is its parent), a `tools/call <tool>` span under it, the child call `call
  <server>/<tool>` under that (with its `queue_wait`), and the HTTP child receives a
  `traceparent` header naming the child call span; over stdio the `tools/call` span is the
  root. Spans still buffered at SIGTERM are flushed. Child probes are spans too.
- Logs: `--log-format json` lines each parse as JSON (jq and Python); `--access-log` writes
  one `graph_os::access` line per request with the principal as a digest.
- Child failures are WARN lines with their root cause ("Connection refused"), also kept in
  status; a child's secret values never reach a log line or the status (canaries).
- Per-tool metrics appear on /metrics after a call.
"""
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, PYTHON, child_entry, free_port, settled, structured, wait_status

pytestmark = pytest.mark.anyio

HEADERS_CHILD = '''
import sys
from fastmcp import Context, FastMCP
from fastmcp.server.dependencies import get_http_headers

mcp = FastMCP("hdr")


@mcp.tool
def headers(ctx: Context) -> dict:
    """The trace context this call arrived with: its HTTP header and its _meta."""
    h = get_http_headers(include_all=True)
    meta = ctx.request_context.meta if ctx.request_context else None
    extra = meta if isinstance(meta, dict) else (meta.model_dump() if meta is not None else {})
    return {"header": h.get("traceparent"), "meta": extra.get("traceparent")}


mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False, log_level="WARNING",
        stateless_http=True)
'''


class OtlpReceiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces with an ExportTraceServiceRequest (protobuf)."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.spans, self.posts, self.lock = [], 0, threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces" or "protobuf" not in self.headers.get("Content-Type", ""):
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, request):
        with self.lock:
            self.posts += 1
            for rs in request.resource_spans:
                resource = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        attrs = {}
                        for kv in sp.attributes:
                            v = kv.value
                            attrs[kv.key] = v.string_value if v.HasField("string_value") else (
                                v.int_value if v.HasField("int_value") else v.bool_value)
                        self.spans.append({
                            "trace": sp.trace_id.hex(), "id": sp.span_id.hex(), "parent": sp.parent_span_id.hex(),
                            "name": sp.name, "kind": sp.kind, "attrs": attrs, "status": sp.status.code,
                            "service": resource.get("service.name"),
                        })

    def named(self, name, trace=None):
        with self.lock:
            return [s for s in self.spans if s["name"] == name and (trace is None or s["trace"] == trace)]

    def wait(self, name, trace=None, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.named(name, trace)
            if found:
                return found
            time.sleep(0.1)
        with self.lock:
            names = sorted({(s["name"], s["trace"]) for s in self.spans})
        raise AssertionError(f"no span {name!r} in trace {trace}; have {names}")

    def stop(self):
        self.server.shutdown()


@pytest.fixture
def otlp():
    r = OtlpReceiver()
    yield r
    r.stop()


@pytest.fixture
def headers_child(tmp_path):
    script = tmp_path / "headers_child.py"
    script.write_text(HEADERS_CHILD)
    port = free_port()
    proc = subprocess.Popen([str(PYTHON), str(script), str(port)], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "headers_child.log", "w"))
    import socket

    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, (tmp_path / "headers_child.log").read_text()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.monotonic() < deadline, "the headers child did not listen"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()


def rpc(gw, method, params, headers=None, principal="alice", timeout=30):
    """One raw 2026-07-28 request (no session); returns the JSON-RPC answer."""
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}}}
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "Mcp-Principal": principal, **(headers or {})}
    if method == "tools/call":
        h["Mcp-Name"] = params["name"]
    req = urllib.request.Request(gw.url, method="POST", headers=h, data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        text = e.read().decode()
    for line in text.splitlines():
        if line.startswith("data: ") and '"id":7' in line.replace(" ", ""):
            return json.loads(line[6:])
    return json.loads(text)


def json_lines(path):
    """Every line of a --log-format json log, parsed (each one must be a JSON object)."""
    # jq (installed by scripts/install-peers.sh) reads the file as a stream of JSON values: one
    # per line, or it fails.
    assert shutil.which("jq"), "jq is missing: run scripts/install-peers.sh"
    with open(path) as f:
        subprocess.run(["jq", "-e", "-c", "select(type == \"object\")"], stdin=f, check=True,
                       stdout=subprocess.DEVNULL)
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise AssertionError(f"line {n} is not JSON: {line!r}") from e
            assert isinstance(obj, dict), line
            out.append(obj)
    return out


def settle_http(gw, names, timeout=30):
    async def go():
        async with Client(gw.url, mode="legacy") as c:
            await wait_status(c, lambda ch: all(ch.get(n, {}).get("state") in ("up", "failed") for n in names),
                              timeout=timeout)
            return structured(await c.call_tool("multiplexer_status", {}))
    return go()


async def test_http_traces_access_log_json_lines_and_tool_metrics(write_fleet, http_gateway, otlp, headers_child):
    fleet = write_fleet({
        "hdr": {"url": headers_child, "expose": "eager"},
        "tc": child_entry(expose="eager"),
    })
    gw = http_gateway(fleet, "--otlp-endpoint", otlp.url, "--access-log", "--log-format", "json")
    status = await settle_http(gw, ["hdr", "tc"])
    assert status["children"]["hdr"]["state"] == "up", status

    # The caller's trace context (a W3C traceparent header) is the parent of the front span.
    trace_id, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    answer = rpc(gw, "tools/call", {"name": "hdr__headers", "arguments": {}},
                 headers={"traceparent": f"00-{trace_id}-{caller_span}-01"})
    assert "result" in answer and not answer["result"].get("isError"), answer
    seen = answer["result"].get("structuredContent") or json.loads(answer["result"]["content"][0]["text"])
    seen = seen.get("result", seen)
    # The HTTP child got the child call span's context as a header (and in _meta, SEP-414).
    assert seen["header"] and seen["header"].split("-")[1] == trace_id, seen
    assert seen["meta"] == seen["header"], seen

    # A second call without a traceparent: a new trace, rooted at the front span.
    answer = rpc(gw, "tools/call", {"name": "tc__add", "arguments": {"a": 2, "b": 3}})
    assert "result" in answer and not answer["result"].get("isError"), answer

    code, metrics = gw.get("/metrics")
    assert code == 200
    assert 'graphos_tool_calls_total{server="hdr",tool="headers",code="ok"} 1' in metrics, metrics
    assert 'graphos_tool_calls_total{server="tc",tool="add",code="ok"} 1' in metrics, metrics
    assert 'graphos_tool_call_duration_seconds_count{server="hdr",tool="headers"} 1' in metrics, metrics
    assert 'graphos_tool_call_duration_seconds_count{server="tc",tool="add"} 1' in metrics, metrics

    # SIGTERM flushes what the batch exporter still holds.
    assert gw.stop() == 0

    (front,) = otlp.wait("POST /mcp", trace_id)
    assert front["parent"] == caller_span, front
    assert front["kind"] == 2, front  # SERVER
    assert front["service"] == "graph-os", front
    assert front["attrs"].get("mcp.method.name") == "tools/call", front
    assert front["attrs"].get("gen_ai.tool.name") == "hdr__headers", front
    assert front["attrs"].get("http.response.status_code") == 200, front
    (call,) = otlp.wait("tools/call hdr__headers", trace_id)
    assert call["parent"] == front["id"], (call, front)
    (child,) = otlp.wait("call hdr/headers", trace_id)
    assert child["parent"] == call["id"], (child, call)
    assert child["kind"] == 3, child  # CLIENT
    assert child["attrs"].get("code") == "ok", child
    (queue,) = otlp.wait("queue_wait", trace_id)
    assert queue["parent"] == child["id"], queue
    # The header the child saw names the child call span.
    assert seen["header"] == f"00-{trace_id}-{child['id']}-01", (seen, child)

    (add,) = otlp.wait("call tc/add")
    (add_call,) = otlp.wait("tools/call tc__add", add["trace"])
    assert add["parent"] == add_call["id"]
    (add_front,) = otlp.wait("POST /mcp", add["trace"])
    assert add_call["parent"] == add_front["id"] and add_front["parent"] == "", add_front
    # Children's probes are spans (their own traces).
    probes = otlp.wait("probe tc")
    assert {p["attrs"].get("step") for p in probes} >= {"connect", "list"}, probes

    # Every log line is JSON; the access log has one line per request, the principal digested.
    lines = json_lines(gw.stderr_path)
    access = [l for l in lines if l.get("target") == "graph_os::access"]
    assert access, lines[-5:]
    (line,) = [l for l in access if l.get("tool") == "hdr__headers"]
    assert line["method"] == "POST" and line["path"] == "/mcp" and line["status"] == 200, line
    assert line["mcp_method"] == "tools/call" and line["level"] == "INFO", line
    assert isinstance(line["duration_ms"], (int, float)) and line["duration_ms"] >= 0, line
    assert line["principal"] == hashlib.sha256(b"handle:alice").hexdigest()[:16], line
    assert not any("handle:alice" in json.dumps(l) for l in access)
    assert any(l.get("path") == "/metrics" and l.get("status") == 200 and l.get("mcp_method") == "-" for l in access)
    assert all({"timestamp", "level", "target", "message"} <= set(l) for l in lines), lines[:3]


def test_admin_api_access_lines_carry_the_token_digest_and_a_fatal_error_is_a_json_record(write_fleet, http_gateway, tmp_path):
    fleet = write_fleet({"tc": child_entry()})
    token = "tel-admin-canary-" + os.urandom(6).hex()
    env = {**os.environ, "TEL_ADMIN": token}
    gw = http_gateway(fleet, "--access-log", "--log-format", "json", "--token", "manage=env://TEL_ADMIN", env=env)
    assert gw.json("GET", "/api/mcp/status", token=token)[0] == 200
    assert gw.json("GET", "/api/mcp/status")[0] == 401
    assert gw.stop() == 0
    lines = json_lines(gw.stderr_path)
    rest = [l for l in lines if l.get("target") == "graph_os::access" and l.get("path") == "/api/mcp/status"]
    assert [l["status"] for l in rest] == [200, 401], rest
    # The REST caller's principal is the digest of its subject (`token:<16 hex>`), never the token.
    subject = "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    assert rest[0]["principal"] == hashlib.sha256(subject.encode()).hexdigest()[:16], rest
    assert rest[1]["principal"] == "-", rest
    assert token not in gw.stderr_path.read_text()

    # A gateway that cannot start says why as a JSON record (a log pipeline parses every line).
    bad = tmp_path / "missing.json"
    run = subprocess.run([str(GRAPH_OS), "--log-format", "json", "--config", str(bad)],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert run.returncode != 0
    records = [json.loads(l) for l in run.stderr.splitlines() if l.strip()]
    assert records and records[-1]["level"] == "ERROR", run.stderr
    assert "missing.json" in json.dumps(records[-1]), records[-1]


async def test_stdio_front_span_is_the_root_of_the_child_call(write_fleet, otlp, tmp_path):
    fleet = write_fleet({"tc": child_entry(expose="eager")})
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_SERVICE_NAME": "gw-stdio",
           "OTEL_BSP_SCHEDULE_DELAY": "100"}
    params = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet), "--state-dir",
                                                                str(tmp_path / "state")], env=env)
    async with Client(params, mode="legacy") as c:
        await wait_status(c, settled)
        r = await c.call_tool("tc__add", {"a": 1, "b": 2})
        assert not r.is_error and r.content[0].text == "3", r
        # A caller's own _meta.traceparent (SEP-414) is honoured on stdio.
        tid = "0af7651916cd43dd8448eb211c80319c"
        r = await c.call_tool("tc__add", {"a": 2, "b": 2},
                              meta={"traceparent": f"00-{tid}-b7ad6b7169203331-01"})
        assert not r.is_error, r
        (child,) = await anyio.to_thread.run_sync(lambda: otlp.wait("call tc/add", tid))
    (call,) = otlp.wait("tools/call tc__add", tid)
    assert call["parent"] == "b7ad6b7169203331" and child["parent"] == call["id"], (call, child)
    assert call["service"] == "gw-stdio", call
    roots = [s for s in otlp.named("tools/call tc__add") if s["trace"] != tid]
    assert len(roots) == 1 and roots[0]["parent"] == "", roots
    assert any(s["parent"] == roots[0]["id"] for s in otlp.named("call tc/add")), otlp.named("call tc/add")


async def test_child_failures_warn_with_root_cause_and_never_a_secret(write_fleet, http_gateway):
    canary_env, canary_header = "canary-env-7f3a9c1e5d", "canary-hdr-2b8e6f4a90"
    closed = free_port()
    fleet = write_fleet({
        # Prints its secret on stderr and stdout, then dies before answering.
        "leaky": {"command": "sh", "args": ["-c", 'echo "token is $API_TOKEN" >&2; echo "{bad $API_TOKEN"; exit 3'],
                  "env": {"API_TOKEN": "env://LEAKY_TOKEN"}, "maxRestarts": 0},
        # Nothing listens there: the cause is "Connection refused", deep in the error chain.
        "dead": {"url": f"http://127.0.0.1:{closed}/mcp", "headers": {"Authorization": "Bearer ${DEAD_TOKEN}"},
                 "maxRestarts": 0},
    })
    env = {**os.environ, "LEAKY_TOKEN": canary_env, "DEAD_TOKEN": canary_header, "GRAPH_OS_LOG": "debug,rmcp=warn",
           "GRAPH_OS_LOG_FORMAT": "json"}
    gw = http_gateway(fleet, env=env)
    status = await settle_http(gw, ["leaky", "dead"])
    children = status["children"]
    assert children["dead"]["state"] == "failed", children["dead"]
    dead = children["dead"]["last_error"]
    assert dead["code"] == "child-initialize-failed", dead
    assert "Connection refused" in dead["message"], dead
    assert len(dead["message"]) <= 520, dead
    assert children["leaky"]["state"] == "failed", children["leaky"]
    assert gw.stop() == 0

    text = gw.stderr_path.read_text()
    for canary in (canary_env, canary_header):
        assert canary not in text
        assert canary not in json.dumps(status)
    lines = json_lines(gw.stderr_path)
    warned = [l for l in lines if l["level"] == "WARN" and l.get("server") == "dead"
              and l.get("message") in ("child connection failed", "child failed")]
    assert warned and all("Connection refused" in l["error"] for l in warned), warned
    assert any(l["level"] == "WARN" and l.get("server") == "leaky" and l.get("message") == "child failed"
               for l in lines), [l for l in lines if l.get("server") == "leaky"]
    # The child's stderr line is logged (debug), its secret replaced.
    stderr_lines = [l for l in lines if l.get("target") == "graph_os::child_stderr" and l.get("server") == "leaky"]
    assert any("token is [redacted]" in l["message"] for l in stderr_lines), stderr_lines
