"""Operability from outside the protocol: `graph-os status|catalog|refresh` against a running
gateway's admin API, the status page at `/` (also rendered in headless Chromium), and
`graph-os doctor --config`."""

import json
import os
import pathlib
import shutil
import subprocess
import time

import pytest

from conftest import GRAPH_OS, ROOT, TESTCHILD, child_entry

TOKENS = {"T_DISCOVER": "discover-canary-7f3a", "T_MANAGE": "manage-canary-91bc"}
TOKEN_ARGS = ["--token", "discover=env://T_DISCOVER", "--token", "manage=env://T_MANAGE"]
ARTIFACTS = pathlib.Path(os.environ.get("GRAPH_OS_TEST_ARTIFACTS", ROOT / "target" / "test-artifacts"))


def fleet(write_fleet):
    return write_fleet({
        "alpha": child_entry(),
        "beta": child_entry(),
        "broken": {"command": "/nonexistent/graph-os-no-such-child"},
    })


def settle(gw, token):
    deadline = time.monotonic() + 60
    while True:
        status, body = gw.json("GET", "/api/mcp/status", token=token)
        assert status == 200, body
        if all(c["state"] in ("up", "failed") for c in body["children"].values()) and \
                body["children"]["broken"]["state"] == "failed":
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.2)


def cli(*args, token=None):
    env = {k: v for k, v in os.environ.items() if k != "GRAPH_OS_TOKEN"}
    if token:
        env["GRAPH_OS_TOKEN"] = token
    return subprocess.run([str(GRAPH_OS), *args], capture_output=True, text=True, timeout=60, env=env)


def test_status_catalog_and_refresh_from_the_command_line(write_fleet, http_gateway):
    gw = http_gateway(fleet(write_fleet), *TOKEN_ARGS, env={**os.environ, **TOKENS})
    settle(gw, TOKENS["T_DISCOVER"])
    out = cli("status", "--url", gw.base, token=TOKENS["T_DISCOVER"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("catalog generation "), lines
    assert lines[1].split()[:3] == ["SERVER", "STATE", "BREAKER"], lines
    rows = {l.split()[0]: l for l in lines[2:5]}
    assert set(rows) == {"alpha", "beta", "broken"}, lines
    assert rows["alpha"].split()[1] == "up" and rows["beta"].split()[1] == "up"
    assert rows["broken"].split()[1] == "failed" and "child-spawn-failed" in rows["broken"], rows["broken"]
    assert "3 children" in out.stdout
    as_json = json.loads(cli("status", "--url", gw.base, "--json", token=TOKENS["T_DISCOVER"]).stdout)
    assert set(as_json["children"]) == {"alpha", "beta", "broken"}
    cat = cli("catalog", "--url", gw.base, token=TOKENS["T_DISCOVER"])
    assert cat.returncode == 0 and cat.stdout.splitlines()[1].startswith("SERVER"), cat
    generation = as_json["catalog_identity"]["catalog_generation"]
    # Refresh needs the manage scope; the discover token is refused with the gateway's code.
    denied = cli("refresh", "--url", gw.base, token=TOKENS["T_DISCOVER"])
    assert denied.returncode == 1 and "403" in denied.stderr, denied
    assert ("authorization-denied: the token's scope is too small: status and catalog need discover, "
            "refresh and approve need manage") in denied.stderr, denied
    done = cli("refresh", "--url", gw.base, "--deadline-ms", "20000", "--json", token=TOKENS["T_MANAGE"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["catalog_generation"] >= generation
    # Without --json: one line saying what is served.
    line = cli("refresh", "--url", gw.base, token=TOKENS["T_MANAGE"])
    assert line.returncode == 0, line.stderr
    assert line.stdout.startswith("catalog generation ") and "(unchanged)" in line.stdout, line.stdout
    assert len(line.stdout.splitlines()) == 1, line.stdout
    # Without a token: a clear message naming the variable; no token value is ever printed.
    missing = cli("status", "--url", gw.base)
    assert missing.returncode == 1 and "GRAPH_OS_TOKEN" in missing.stderr, missing
    wrong = cli("status", "--url", gw.base, token="not-a-token-canary")
    assert wrong.returncode == 1 and "401" in wrong.stderr, wrong
    for run in (out, cat, denied, done, line, missing, wrong):
        for secret in [*TOKENS.values(), "not-a-token-canary"]:
            assert secret not in run.stdout + run.stderr


def test_the_status_page_needs_the_mcp_policy_and_a_known_host(write_fleet, http_gateway):
    gw = http_gateway(fleet(write_fleet), *TOKEN_ARGS, env={**os.environ, **TOKENS})
    settle(gw, TOKENS["T_DISCOVER"])
    status, body = gw.get("/", {})
    assert status == 401 and "authentication-required" in body
    auth = {"Authorization": f"Bearer {TOKENS['T_DISCOVER']}"}
    status, body = gw.get("/", headers=auth)
    assert status == 200, body
    for name in ("alpha", "beta", "broken"):
        assert f'data-server="{name}"' in body
    assert "child-spawn-failed" in body and 'http-equiv=refresh' in body
    status, body = gw.get("/", headers={**auth, "Host": "rebind.example"})
    assert status == 403 and "host-not-allowed" in body
    status, body = gw.get("/?q=echo+a+message", headers=auth)
    assert status == 200 and "id=found" in body and "http-equiv=refresh" not in body
    status, body = gw.get("/?q=%3Cscript%3Ealert(1)%3C/script%3E", headers=auth)
    assert status == 200 and "<script>" not in body
    assert TOKENS["T_DISCOVER"] not in body


@pytest.mark.skipif(shutil.which("chromium") is None and os.environ.get("GRAPH_OS_REQUIRE_SHARED") != "1",
                    reason="chromium is not installed (scripts/install-peers.sh installs it)")
def test_the_status_page_renders_in_headless_chromium(write_fleet, http_gateway, tmp_path):
    # The local development profile (loopback, no credential source): every caller is anonymous.
    gw = http_gateway(fleet(write_fleet))
    deadline = time.monotonic() + 60
    while True:  # the page itself (REST always needs a credential)
        status, body = gw.get("/")
        if status == 200 and 'class="starting"' not in body and "child-spawn-failed" in body:
            break
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.2)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "status-page.png"
    shot.unlink(missing_ok=True)
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1400,900"]
    dom = subprocess.run([*base, "--dump-dom", gw.base + "/"], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for name in ("alpha", "beta", "broken"):
        assert f'data-server="{name}"' in dom.stdout, dom.stdout[:3000]
    assert 'id="generation"' in dom.stdout
    run = subprocess.run([*base, f"--screenshot={shot}", gw.base + "/"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and shot.stat().st_size > 10_000, run.stderr[-2000:]


def test_doctor_reports_each_command_found_or_missing(write_fleet):
    out = subprocess.run([str(GRAPH_OS), "doctor", "--config", str(ROOT / "examples" / "mcp_config.json")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "testchild: stdio: command" in out.stdout and "found at" in out.stdout, out.stdout
    assert ("everything: stdio: command \"npx\" found at" in out.stdout) == (shutil.which("npx") is not None)
    path = write_fleet({
        "ok": {**child_entry(), "env": {"API_TOKEN": "env://DOCTOR_CANARY"}},
        "gone": {"command": "graph-os-no-such-command"},
        "private": {"url": "http://10.1.2.3/mcp"},
    })
    env = {**os.environ, "DOCTOR_CANARY": "doctor-secret-canary"}
    out = subprocess.run([str(GRAPH_OS), "doctor", "--config", str(path), "--remote-profile"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1, out.stdout
    assert f"ok: stdio: command \"{TESTCHILD}\" found at" in out.stdout, out.stdout
    assert "gone: stdio: command \"graph-os-no-such-command\" MISSING" in out.stdout
    assert "ok: env: declared [API_TOKEN]" in out.stdout
    assert "NOT ready" in out.stdout
    assert "doctor-secret-canary" not in out.stdout + out.stderr
    # A reference this environment cannot resolve (a client file's `${VAR}`, `env://`): the child
    # would fail closed with secret-unavailable, so the fleet is not ready; names, never values.
    path = write_fleet({
        "set": {**child_entry(), "env": {"API_TOKEN": "${DOCTOR_CANARY}"}},
        "unset": {**child_entry(), "env": {"API_TOKEN": "${DOCTOR_UNSET_1F}"}},
        "aliased": {**child_entry(), "env": {"API_TOKEN": "env://DOCTOR_UNSET_2F"}},
        "remote": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${DOCTOR_UNSET_3F}"}},
    }, name="refs.json")
    out = subprocess.run([str(GRAPH_OS), "doctor", "--config", str(path)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1, out.stdout
    assert "unset: env: ${DOCTOR_UNSET_1F} not set here" in out.stdout, out.stdout
    assert "aliased: env: env://DOCTOR_UNSET_2F not set here" in out.stdout, out.stdout
    assert "remote: headers: ${DOCTOR_UNSET_3F} not set here" in out.stdout, out.stdout
    assert "warning: mcpServers.unset.env.API_TOKEN:" in out.stdout, out.stdout
    assert "set: env:" in out.stdout and "set: env: ${DOCTOR_CANARY}" not in out.stdout, out.stdout
    assert "NOT ready" in out.stdout and "doctor-secret-canary" not in out.stdout + out.stderr


def test_an_unusable_state_directory_is_a_typed_startup_error_not_a_panic(tmp_path, write_fleet):
    # The state directory and the fallback under TMPDIR both lie below a regular file.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "TMPDIR": str(blocker / "tmp")}
    run = subprocess.run([str(GRAPH_OS), "--config", str(write_fleet({})), "--state-dir", str(blocker / "state")],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode != 0, run.stderr
    assert "no usable state directory" in run.stderr and "give a writable --state-dir" in run.stderr, run.stderr
    assert "panicked" not in run.stderr, run.stderr
