"""A client of MCP Tasks (SEP-2663) against the fleet as an MCP server
(`toolfleet mcp-serve`), for tests/tests/mcp.rs: FastMCP's `Client`, whose
`fastmcp-tasks` half declares the extension on every request (the official
Python SDK's `ClientSession` has no tasks of its own).

    python tasks_client.py URL TOKEN start TOOL ARGUMENTS
        calls TOOL with ARGUMENTS (JSON) as a task; prints {"task": ID},
        or {"result": ...} when the gateway answered the call at once
    python tasks_client.py URL TOKEN wait ID
        polls the task ID (`tasks/get`) to its end; prints {"status": ...,
        "result": ..., "messages": [every status message seen]}
    python tasks_client.py URL TOKEN get ID
        one `tasks/get`; prints {"status": ..., "message": its status
        message} or {"error": code}
    python tasks_client.py URL TOKEN cancel ID
        `tasks/cancel`; prints {} or {"error": code}

Each run is a new client, over Streamable HTTP at protocol 2026-07-28,
with `Authorization: Bearer TOKEN`.
"""

import asyncio
import json
import sys

from fastmcp import Client
from fastmcp_tasks.client import _send_cancel, _send_get
from fastmcp_tasks.client_models import ClientCreateTaskResult
from mcp.shared.exceptions import MCPError


def outcome(result):
    """A finished call's result, as plain JSON."""
    return {
        "is_error": bool(result.is_error),
        "structured": result.structured_content,
        "text": [block.text for block in result.content if getattr(block, "text", None)],
    }


async def start(client, tool, arguments):
    raw = await client.session.call_tool(
        name=tool, arguments=json.loads(arguments), allow_claimed=True
    )
    if isinstance(raw, ClientCreateTaskResult):
        return {"task": raw.task_id, "poll_interval_ms": raw.poll_interval_ms, "ttl_ms": raw.ttl_ms}
    return {"result": outcome(raw)}


async def wait(client, task_id):
    messages = []
    while True:
        got = await _send_get(client.session, task_id)
        if got.status_message and got.status_message not in messages:
            messages.append(got.status_message)
        if got.status in ("completed", "failed", "cancelled"):
            return {"status": got.status, "result": got.result, "messages": messages}
        await asyncio.sleep((got.poll_interval_ms or 500) / 1000)


async def main(url, token, command, *args):
    async with Client(url, auth=token, mode="2026-07-28") as client:
        try:
            if command == "start":
                return await start(client, *args)
            if command == "wait":
                return await wait(client, *args)
            if command == "get":
                got = await _send_get(client.session, args[0])
                return {"status": got.status, "message": got.status_message}
            if command == "cancel":
                await _send_cancel(client.session, args[0])
                return {}
        except MCPError as err:
            return {"error": err.error.code, "message": err.error.message}
    raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:]))))
