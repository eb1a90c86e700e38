"""Client-side MCP conformance: graph-os as the *client* of the scenario's server.

The official suite (`conformance client --command "python client_driver.py" --scenario S`) starts
a scenario server and runs this driver with its URL as the last argument (and, for the auth
scenarios, MCP_CONFORMANCE_CONTEXT with client credentials). The driver starts graph-os (stdio)
with that server as its only child (transparent: prefix "", expose eager; client credentials as
`auth` when the context has them, the token endpoint discovered by graph-os), waits for the child,
then exercises it through graph-os with the official Python SDK client: every tool of the child is
called once (`add_numbers` with numbers), elicitations are accepted with no fields (graph-os
applies the schema's defaults, SEP-1034). Exit status 0 when the child came up.
"""
import asyncio
import json
import os
import pathlib
import sys
import tempfile
import time

from mcp import Client, StdioServerParameters, types

META = {"find_tools", "list_catalog", "load_tools", "unload_tools", "multiplexer_status", "catalog_refresh",
        "catalog_dispatch", "fleet_graph"}


async def accept_empty(ctx, params):
    return types.ElicitResult(action="accept", content={})


def arguments_for(tool) -> dict:
    props = (tool.input_schema or {}).get("properties", {})
    return {name: 2 if spec.get("type") in ("number", "integer") else "x" for name, spec in props.items()
            if name in (tool.input_schema or {}).get("required", [])}


async def main() -> int:
    url = sys.argv[-1]
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT", "{}"))
    entry = {"url": url, "prefix": "", "expose": "eager"}
    env = dict(os.environ)
    if context.get("client_id") and context.get("client_secret"):
        entry["auth"] = {"type": "oauth-client-credentials", "clientId": context["client_id"],
                         "clientSecret": "env://CONFORMANCE_CLIENT_SECRET"}
        env["CONFORMANCE_CLIENT_SECRET"] = context["client_secret"]
    elif context.get("client_id") and context.get("private_key_pem"):
        # private_key_jwt (RFC 7523): graph-os signs an ES256 client assertion with this key.
        entry["auth"] = {"type": "oauth-client-credentials", "clientId": context["client_id"],
                         "tokenEndpointAuth": "private_key_jwt", "privateKey": "env://CONFORMANCE_PRIVATE_KEY"}
        env["CONFORMANCE_PRIVATE_KEY"] = context["private_key_pem"]
    work = pathlib.Path(tempfile.mkdtemp(prefix="graph-os-client-conformance-"))
    fleet = work / "fleet.json"
    fleet.write_text(json.dumps({"mcpServers": {"child": entry}}))
    params = StdioServerParameters(command=os.environ["GRAPH_OS"],
                                   args=["--config", str(fleet), "--state-dir", str(work / "state")], env=env)
    async with Client(params, mode="legacy", elicitation_callback=accept_empty) as client:
        deadline = time.monotonic() + 20
        while True:
            status = (await client.call_tool("multiplexer_status", {})).structured_content
            child = status["children"]["child"]
            if child["state"] == "up":
                break
            if child["state"] == "failed" or time.monotonic() > deadline:
                print(f"child did not come up: {json.dumps(child)}", file=sys.stderr)
                return 1
            await asyncio.sleep(0.2)
        for tool in (await client.list_tools()).tools:
            if tool.name in META:
                continue
            result = await client.call_tool(tool.name, arguments_for(tool))
            print(f"{tool.name}: {'error' if result.is_error else 'ok'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
