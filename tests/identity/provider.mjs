// A certified OpenID provider (oidc-provider) for the identity tests:
// `node provider.mjs <config.json>` serves it on 127.0.0.1:<port> and prints
// one line of JSON, {"issuer": ...}, once it listens.
//
// config.json: {
//   "port": 4000,
//   "keys_file": "/tmp/keys.json",   // its signing keys, created if absent
//   "rotate": false,                 // true: sign with a new key, keep the old ones published
//   "resources": ["toolfleet", "https://127.0.0.1:5000/mcp"],  // audiences of its access tokens (JWTs)
//   "scopes": ["agent", "approver", "operator", "reader"],
//   "clients": [{"client_id": "bot", "client_secret": "...", "tenant": "search", "roles": ["agent"]},
//               {"client_id": "console", "redirect_uris": ["http://127.0.0.1/cb"]}],
//   "accounts": {"ana": {"tenant": "search", "roles": ["approver"]}}
// }
//
// A client with a secret signs in by client credentials; one without is a
// public client that signs people in by authorization code with PKCE. The
// login and consent pages are replaced by one step that signs in the
// account the request names in `login_hint` and grants what it asks: the
// tests drive the protocol, not a form. Without a `login_hint`, the login
// is a form that asks for the account's name (no password), as a browser
// test fills it in.

import { generateKeyPairSync } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import Provider, { errors } from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;

function newKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return { ...jwk, kid: `key-${Date.now()}`, alg: 'RS256', use: 'sig' };
}

let keys = existsSync(config.keys_file) ? JSON.parse(readFileSync(config.keys_file, 'utf8')) : [];
if (keys.length === 0 || config.rotate) {
  keys = [newKey(), ...keys];
  writeFileSync(config.keys_file, JSON.stringify(keys));
}

const byClient = Object.fromEntries(config.clients.map((c) => [c.client_id, c]));
const scope = ['openid', ...config.scopes].join(' ');

const provider = new Provider(issuer, {
  jwks: { keys },
  clients: config.clients.map((c) => (c.client_secret
    ? {
      client_id: c.client_id,
      client_secret: c.client_secret,
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      scope,
    }
    : {
      client_id: c.client_id,
      token_endpoint_auth_method: 'none',
      grant_types: ['authorization_code'],
      response_types: ['code'],
      redirect_uris: c.redirect_uris,
      scope,
    })),
  scopes: config.scopes,
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: (ctx, client, oneOf) => oneOf ?? config.resources[0],
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource) => {
        if (!config.resources.includes(resource)) {
          throw new errors.InvalidTarget();
        }
        return {
          scope: config.scopes.join(' '),
          audience: resource,
          accessTokenFormat: 'jwt',
          accessTokenTTL: 300,
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  findAccount: (ctx, id) => (config.accounts[id]
    ? { accountId: id, claims: () => ({ sub: id, preferred_username: id }) }
    : undefined),
  // Who the token is for: a person's tenant and roles, or a service's.
  extraTokenClaims: (ctx, token) => {
    const who = token.accountId ? config.accounts[token.accountId] : byClient[token.clientId];
    return who ? { tenant: who.tenant, roles: who.roles } : {};
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
});

provider.use(async (ctx, next) => {
  if (!ctx.path.startsWith('/interaction/')) {
    return next();
  }
  const { params, prompt, session } = await provider.interactionDetails(ctx.req, ctx.res);
  const accountId = params.login_hint ?? session?.accountId ?? (await postedAccount(ctx));
  if (accountId === undefined) {
    ctx.type = 'html';
    ctx.body = '<!doctype html><title>Sign in</title><h1>Sign in</h1>'
      + '<form method="post"><label for="account">Account</label> <input id="account" name="account">'
      + ' <button type="submit">Sign in</button></form>';
    return undefined;
  }
  if (!config.accounts[accountId]) {
    ctx.status = 400;
    ctx.body = 'login_hint names no account';
    return undefined;
  }
  let result = { login: { accountId } };
  if (prompt.name === 'consent') {
    // Grants what the provider says is missing: scopes, claims, resources.
    const { details } = prompt;
    const grant = new provider.Grant({ accountId, clientId: params.client_id });
    if (details.missingOIDCScope) grant.addOIDCScope(details.missingOIDCScope.join(' '));
    if (details.missingOIDCClaims) grant.addOIDCClaims(details.missingOIDCClaims);
    for (const [resource, scopes] of Object.entries(details.missingResourceScopes ?? {})) {
      grant.addResourceScope(resource, scopes.join(' '));
    }
    result = { consent: { grantId: await grant.save() } };
  }
  ctx.respond = false;
  return provider.interactionFinished(ctx.req, ctx.res, result, { mergeWithLastSubmission: false });
});

// The account a submitted login form names, if this is one.
async function postedAccount(ctx) {
  if (ctx.method !== 'POST') {
    return undefined;
  }
  let body = '';
  for await (const chunk of ctx.req) {
    body += chunk;
    if (body.length > 4096) {
      return undefined;
    }
  }
  return new URLSearchParams(body).get('account') ?? undefined;
}

provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});
