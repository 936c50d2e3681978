"""Gets an access token from the test OpenID provider and prints it.

    python access_token.py client <issuer> <client_id> <secret> <resource> <scope>
    python access_token.py signin <issuer> <client_id> <redirect_uri> <account> <resource> <scope>
    python access_token.py authorize <authorization_url> <redirect_uri>

`authorize` prints, instead of a token, the URL the provider sends the
browser back to (with its code), for a client that exchanges it itself (a
web console). `client`: a service, by client credentials. `signin`: a person, by
authorization code with PKCE, as a browser and a public client would. The
provider's interaction step signs in the account named in `login_hint`
(tests/identity/provider.mjs), so following the redirects is the whole of
the person's part.
"""

import base64
import hashlib
import secrets
import sys
import urllib.parse

import httpx2 as httpx


def client(issuer: str, client_id: str, secret: str, resource: str, scope: str) -> str:
    response = httpx.post(
        f"{issuer}/token",
        auth=(client_id, secret),
        data={"grant_type": "client_credentials", "resource": resource, "scope": scope},
        timeout=10,
    )
    if response.status_code != 200:
        sys.exit(f"the provider answered {response.status_code}: {response.text[:300]}")
    return response.json()["access_token"]


def signin(
    issuer: str, client_id: str, redirect_uri: str, account: str, resource: str, scope: str
) -> str:
    verifier = secrets.token_urlsafe(48)
    challenge = (
        base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        .rstrip(b"=")
        .decode()
    )
    state = secrets.token_urlsafe(16)
    with httpx.Client(follow_redirects=False, timeout=10) as browser:
        response = browser.get(
            f"{issuer}/auth",
            params={
                "client_id": client_id,
                "response_type": "code",
                "redirect_uri": redirect_uri,
                "scope": f"openid {scope}",
                "resource": resource,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
                "state": state,
                "login_hint": account,
            },
        )
        # The provider's own redirects, until it sends the browser back to
        # the client with the code.
        for _ in range(10):
            location = response.headers.get("location", "")
            if location.startswith(redirect_uri):
                break
            if response.status_code not in (302, 303):
                sys.exit(f"the provider answered {response.status_code}: {response.text[:200]}")
            response = browser.get(urllib.parse.urljoin(str(response.url), location))
        query = urllib.parse.parse_qs(urllib.parse.urlparse(location).query)
        if query.get("state") != [state] or "code" not in query:
            sys.exit(f"no code came back: {query.get('error', ['?'])[0]}")
        token = browser.post(
            f"{issuer}/token",
            data={
                "grant_type": "authorization_code",
                "code": query["code"][0],
                "redirect_uri": redirect_uri,
                "client_id": client_id,
                "code_verifier": verifier,
                "resource": resource,
            },
        )
        token.raise_for_status()
        return token.json()["access_token"]


def follow(browser, url: str, redirect_uri: str) -> str:
    """Follows the provider's redirects from `url` until it sends the
    browser to `redirect_uri`; that location."""
    response = browser.get(url)
    for _ in range(10):
        location = response.headers.get("location", "")
        if location.startswith(redirect_uri):
            return location
        if response.status_code not in (302, 303):
            sys.exit(f"the provider answered {response.status_code}: {response.text[:200]}")
        response = browser.get(urllib.parse.urljoin(str(response.url), location))
    sys.exit("the provider never sent the browser back")


def authorize(authorization_url: str, redirect_uri: str) -> str:
    with httpx.Client(follow_redirects=False, timeout=10) as browser:
        return follow(browser, authorization_url, redirect_uri)


if __name__ == "__main__":
    how = {"client": client, "signin": signin, "authorize": authorize}[sys.argv[1]]
    print(how(*sys.argv[2:]))
