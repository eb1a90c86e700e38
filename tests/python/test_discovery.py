"""find_tools ranking tiers through the real gateway: ranker identity, fallback, vector cache reuse,
the semantic tier as installed by scripts/install-semantic-model.py (scripts/install-peers.sh puts it in
$PEERS/models)."""
import os
import shutil
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import GRAPH_OS, PEERS, child_entry, settled, structured, wait_status

pytestmark = pytest.mark.anyio

MODELS = PEERS / "models"
SEMANTIC = "all-MiniLM-L6-v2-int8"


def gateway(config, state, env=None, log=None):
    """The gateway over stdio; without `GRAPH_OS_MODELS_DIR` in `env`, with no models installed (the
    default tier, whatever this machine has in ~/.local/share); with `log`, its stderr goes there."""
    env = {"GRAPH_OS_MODELS_DIR": str(state.parent / "no-models"), **(env or {})}
    args = ["--config", str(config), "--state-dir", str(state)]
    if log is None:
        return StdioServerParameters(command=str(GRAPH_OS), args=args, env={**os.environ, **env})
    return StdioServerParameters(command="sh", args=["-c", 'exec "$0" "$@" 2>>"$GATEWAY_LOG"', str(GRAPH_OS), *args],
                                 env={**os.environ, **env, "GATEWAY_LOG": str(log)})


def installed_models():
    model = MODELS / SEMANTIC / "model.onnx"
    assert model.exists(), f"{model} is missing: run scripts/install-peers.sh (it runs install-semantic-model.py)"
    return MODELS


async def vectors_ready(client, timeout=60.0):
    """Polls multiplexer_status until every child's vectors are installed; returns the discovery facts."""
    deadline = time.monotonic() + timeout
    while True:
        status = structured(await client.call_tool("multiplexer_status", {}))
        d = status["discovery"]
        # documents > 0: the children's catalogs are in the index (children can be up a moment
        # before the view that indexes them is rebuilt).
        if settled(status["children"]) and not d["models_loading"] and d["documents"] > 0 \
                and d["vectors_pending"] == 0:
            return status
        assert time.monotonic() < deadline, status
        await anyio.sleep(0.1)


async def test_default_tier_is_static_and_ranks(write_fleet, tmp_path):
    config = write_fleet({"calc": child_entry(), "other": child_entry()})
    async with Client(gateway(config, tmp_path / "state"), mode="legacy") as client:
        await wait_status(client, settled)
        status = await vectors_ready(client)
        assert status["ranker"] == "static"
        assert status["discovery"]["model"] == "potion-base-2M"
        found = structured(await client.call_tool("find_tools", {"query": "add two numbers", "top_k": 3}))
        assert found["ranker"] == "static"
        assert found["results"][0]["tool"] == "add", found
        assert 0.0 <= found["results"][0]["score"] <= 1.0


async def test_ranker_cap_falls_back_to_lexical(write_fleet, tmp_path):
    config = write_fleet({"calc": child_entry()})
    async with Client(gateway(config, tmp_path / "state", {"GRAPH_OS_RANKER": "lexical"}), mode="legacy") as client:
        await wait_status(client, settled)
        status = await vectors_ready(client)
        assert status["ranker"] == "lexical"
        found = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))
        assert found["ranker"] == "lexical"
        assert found["results"][0]["tool"] == "add"


async def test_restart_reuses_cached_vectors_and_a_changed_child_recomputes_alone(write_fleet, tmp_path):
    # `--schema-file` makes the child change its `add` tool on every start; `plain` never changes.
    config = write_fleet({"changing": child_entry("--schema-file", str(tmp_path / "schema")),
                          "plain": child_entry()})
    state = tmp_path / "state"
    async with Client(gateway(config, state), mode="legacy") as client:
        first = (await vectors_ready(client))["discovery"]
    assert first["vectors_computed"] == first["documents"] > 0
    assert first["vectors_reused"] == 0
    assert list((state / "discovery" / "vectors" / "potion-base-2M").glob("*.vec"))

    async with Client(gateway(config, state), mode="legacy") as client:
        second = (await vectors_ready(client))["discovery"]
        found = structured(await client.call_tool("find_tools", {"query": "add two numbers", "top_k": 2}))
        assert found["ranker"] == "static"
    # Only the changed tool of the changed child is embedded again.
    assert second["documents"] == first["documents"]
    assert second["vectors_computed"] == 1, second
    assert second["vectors_reused"] == first["documents"] - 1


async def test_installed_semantic_tier_ranks_and_says_so(write_fleet, tmp_path):
    config = write_fleet({"calc": child_entry(), "other": child_entry()})
    env = {"GRAPH_OS_MODELS_DIR": str(installed_models())}
    async with Client(gateway(config, tmp_path / "state", env), mode="legacy") as client:
        await wait_status(client, settled)
        status = await vectors_ready(client, timeout=120)
        d = status["discovery"]
        assert status["ranker"] == "semantic", d
        assert d["model"] == SEMANTIC and d["tiers"] == {"static": "ready", "semantic": "ready"}
        assert d["serving"] == "semantic"
        found = structured(await client.call_tool("find_tools", {"query": "what is seven plus five", "top_k": 3}))
        assert found["ranker"] == "semantic"
        assert found["results"][0]["tool"] == "add", found
    assert d["vectors_computed"] == 2 * d["documents"] > 0, d  # both tiers
    assert list((tmp_path / "state" / "discovery" / "vectors" / SEMANTIC).glob("*.vec"))
    # A restart with the same fleet: every vector of both tiers comes from the cache.
    async with Client(gateway(config, tmp_path / "state", env), mode="legacy") as client:
        again = (await vectors_ready(client, timeout=120))["discovery"]
        assert again["ranker"] == "semantic"
    assert again["vectors_computed"] == 0 and again["vectors_reused"] == 2 * d["documents"], again


async def test_a_removed_model_file_falls_back_one_tier_with_one_warning(write_fleet, tmp_path):
    broken = tmp_path / "models" / SEMANTIC
    broken.mkdir(parents=True)
    for f in (installed_models() / SEMANTIC).iterdir():
        if f.name != "model.onnx":
            (broken / f.name).symlink_to(f)
    config = write_fleet({"calc": child_entry()})
    log = tmp_path / "gateway.log"
    env = {"GRAPH_OS_MODELS_DIR": str(tmp_path / "models")}
    async with Client(gateway(config, tmp_path / "state", env, log=log), mode="legacy") as client:
        await wait_status(client, settled)
        d = (await vectors_ready(client))["discovery"]
        assert d["ranker"] == "static" and d["tiers"]["semantic"] == "model-file-missing", d
        for _ in range(3):
            found = structured(await client.call_tool("find_tools", {"query": "add two numbers"}))
            assert found["ranker"] == "static"
            assert found["results"][0]["tool"] == "add"
    warnings = [line for line in log.read_text().splitlines() if "semantic discovery tier" in line]
    assert len(warnings) == 1 and "WARN" in warnings[0] and "model-file-missing" in warnings[0], warnings


async def test_a_tampered_runtime_library_is_never_loaded(write_fleet, tmp_path):
    tampered = tmp_path / "models" / SEMANTIC
    shutil.copytree(installed_models() / SEMANTIC, tampered, symlinks=True)
    lib = tampered / "libonnxruntime.so.1.32.0"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    config = write_fleet({"calc": child_entry()})
    env = {"GRAPH_OS_MODELS_DIR": str(tmp_path / "models")}
    async with Client(gateway(config, tmp_path / "state", env), mode="legacy") as client:
        await wait_status(client, settled)
        d = (await vectors_ready(client))["discovery"]
        assert d["ranker"] == "static" and d["tiers"]["semantic"] == "model-digest-mismatch", d
