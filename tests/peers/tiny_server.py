"""A tiny FastMCP server (stdio by default; `http PORT` for streamable HTTP) used as a real child."""
import sys

from fastmcp import FastMCP

mcp = FastMCP("tiny")


@mcp.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool
def word_count(text: str) -> int:
    """Count the words in a text."""
    return len(text.split())


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False, log_level="WARNING")
    else:
        mcp.run(show_banner=False)
