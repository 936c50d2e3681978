"""The official Python SDK's MCP client (PyPI `mcp`) against the fleet as an
MCP server (`toolfleet mcp-serve`), for tests/tests/mcp.rs.

    python client.py stdio TOOLFLEET ADDR TOKEN
        starts `TOOLFLEET mcp-serve --addr ADDR --token TOKEN` and speaks to it
    python client.py http URL TOKEN
        speaks Streamable HTTP to URL, with `Authorization: Bearer TOKEN`
        (none when TOKEN is empty)

Both speak 2025-11-25, through the `initialize` handshake; `stdio-2026`
and `http-2026`, with the same arguments, speak the stateless 2026-07-28
(`server/discover`, no handshake) and fail if the server does not.

Prints one JSON object: the protocol version agreed on, the tools listed
(name: annotations), the results of `calculate` (6*7), of `fail` (a
terminal error) and of `steps` when listed, the progress it heard; or,
when the server refused it, `refused`.
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client


def result_json(result):
    """What a call result says, as plain JSON."""
    return {
        "is_error": bool(result.is_error),
        "structured": result.structured_content,
        "text": [block.text for block in result.content if getattr(block, "text", None)],
    }


async def handshake(read, write):
    """Exercises the server over `read`/`write` after an `initialize`."""
    async with ClientSession(read, write) as session:
        await session.initialize()
        return await exercise(session)


async def stateless(server):
    """Exercises `server` (stdio parameters or a URL) at 2026-07-28."""
    async with Client(server, mode="2026-07-28") as client:
        return await exercise(client.session)


async def exercise(session):
    """Lists the tools and calls some, as the module says."""
    listed = await session.list_tools()
    tools = {
        tool.name: (
            tool.annotations.model_dump(by_alias=True, exclude_none=True)
            if tool.annotations
            else {}
        )
        for tool in listed.tools
    }
    out = {"protocol": session.protocol_version, "tools": tools}
    out["calculate"] = result_json(await session.call_tool("calculate", {"expression": "6*7"}))
    out["fail"] = result_json(
        await session.call_tool("fail", {"mode": "terminal", "code": "NOPE"})
    )
    heard = []

    async def on_progress(progress, total, message):
        heard.append({"progress": progress, "total": total, "message": message})

    if "py__steps" in tools:
        out["steps"] = result_json(
            await session.call_tool(
                "py__steps", {"count": 2, "pause": 1.2}, progress_callback=on_progress
            )
        )
    out["progress"] = heard
    return out


async def main():
    mode = sys.argv[1]
    if mode in ("stdio", "stdio-2026"):
        toolfleet, addr, token = sys.argv[2:5]
        server = StdioServerParameters(
            command=toolfleet,
            args=["mcp-serve", "--addr", addr, "--token", token],
            env={"PATH": os.environ.get("PATH", "")},
        )
        if mode == "stdio-2026":
            return await stateless(server)
        async with stdio_client(server) as streams:
            return await handshake(streams[0], streams[1])
    url, token = sys.argv[2:4]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            transport = streamable_http_client(url, http_client=http)
            if mode == "http-2026":
                return await stateless(transport)
            async with transport as streams:
                return await handshake(streams[0], streams[1])
    except Exception as err:  # the SDK raises what the transport met
        return {"refused": repr(err)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
