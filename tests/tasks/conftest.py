"""The Tasks acceptance tests run on the 2025-11-25 Python SDK (mcp 1.30, $PEERS/tasks-venv):
its `session.experimental` tasks API is the one real 2025 task client. The gateway fixtures and
paths are the main suite's (tests/python/conftest.py)."""
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "suite_conftest", pathlib.Path(__file__).resolve().parents[1] / "python" / "conftest.py")
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)

EVERYTHING, GRAPH_OS, child_entry, free_port = _suite.EVERYTHING, _suite.GRAPH_OS, _suite.child_entry, _suite.free_port
anyio_backend, http_gateway, write_fleet = _suite.anyio_backend, _suite.http_gateway, _suite.write_fleet
pytest_configure = _suite.pytest_configure
