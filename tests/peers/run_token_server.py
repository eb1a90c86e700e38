"""A FastMCP child that verifies graph-os run tokens (docs/configuration.md "Authentication toward children").

TEST PEER. Its `whoami` tool checks the run token of the call exactly as the documented
verification contract says (HS256 with the shared key from RUN_TOKEN_KEY, iss, aud = the server
name in RT_AUDIENCE, exp, method, tool, args_sha256, jti not replayed) and answers
`{"sub", "scope", "via"}`, or fails with `run-token-invalid: <reason>`. The token comes from
`_meta["io.graph-os/run-token"]` or, over HTTP, the `Graph-Os-Run-Token` header.
Usage: python run_token_server.py [http PORT]
"""
import hashlib
import json
import os
import sys
import time

import jwt
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError

mcp = FastMCP("run-token-child")
SEEN: dict[str, int] = {}


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def token_of(ctx: Context) -> tuple[str | None, str, str | None]:
    """(token, where it came from, the header's token over HTTP)."""
    header = None
    try:
        from fastmcp.server.dependencies import get_http_headers

        header = get_http_headers().get("graph-os-run-token")
    except Exception:
        pass
    meta = ctx.request_context.meta if ctx.request_context else None
    extra = meta if isinstance(meta, dict) else (meta.model_dump() if meta is not None else {})
    token = extra.get("io.graph-os/run-token")
    if token:
        return token, "meta", header
    if header:
        return header, "header", header
    return None, "none", None


def verify(ctx: Context, tool: str, arguments: dict) -> dict:
    token, via, http_header = token_of(ctx)
    if not token:
        raise ToolError("run-token-invalid: no run token")
    try:
        header = jwt.get_unverified_header(token)
        if header.get("alg") != "HS256":
            raise ToolError("run-token-invalid: alg")
        claims = jwt.decode(token, os.environ["RUN_TOKEN_KEY"], algorithms=["HS256"], issuer="graph-os",
                            audience=os.environ["RT_AUDIENCE"], leeway=5,
                            options={"require": ["exp", "iat", "jti", "sub", "scope"]})
    except jwt.PyJWTError as e:
        raise ToolError(f"run-token-invalid: {type(e).__name__}")
    if claims["method"] != "tools/call" or claims["tool"] != tool:
        raise ToolError("run-token-invalid: bound to another call")
    if claims["args_sha256"] != hashlib.sha256(canonical(arguments).encode()).hexdigest():
        raise ToolError("run-token-invalid: bound to other arguments")
    now = int(time.time())
    for jti in [j for j, exp in SEEN.items() if exp < now]:
        del SEEN[jti]
    if claims["jti"] in SEEN:
        raise ToolError("run-token-invalid: replayed")
    SEEN[claims["jti"]] = claims["exp"]
    return {"sub": claims["sub"], "scope": claims["scope"], "via": via, "header_matches": http_header == token,
            "ttl": claims["exp"] - claims["iat"], "claims": claims}


@mcp.tool
def whoami(ctx: Context, note: str = "") -> dict:
    """Who called, according to the verified run token."""
    args = {"note": note} if note else {}
    return verify(ctx, "whoami", args)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        # Stateless: each tool call runs in the context of its own HTTP request (its headers).
        mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False, log_level="WARNING",
                stateless_http=True)
    else:
        mcp.run(show_banner=False)
