"""An MCP server whose tools run as tasks (the MCP Tasks extension,
SEP-2663), written with FastMCP and `fastmcp-tasks` (PyPI), the first
server-side implementation of the extension: the fleet follows its tasks
as it would any team's.

    python tasks_server.py PORT
    python tasks_server.py stdio

It serves Streamable HTTP on 127.0.0.1:PORT (`/mcp`), or stdio, its tasks in its
memory (`TasksExtension()`'s default backend), so that a restarted server
has forgotten them. Each tool always runs as a task (`mode="required"`),
polled every 200 ms, and writes what happens to it, one line each, in
`$MCP_TEST_DIR/effects`:

- `book(key, seconds)`: not idempotent (the default annotations): writes
  `start <key>`, sleeps, writes `done <key>`, and returns `{"booked": key}`;
  cancelled, it writes `cancelled <key>`;
- `lookup(key, seconds)`: read-only: the same, `lookup <key>` at the start,
  returning `{"found": key}`.
"""

import asyncio
import os
import sys
from datetime import timedelta
from pathlib import Path

from fastmcp import FastMCP
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp_types import ToolAnnotations

server = FastMCP("tasks")
server.add_extension(TasksExtension())
AS_A_TASK = TaskConfig(mode="required", poll_interval=timedelta(milliseconds=200))


def effect(line: str) -> None:
    with open(Path(os.environ["MCP_TEST_DIR"]) / "effects", "a") as effects:
        effects.write(line + "\n")


async def run(key: str, seconds: float, start: str) -> None:
    effect(f"{start} {key}")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        effect(f"cancelled {key}")
        raise
    effect(f"done {key}")


@server.tool(task=AS_A_TASK)
async def book(key: str, seconds: float) -> dict:
    """Books `key`, which takes `seconds`; booking twice books twice."""
    await run(key, seconds, "start")
    return {"booked": key}


@server.tool(task=AS_A_TASK, annotations=ToolAnnotations(readOnlyHint=True))
async def lookup(key: str, seconds: float) -> dict:
    """Looks `key` up, which takes `seconds`."""
    await run(key, seconds, "lookup")
    return {"found": key}


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run(transport="stdio", show_banner=False)
    else:
        server.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
