"""An MCP server for toolfleet's tests, written with the official Python SDK
(PyPI `mcp`, its `MCPServer`, formerly FastMCP): the fleet serves its tools
as it would any team's server.

    python server.py stdio
    python server.py http PORT

Tools:
- `add(a, b)`: read-only (annotations), a structured result;
- `ask(question)`: answers that it needs the user's input first
  (`input_required`, 2026-07-28 only);
- `shout(text)`: idempotent, a text result;
- `get.forecast(city)`: a name the fleet must map (the dot);
- `fail(message)`: an error result (`isError`) with the message;
- `slow(seconds)`: sleeps; if cancelled, writes `cancelled-<seconds>` in
  `$MCP_TEST_DIR`;
- `picture()`: an image and an embedded resource;
- `append(line)`: appends to `$MCP_TEST_DIR/appended` (not idempotent,
  the default annotations);
- `echo(text)`: a name a worker's test tool has too;
- `big(mib)`: not idempotent: adds a line to `$MCP_TEST_DIR/big`, and
  answers a text of `mib` MiB (over HTTP, one SSE event);
- `crash()`: the server dies mid-call (not idempotent);
- `crash_once(key)`: read-only; the server dies the first time it is
  called with `key`, and answers `survived` after;
- `go_down(seconds)`: the server dies, and refuses to start again for
  that long.
- `grow()` and `shrink()`: add and remove the tool `extra(text)`, each
  followed by `notifications/tools/list_changed`;
- `flood(times)`: sends `notifications/tools/list_changed` that many times.
- `test_simple_text()` and `test_error_handling()`: the tools the official
  MCP conformance suite calls (a text, and an `isError` result), and
  `json_schema_2020_12_tool(name, address)`, whose schema is the suite's
  (`$schema`, `$defs`, `additionalProperties: false`), set as given since
  the SDK derives a schema from the function;
- `steps(count, pause)`: reports its progress (`notifications/progress`)
  after each of `count` steps, `pause` seconds apart; then a burst of 50
  more reports at once.

Each `tools/list` it answers adds a line to `$MCP_TEST_DIR/listings`. It
refuses to start while `$MCP_TEST_DIR/held` exists. With
`$MCP_TEST_PROTOCOL` set (a handshake version, such as `2025-06-18`), it is a
server of that version only, as older servers are: its `initialize` answers
with that version whatever the client asked for.
"""

import asyncio
import os
import sys
import time
from pathlib import Path

import mcp_types
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

scratch = Path(os.environ.get("MCP_TEST_DIR", "."))


class CountingServer(MCPServer):
    """Leaves a line in `listings` for each `tools/list` it answers."""

    async def list_tools(self):
        with open(scratch / "listings", "a", encoding="utf-8") as listings:
            listings.write("listed\n")
        return await super().list_tools()


server = CountingServer("toolfleet-test")

# A 1x1 PNG.
PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c6360f8cfc0f01f0005000201e221bc330000000049454e44ae426082"
)


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def ask(question: str) -> mcp_types.InputRequiredResult:
    """Asks the user first: an `input_required` result (2026-07-28)."""
    form = mcp_types.ElicitRequestFormParams(
        message=question,
        requested_schema={"type": "object", "properties": {"answer": {"type": "string"}}},
    )
    return mcp_types.InputRequiredResult(
        input_requests={"answer": mcp_types.ElicitRequest(params=form)},
        request_state="asked",
    )


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool(
    annotations=mcp_types.ToolAnnotations(
        read_only_hint=False, idempotent_hint=True, destructive_hint=False
    )
)
def shout(text: str) -> str:
    """Returns the text in capitals."""
    return text.upper()


@server.tool(name="get.forecast", annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def forecast(city: str) -> str:
    """The weather tomorrow in a city."""
    return f"sunny in {city}"


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ToolError(message)


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def test_simple_text() -> str:
    """The MCP conformance suite's simple text tool."""
    return "This is a simple text response for testing."


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def test_error_handling() -> str:
    """The MCP conformance suite's tool that fails."""
    raise ToolError("This tool intentionally returns an error for testing")


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def json_schema_2020_12_tool(name: str = "", address: dict | None = None) -> str:
    """Tool with JSON Schema 2020-12 features"""
    return f"{name} at {address}"


server._tool_manager.get_tool("json_schema_2020_12_tool").parameters = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
async def slow(seconds: float) -> str:
    """Sleeps for the given seconds."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        (scratch / f"cancelled-{seconds:g}").write_text("cancelled")
        raise
    return "slept"


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def picture() -> list:
    """A picture and a note about it."""
    note = mcp_types.EmbeddedResource(
        type="resource",
        resource=mcp_types.TextResourceContents(
            uri="note://pixel", mime_type="text/plain", text="one red pixel"
        ),
    )
    return [Image(data=PIXEL, format="png"), note]


@server.tool()
def append(line: str) -> str:
    """Appends a line to a file."""
    with open(scratch / "appended", "a", encoding="utf-8") as appended:
        appended.write(line + "\n")
    return "appended"


@server.tool()
def big(mib: int) -> str:
    """Answers `mib` MiB of text."""
    with open(scratch / "big", "a", encoding="utf-8") as calls:
        calls.write(f"{mib}\n")
    return "x" * (mib * 1024 * 1024)


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Returns the text."""
    return text


@server.tool()
def crash() -> str:
    """Kills the server in the middle of the call."""
    os._exit(3)


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def crash_once(key: str) -> str:
    """Kills the server the first time it is called with a key."""
    mark = scratch / f"crashed-{key}"
    if not mark.exists():
        mark.write_text("crashed")
        os._exit(3)
    return "survived"


@server.tool()
def go_down(seconds: float) -> str:
    """Stops the server, which refuses to start again for a while."""
    (scratch / "down-until").write_text(str(time.time() + seconds))
    os._exit(3)


def extra(text: str) -> str:
    """A tool that comes and goes."""
    return f"extra {text}"


async def tools_changed(ctx: Context) -> None:
    """Says the tool list changed in both eras: on the session for a client
    that made the `initialize` handshake, and on `subscriptions/listen`
    streams for a 2026-07-28 client (each era drops the other's)."""
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool `extra`."""
    server.add_tool(extra, annotations=mcp_types.ToolAnnotations(read_only_hint=True))
    await tools_changed(ctx)
    return "grown"


@server.tool()
async def shrink(ctx: Context) -> str:
    """Removes the tool `extra`."""
    server.remove_tool("extra")
    await tools_changed(ctx)
    return "shrunk"


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
async def flood(times: int, ctx: Context) -> str:
    """Says the tool list changed, many times over."""
    for _ in range(times):
        await tools_changed(ctx)
    return "flooded"


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
async def steps(count: int, pause: float, ctx: Context) -> str:
    """Works through some steps, saying how far it is."""
    for step in range(1, count + 1):
        await asyncio.sleep(pause)
        await ctx.report_progress(step, count, f"step {step}\u001b[2J done")
    for _ in range(50):
        await ctx.report_progress(count, count, "again")
    return "stepped"


if __name__ == "__main__":
    down_until = scratch / "down-until"
    if down_until.exists() and time.time() < float(down_until.read_text()):
        sys.exit("down for a while yet")
    if (scratch / "held").exists():
        sys.exit("held")
    if pinned := os.environ.get("MCP_TEST_PROTOCOL"):
        # The SDK answers `initialize` from these two names of its runner.
        import mcp.server.runner as runner

        runner.HANDSHAKE_PROTOCOL_VERSIONS = (pinned,)
        runner.LATEST_HANDSHAKE_VERSION = pinned
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
