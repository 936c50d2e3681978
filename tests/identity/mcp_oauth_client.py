"""The official MCP Python SDK's OAuth client (`mcp.client.auth`) signing a
person in to the fleet's MCP gateway (`toolfleet mcp-serve --resource-url`)
through the test OpenID provider, as a hosted MCP client adds a server by
its URL, for tests/tests/identity.rs.

    python mcp_oauth_client.py URL ACCOUNT

From a bare 401, the SDK reads the gateway's protected resource metadata,
the provider's metadata, and signs in by authorization code with PKCE for
the gateway's resource; the browser's part, following the provider's
redirects, is done here with `login_hint=ACCOUNT` (the provider signs that
account in; tests/identity/provider.mjs). Uses the provider's
pre-registered public client `console` and its redirect URI.

Prints one JSON object: the tools listed, the result of `calculate` (6*7)
and the token's claims (the audience the SDK asked for); or `refused`.
"""

import asyncio
import base64
import json
import sys
import urllib.parse

import httpx2
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

REDIRECT_URI = "http://127.0.0.1/callback"


class Memory(TokenStorage):
    """Tokens for this run only; the client registered beforehand."""

    def __init__(self):
        self.tokens = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken):
        self.tokens = tokens

    async def get_client_info(self):
        return OAuthClientInformationFull(
            client_id="console",
            redirect_uris=[REDIRECT_URI],
            token_endpoint_auth_method="none",
            grant_types=["authorization_code"],
            response_types=["code"],
        )

    async def set_client_info(self, client_info):
        pass


class Browser:
    """Follows the provider's redirects as a person's browser would, and
    keeps what came back to the redirect URI."""

    def __init__(self, account: str):
        self.account = account
        self.returned = None

    async def visit(self, authorization_url: str) -> None:
        url = f"{authorization_url}&login_hint={urllib.parse.quote(self.account)}"
        async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as browser:
            response = await browser.get(url)
            for _ in range(10):
                location = response.headers.get("location", "")
                if location.startswith(REDIRECT_URI):
                    self.returned = urllib.parse.parse_qs(urllib.parse.urlparse(location).query)
                    return
                if response.status_code not in (302, 303):
                    raise RuntimeError(f"the provider answered {response.status_code}")
                response = await browser.get(urllib.parse.urljoin(str(response.url), location))
        raise RuntimeError("the provider never sent the browser back")

    async def callback(self) -> AuthorizationCodeResult:
        returned = self.returned or {}
        if "code" not in returned:
            raise RuntimeError(f"no code came back: {returned.get('error')}")
        return AuthorizationCodeResult(
            code=returned["code"][0],
            state=returned.get("state", [None])[0],
            iss=returned.get("iss", [None])[0],
        )


def claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


async def main(url: str, account: str) -> dict:
    browser = Browser(account)
    storage = Memory()
    auth = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="toolfleet identity test",
            redirect_uris=[REDIRECT_URI],
            grant_types=["authorization_code"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browser.visit,
        callback_handler=browser.callback,
    )
    async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                result = await session.call_tool("calculate", {"expression": "6*7"})
    return {
        "tools": sorted(tool.name for tool in listed.tools),
        "calculate": result.structured_content,
        "is_error": bool(result.is_error),
        "claims": claims(storage.tokens.access_token),
    }


if __name__ == "__main__":
    try:
        print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
    except Exception as err:  # noqa: BLE001 - the test reads why
        print(json.dumps({"refused": f"{type(err).__name__}: {err}"}))
