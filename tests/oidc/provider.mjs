// A real OpenID Connect provider (panva's oidc-provider) on loopback, for the
// gateway's tests. Plain HTTP on 127.0.0.1 only; never expose it anywhere else.
//
//   node provider.mjs [port]        (or OIDC_PORT; 0 or nothing picks a free port)
//
// Environment:
//   OIDC_CLIENT_SECRET              secret of the confidential client "gateway"
//   OIDC_REDIRECT_URIS              its redirect_uris, separated by spaces
//   OIDC_POST_LOGOUT_REDIRECT_URIS  its post_logout_redirect_uris, separated by spaces
//   OIDC_OTHER_CLIENT_SECRET        secret of the second client "other-app"
//   OIDC_OTHER_REDIRECT_URIS        its redirect_uris, separated by spaces
//
// Prints "READY <issuer>" on stdout once listening, logs each request to
// stderr, and exits on SIGTERM or SIGINT. README.md describes the login pages
// and the test-only endpoints under /__test__/.

import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';

import * as jose from 'jose';
import Provider from 'oidc-provider';

const HOST = '127.0.0.1';
const GATEWAY = 'gateway';
const OTHER = 'other-app';

function words(value, fallback) {
  const list = (value ?? '').split(/\s+/).filter(Boolean);
  return list.length ? list : fallback;
}

const requestedPort = Number(process.argv[2] ?? process.env.OIDC_PORT ?? 0);
if (!Number.isInteger(requestedPort) || requestedPort < 0 || requestedPort > 65535) {
  console.error(`invalid port: ${process.argv[2] ?? process.env.OIDC_PORT}`);
  process.exit(2);
}

const clientSecret = process.env.OIDC_CLIENT_SECRET || 'gateway-test-client-secret';
const otherSecret = process.env.OIDC_OTHER_CLIENT_SECRET || 'other-app-test-client-secret';
const otherRedirects = words(process.env.OIDC_OTHER_REDIRECT_URIS, ['https://other-app.test/callback']);
const initialRedirects = {
  redirect_uris: words(process.env.OIDC_REDIRECT_URIS, ['https://gateway.test/login/callback']),
  post_logout_redirect_uris: words(process.env.OIDC_POST_LOGOUT_REDIRECT_URIS, ['https://gateway.test/']),
};

// --- accounts -------------------------------------------------------------------

const PASSWORD = 'password';
const ACCOUNTS = new Map(
  [
    ['alice', { name: 'Alice Example', email: 'alice@example.test' }],
    ['bob', { name: 'Bob Example', email: 'bob@example.test' }],
    ['carol', { name: 'Carol Example', email: 'carol@example.test' }],
  ].map(([sub, profile]) => [sub, { sub, preferred_username: sub, email_verified: true, ...profile }]),
);

async function findAccount(_ctx, id) {
  const account = ACCOUNTS.get(id);
  if (!account) return undefined;
  return { accountId: id, claims: async () => ({ ...account }) };
}

// --- keys -----------------------------------------------------------------------
// The provider signs with `signingKey`; its public half is what the JWKS
// endpoint publishes and what the gateway trusts. The forged tokens below are
// re-signed with the same private key, so each one differs from a genuine
// token only in the claim under test.

async function rsaKey(kid) {
  const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true, modulusLength: 2048 });
  return { ...(await jose.exportJWK(privateKey)), kid, alg: 'RS256', use: 'sig' };
}

const signingJwk = await rsaKey(`test-${randomBytes(6).toString('hex')}`);
const signingKey = await jose.importJWK(signingJwk, 'RS256');
// Same kid as the real key (so a verifier picks the real public key and the
// signature check itself fails), but a different key pair.
const impostorKey = await jose.importJWK(await rsaKey(signingJwk.kid), 'RS256');
// A key the JWKS has never published.
const unknownJwk = await rsaKey(`unknown-${randomBytes(6).toString('hex')}`);
const unknownKey = await jose.importJWK(unknownJwk, 'RS256');

// --- clients --------------------------------------------------------------------
// Served through the adapter rather than the static `clients` option, so the
// tests can change the gateway's redirect URIs while the provider runs.

const clientMetadata = new Map();

function resetClients() {
  clientMetadata.set(GATEWAY, {
    client_id: GATEWAY,
    client_secret: clientSecret,
    client_name: 'Gateway',
    application_type: 'web',
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'RS256',
    ...structuredClone(initialRedirects),
  });
  clientMetadata.set(OTHER, {
    client_id: OTHER,
    client_secret: otherSecret,
    client_name: 'Other app',
    application_type: 'web',
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'RS256',
    redirect_uris: [...otherRedirects],
  });
}
resetClients();

// The in-memory storage every other model needs (codes, sessions, grants,
// interactions). Expired entries are dropped when read.
const storage = new Map();
// The models revoked with their grant (as in oidc-provider's own memory adapter).
const GRANTABLE = new Set([
  'AccessToken', 'AuthorizationCode', 'RefreshToken', 'DeviceCode',
  'BackchannelAuthenticationRequest', 'PreAuthorizedCode',
]);

class TestAdapter {
  constructor(name) {
    this.name = name;
  }

  key(id) {
    return `${this.name}:${id}`;
  }

  async upsert(id, payload, expiresIn) {
    const expiresAt = expiresIn ? Date.now() + expiresIn * 1000 : undefined;
    storage.set(this.key(id), { payload, expiresAt });
    if (GRANTABLE.has(this.name) && payload.grantId) {
      const grantKey = `grant:${payload.grantId}`;
      storage.set(grantKey, [...(storage.get(grantKey) ?? []), this.key(id)]);
    }
    if (this.name === 'DeviceCode' && payload.userCode) storage.set(`userCode:${payload.userCode}`, id);
    if (this.name === 'Session' && payload.uid) storage.set(`sessionUid:${payload.uid}`, id);
  }

  async find(id) {
    if (this.name === 'Client') {
      const metadata = clientMetadata.get(id);
      return metadata && structuredClone(metadata);
    }
    const entry = storage.get(this.key(id));
    if (!entry) return undefined;
    if (entry.expiresAt !== undefined && entry.expiresAt <= Date.now()) {
      storage.delete(this.key(id));
      return undefined;
    }
    return entry.payload;
  }

  async findByUserCode(userCode) {
    const id = storage.get(`userCode:${userCode}`);
    return id && this.find(id);
  }

  async findByUid(uid) {
    const id = storage.get(`sessionUid:${uid}`);
    return id && this.find(id);
  }

  async consume(id) {
    const entry = storage.get(this.key(id));
    if (entry) entry.payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) {
    storage.delete(this.key(id));
  }

  async revokeByGrantId(grantId) {
    const grantKey = `grant:${grantId}`;
    for (const key of storage.get(grantKey) ?? []) storage.delete(key);
    storage.delete(grantKey);
  }
}

// --- faults ---------------------------------------------------------------------
// Each fault replaces the id_token of the token endpoint's response with a
// variant of the genuine one.

function now() {
  return Math.floor(Date.now() / 1000);
}

const FAULTS = {
  wrong_audience: (claims) => sign({ ...claims, aud: OTHER, azp: undefined }),
  wrong_issuer: (claims) => sign({ ...claims, iss: 'http://evil.example' }),
  bad_signature: (claims) => sign(claims, impostorKey),
  unknown_kid: (claims) => sign(claims, unknownKey, unknownJwk.kid),
  expired: (claims) => sign({ ...claims, iat: now() - 7200, exp: now() - 3600 }),
  wrong_nonce: (claims) => sign({ ...claims, nonce: `wrong-${randomBytes(8).toString('hex')}` }),
  missing_nonce: (claims) => sign({ ...claims, nonce: undefined }),
  alg_none: (claims) => new jose.UnsecuredJWT(clean(claims)).encode(),
  // HMAC with the client's own secret: valid only for clients registered for HS256.
  alg_hs256: (claims) => new jose.SignJWT(clean(claims))
    .setProtectedHeader({ alg: 'HS256' })
    .sign(new TextEncoder().encode(clientSecret)),
};

function clean(claims) {
  return Object.fromEntries(Object.entries(claims).filter(([, value]) => value !== undefined));
}

function sign(claims, key = signingKey, kid = signingJwk.kid) {
  return new jose.SignJWT(clean(claims)).setProtectedHeader({ alg: 'RS256', kid }).sign(key);
}

let idTokenFault = null;

// --- provider -------------------------------------------------------------------

const server = createServer();
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(requestedPort, HOST, resolve);
});
const issuer = `http://${HOST}:${server.address().port}`;

const provider = new Provider(issuer, {
  adapter: TestAdapter,
  findAccount,
  jwks: { keys: [signingJwk] },
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email', 'email_verified'],
  },
  scopes: ['openid', 'profile', 'email'],
  responseTypes: ['code'],
  // Put the requested profile and email claims in the ID token itself.
  conformIdTokenClaims: false,
  clientAuthMethods: ['client_secret_basic', 'client_secret_post'],
  // PKCE for every authorization request, S256 only (the only method oidc-provider supports).
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: {
      enabled: true,
      // Plain pages: the defaults load web fonts from the internet.
      async logoutSource(ctx, form) {
        ctx.type = 'html';
        ctx.body = page('Sign out', `<h1>Sign out of ${escape(ctx.host)}?</h1>
${form}
<button id="logout" type="submit" form="op.logoutForm" name="logout" value="yes">Yes, sign me out</button>
<button id="stay" type="submit" form="op.logoutForm">No, stay signed in</button>`);
      },
      async postLogoutSuccessSource(ctx) {
        ctx.type = 'html';
        ctx.body = page('Signed out', '<h1 id="signed-out">Signed out</h1>');
      },
    },
  },
  interactions: {
    url: (_ctx, interaction) => `/interaction/${interaction.uid}`,
  },
  // The gateway is first party: its grant is created here, so it never sees a
  // consent screen. Other clients get one (a single "Allow" button).
  async loadExistingGrant(ctx) {
    const { client, session, params, result } = ctx.oidc;
    const grantId = result?.consent?.grantId || session.grantIdFor(client.clientId);
    let grant = grantId ? await ctx.oidc.provider.Grant.find(grantId) : undefined;
    if (client.clientId !== GATEWAY) return grant;
    grant ??= new ctx.oidc.provider.Grant({ clientId: client.clientId, accountId: session.accountId });
    grant.addOIDCScope(String(params.scope ?? 'openid'));
    await grant.save();
    return grant;
  },
  ttl: {
    AuthorizationCode: 60,
    IdToken: 300,
    AccessToken: 300,
    Interaction: 600,
    Session: 3600,
    Grant: 3600,
  },
  renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = page('Error', `<h1>${escape(out.error)}</h1><p id="error-description">${escape(out.error_description ?? '')}</p>`);
  },
});

provider.on('server_error', (_ctx, err) => console.error('server_error', err));

provider.use(async (ctx, next) => {
  await next();
  if (idTokenFault && ctx.oidc?.route === 'token' && ctx.status === 200 && ctx.body?.id_token) {
    const body = { ...ctx.body };
    body.id_token = await FAULTS[idTokenFault](jose.decodeJwt(body.id_token));
    ctx.body = body;
  }
});

// --- HTML -----------------------------------------------------------------------

function escape(value) {
  return String(value).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title></head>
<body>${body}</body></html>
`;
}

function loginPage(uid, clientId, error) {
  return page('Sign in', `<h1>Sign in to ${escape(clientId)}</h1>
${error ? `<p id="error" role="alert">${escape(error)}</p>` : ''}
<form id="login" method="post" action="/interaction/${escape(uid)}/login">
<label for="login">Login</label> <input id="login" name="login" autocomplete="username" required autofocus>
<label for="password">Password</label> <input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button>
</form>
<p><a id="abort" href="/interaction/${escape(uid)}/abort">Cancel</a></p>`);
}

function consentPage(uid, clientId, scopes) {
  return page('Authorize', `<h1>Allow ${escape(clientId)} to access your account?</h1>
<p>Scopes: ${escape(scopes.join(' '))}</p>
<form id="consent" method="post" action="/interaction/${escape(uid)}/confirm">
<button type="submit">Allow</button>
</form>
<p><a id="abort" href="/interaction/${escape(uid)}/abort">Deny</a></p>`);
}

// --- interactions and test endpoints --------------------------------------------

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
  res.end(body);
}

function sendJson(res, status, value) {
  send(res, status, 'application/json', JSON.stringify(value));
}

function faultState() {
  return { id_token: idTokenFault, available: Object.keys(FAULTS), clients: Object.fromEntries(clientMetadata) };
}

async function testEndpoint(req, res, path) {
  if (req.method === 'GET' && path === '/__test__/faults') return sendJson(res, 200, faultState());
  if (req.method !== 'POST') return sendJson(res, 405, { error: 'method not allowed' });
  const raw = await readBody(req);
  let body;
  try {
    body = raw ? JSON.parse(raw) : {};
  } catch {
    return sendJson(res, 400, { error: 'body is not JSON' });
  }
  switch (path) {
    case '/__test__/faults': {
      const fault = body.id_token ?? null;
      if (fault !== null && !Object.hasOwn(FAULTS, fault)) {
        return sendJson(res, 400, { error: `unknown id_token fault: ${fault}`, available: Object.keys(FAULTS) });
      }
      idTokenFault = fault;
      return sendJson(res, 200, faultState());
    }
    case '/__test__/reset':
      idTokenFault = null;
      resetClients();
      return sendJson(res, 200, faultState());
    case '/__test__/client': {
      const metadata = clientMetadata.get(GATEWAY);
      for (const field of ['redirect_uris', 'post_logout_redirect_uris']) {
        if (body[field] === undefined) continue;
        if (!Array.isArray(body[field]) || !body[field].every((uri) => typeof uri === 'string')) {
          return sendJson(res, 400, { error: `${field} must be a list of strings` });
        }
        metadata[field] = body[field];
      }
      return sendJson(res, 200, faultState());
    }
    default:
      return sendJson(res, 404, { error: 'no such test endpoint' });
  }
}

async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) return send(res, 400, 'text/plain', 'interaction mismatch');
  const { prompt, params } = details;

  if (action === 'abort') {
    return provider.interactionFinished(req, res, {
      error: 'access_denied', error_description: 'End-User aborted interaction',
    }, { mergeWithLastSubmission: false });
  }

  if (prompt.name === 'login') {
    if (action === undefined && req.method === 'GET') {
      return send(res, 200, 'text/html; charset=utf-8', loginPage(uid, params.client_id));
    }
    if (action === 'login' && req.method === 'POST') {
      const form = new URLSearchParams(await readBody(req));
      const login = form.get('login') ?? '';
      if (!ACCOUNTS.has(login) || form.get('password') !== PASSWORD) {
        return send(res, 401, 'text/html; charset=utf-8', loginPage(uid, params.client_id, 'Unknown login or wrong password.'));
      }
      return provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
    }
  }

  if (prompt.name === 'consent') {
    if (action === undefined && req.method === 'GET') {
      return send(res, 200, 'text/html; charset=utf-8', consentPage(uid, params.client_id, String(params.scope ?? '').split(' ')));
    }
    if (action === 'confirm' && req.method === 'POST') {
      await readBody(req);
      const grant = details.grantId
        ? await provider.Grant.find(details.grantId)
        : new provider.Grant({ accountId: details.session.accountId, clientId: params.client_id });
      const { missingOIDCScope, missingOIDCClaims, missingResourceScopes } = prompt.details;
      if (missingOIDCScope) grant.addOIDCScope(missingOIDCScope.join(' '));
      if (missingOIDCClaims) grant.addOIDCClaims(missingOIDCClaims);
      for (const [indicator, scope] of Object.entries(missingResourceScopes ?? {})) {
        grant.addResourceScope(indicator, scope.join(' '));
      }
      const grantId = await grant.save();
      return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
    }
  }

  return send(res, 400, 'text/plain', `unexpected ${req.method} for prompt ${prompt.name}`);
}

const providerCallback = provider.callback();
const INTERACTION = /^\/interaction\/([\w-]+)(?:\/(login|confirm|abort))?$/;

server.on('request', (req, res) => {
  const started = Date.now();
  res.on('finish', () => {
    console.error(`${req.method} ${req.url} -> ${res.statusCode} (${Date.now() - started} ms)`);
  });
  const { pathname } = new URL(req.url, issuer);
  const match = INTERACTION.exec(pathname);
  let handled;
  if (pathname.startsWith('/__test__/')) {
    handled = testEndpoint(req, res, pathname);
  } else if (match) {
    handled = interaction(req, res, match[1], match[2]);
  } else {
    providerCallback(req, res);
    return;
  }
  handled.catch((err) => {
    console.error(err);
    if (!res.headersSent) {
      send(res, err.statusCode ?? 500, 'text/plain', `${err.name}: ${err.message}`);
    } else {
      res.end();
    }
  });
});

function shutdown() {
  server.close(() => process.exit(0));
  server.closeAllConnections();
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);

console.log(`READY ${issuer}`);
