"""Trust boundary II, process groups: every stdio child leads its own process group, which is
terminated as a whole (SIGTERM, then SIGKILL after the stop grace) on stop, restart, reload and
shutdown; a gateway killed with SIGKILL takes its children along (parent-death signal on the
leader, the reaper's sweep of the group); no zombies after 100 restarts of a crashing child.

The child is `sh -c "sleep 300 & exec graph-os-testchild"`: the `sleep` grandchild is the one a
plain kill of the child would leave behind. Its pid is written to a file by the shell.
"""
import json
import os
import signal
import subprocess
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, TESTCHILD, settled, structured, wait_status
from trust_peers import alive, children_of, wait_gone

pytestmark = pytest.mark.anyio

GRACE = 2.0


def wrapped_child(pidfile, *child_args, **extra):
    script = f'sleep 300 & echo $! >> "{pidfile}"; exec "{TESTCHILD}" "$@"'
    return {"command": "/bin/sh", "args": ["-c", script, "sh", *child_args], **extra}


def read_pids(pidfile, n=1, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        try:
            pids = [int(x) for x in pidfile.read_text().split()]
        except (OSError, ValueError):
            pids = []
        if len(pids) >= n:
            return pids
        if time.monotonic() > deadline:
            raise AssertionError(f"{pidfile} has {pids}")
        time.sleep(0.05)


def gateway_pid_of(parent):
    found = [p for p, state, comm in children_of(parent) if comm.startswith("graph-os")]
    assert len(found) == 1, found
    return found[0]


def leader_pids(gw_pid):
    return [p for p, state, comm in children_of(gw_pid) if state != "Z" and comm.startswith("graph-os-testch")]


def start_http(tmp_path, fleet, *extra):
    from conftest import HttpGateway
    return HttpGateway(fleet, ("--child-stop-grace", str(GRACE), *extra))


def test_sigterm_of_the_gateway_stops_the_whole_group_within_the_grace(tmp_path, write_fleet):
    pidfile = tmp_path / "sleep.pids"
    fleet = write_fleet({"wrapped": wrapped_child(pidfile)})
    gw = start_http(tmp_path, fleet)
    try:
        sleep_pid = read_pids(pidfile)[0]
        deadline = time.monotonic() + 20
        while not leader_pids(gw.proc.pid):
            assert time.monotonic() < deadline, children_of(gw.proc.pid)
            time.sleep(0.05)
        leader = leader_pids(gw.proc.pid)[0]
        assert os.getpgid(leader) == leader, "the child leads its own process group"
        assert os.getpgid(sleep_pid) == leader, "the grandchild is in the child's group"
        assert os.getpgid(leader) != os.getpgid(gw.proc.pid)
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        assert wait_gone(sleep_pid, GRACE + 1), "sleep survived the gateway's SIGTERM"
        assert wait_gone(leader, GRACE + 1)
        print(f"SIGTERM: grandchild gone after {time.monotonic() - t0:.2f} s")
        gw.proc.wait(timeout=15)
    finally:
        gw.stop()


async def test_a_reload_that_restarts_the_child_stops_its_old_group(tmp_path, write_fleet):
    pidfile = tmp_path / "sleep.pids"
    fleet = write_fleet({"wrapped": wrapped_child(pidfile)})
    params = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet), "--child-stop-grace", str(GRACE)],
                                   env=dict(os.environ))
    async with Client(params, mode="legacy") as c:
        await wait_status(c, settled)
        old_sleep = read_pids(pidfile)[0]
        gw = gateway_pid_of(os.getpid())
        old_leader = leader_pids(gw)[0]
        # Changing the declaration (args) makes the reload restart this child.
        fleet.write_text(json.dumps({"mcpServers": {"wrapped": wrapped_child(pidfile, "--name", "reloaded")}}))
        t0 = time.monotonic()
        pids = read_pids(pidfile, 2)
        assert pids[1] != old_sleep
        assert wait_gone(old_sleep, GRACE + 5), "the old child's sleep survived the reload"
        assert wait_gone(old_leader, GRACE + 5)
        print(f"reload: old grandchild gone after {time.monotonic() - t0:.2f} s")
        st = await wait_status(c, lambda k: k["wrapped"]["state"] == "up")
        assert alive(pids[1]), "the new child's sleep runs"
    assert wait_gone(pids[1], GRACE + 5), "the new sleep survived the gateway's exit"


def test_sigkill_of_the_gateway_takes_the_children_along(tmp_path, write_fleet):
    pidfile = tmp_path / "sleep.pids"
    fleet = write_fleet({"wrapped": wrapped_child(pidfile), "plain": {"command": str(TESTCHILD)}})
    gw = start_http(tmp_path, fleet)
    try:
        sleep_pid = read_pids(pidfile)[0]
        deadline = time.monotonic() + 20
        while len(leader_pids(gw.proc.pid)) < 2:
            assert time.monotonic() < deadline, children_of(gw.proc.pid)
            time.sleep(0.05)
        leaders = leader_pids(gw.proc.pid)
        t0 = time.monotonic()
        gw.proc.kill()
        gw.proc.wait(timeout=5)
        for pid in leaders:
            assert wait_gone(pid, GRACE + 1), f"child {pid} survived SIGKILL of the gateway"
        assert wait_gone(sleep_pid, GRACE + 1), "sleep survived SIGKILL of the gateway"
        print(f"SIGKILL: children and grandchild gone after {time.monotonic() - t0:.2f} s")
    finally:
        gw.stop()


async def test_no_zombies_after_100_restarts_of_a_crashing_child(tmp_path, write_fleet):
    pidfile = tmp_path / "sleep.pids"
    fleet = write_fleet({
        "crashy": wrapped_child(pidfile, "--exit-after-ms", "300", maxRestarts=100, restartWindow=0.001),
        "steady": {"command": str(TESTCHILD)},
    })
    params = StdioServerParameters(command=str(GRAPH_OS), args=["--config", str(fleet), "--child-stop-grace", str(GRACE)],
                                   env=dict(os.environ))
    async with Client(params, mode="legacy") as c:
        gw = gateway_pid_of(os.getpid())
        t0 = time.monotonic()
        max_zombies = 0
        max_children = 0
        samples = 0
        while True:
            st = structured(await c.call_tool("multiplexer_status", {}))
            kids = children_of(gw)
            zombies = [k for k in kids if k[1] == "Z"]
            max_zombies = max(max_zombies, len(zombies))
            max_children = max(max_children, len(kids))
            samples += 1
            if st["children"]["crashy"]["restarts"] >= 100:
                break
            assert time.monotonic() - t0 < 400, st["children"]["crashy"]
            await anyio.sleep(0.1)
        elapsed = time.monotonic() - t0
        await anyio.sleep(GRACE + 0.5)
        kids = children_of(gw)
        zombies = [k for k in kids if k[1] == "Z"]
        sleeps = [int(x) for x in pidfile.read_text().split()]
        survivors = [p for p in sleeps[:-1] if alive(p)]
        print(f"100 restarts in {elapsed:.1f} s; {samples} samples; zombies now {len(zombies)}, at most {max_zombies} "
              f"momentarily; gateway children at most {max_children}; {len(sleeps)} grandchildren started, "
              f"{len(survivors)} of the stopped ones alive")
        assert zombies == [], kids
        assert survivors == [], survivors
        # The steady child, the crashing one (or none, between restarts) and the reaper.
        assert len([k for k in kids if k[1] != "Z"]) <= 3, kids
        assert st["children"]["steady"]["state"] == "up"
