// Preloaded into the MCP conformance suite (`node --import`), which sends
// no token of its own: every request it makes (through `fetch` and through
// undici's `request`, which share undici's global dispatcher) carries
// `Authorization: Bearer $CONFORMANCE_BEARER`, as a client configured with
// a token's would, so that it can pass `toolfleet mcp-serve`'s door.
import { Agent, setGlobalDispatcher } from "undici";

const authorization = `Bearer ${process.env.CONFORMANCE_BEARER}`;

function withToken(headers) {
  if (Array.isArray(headers)) {
    const kept = [];
    for (let at = 0; at < headers.length; at += 2) {
      if (String(headers[at]).toLowerCase() !== "authorization") {
        kept.push(headers[at], headers[at + 1]);
      }
    }
    return [...kept, "authorization", authorization];
  }
  const kept = Object.fromEntries(
    Object.entries(headers ?? {}).filter(([name]) => name.toLowerCase() !== "authorization"),
  );
  return { ...kept, authorization };
}

setGlobalDispatcher(
  new Agent().compose((dispatch) => (options, handler) =>
    dispatch({ ...options, headers: withToken(options.headers) }, handler),
  ),
);
