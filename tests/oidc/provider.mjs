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
//   OIDC_CONNECT_CLIENT_SECRET      secret of the third-party OAuth client "connect-app"
//   OIDC_CONNECT_REDIRECT_URIS      its redirect_uris, separated by spaces
//
// Prints "READY <issuer>" on stdout once listening, logs each request to
// stderr, and exits on SIGTERM or SIGINT. README.md describes the login pages
// and the test-only endpoints under /__test__/.

import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import { Readable } from 'node:stream';

import * as jose from 'jose';
import Provider from 'oidc-provider';

const HOST = '127.0.0.1';
const GATEWAY = 'gateway';
const OTHER = 'other-app';
// A client of the provider acting as a third-party OAuth authorization server:
// the gateway connects end users' accounts to it (refresh tokens, revocation).
const CONNECT = 'connect-app';

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
const connectSecret = process.env.OIDC_CONNECT_CLIENT_SECRET || 'connect-app-test-client-secret';
// The gateway's redirect URI for its credential type "example": one per type.
const connectRedirects = words(process.env.OIDC_CONNECT_REDIRECT_URIS, ['https://gateway.test/oauth/callback/example']);
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
  clientMetadata.set(CONNECT, {
    client_id: CONNECT,
    client_secret: connectSecret,
    client_name: 'Connect app',
    application_type: 'web',
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'RS256',
    redirect_uris: [...connectRedirects],
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
  // Issued to another client that presents it: aud still names the client, azp does not.
  wrong_azp: (claims) => sign({ ...claims, azp: OTHER }),
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

// Fields of the discovery document replaced (or, set to null, removed) by the
// tests: POST /__test__/discovery. Every client sees them.
let discoveryOverrides = {};

function overridden(document) {
  const changed = { ...document };
  for (const [key, value] of Object.entries(discoveryOverrides)) {
    if (value === null) delete changed[key];
    else changed[key] = value;
  }
  return changed;
}

// connect-app's authorization responses without `iss`, while send_iss is false.
function withoutIss(ctx) {
  const location = ctx.response.get('location');
  if (!location || ctx.oidc?.client?.clientId !== CONNECT) return;
  const url = new URL(location, issuer);
  if (url.origin === new URL(issuer).origin || !url.searchParams.has('iss')) return;
  url.searchParams.delete('iss');
  ctx.set('location', url.href);
}

// --- connect-app: token endpoint controls -----------------------------------------
// What the tests set for connect-app (POST /__test__/connect), and what the
// provider saw of it (GET /__test__/connect). /__test__/reset restores both.

const GRANT_TYPES = ['authorization_code', 'refresh_token'];
// Each answers connect-app's token requests in place of the provider, except
// `slow` and `trickle`, which let the provider answer and hold the answer back
// (`trickle` sends it a few bytes at a time), and `no_id_token`, which lets it
// answer and drops the ID token. Nothing is spent by the others: the code or
// refresh token sent stays usable.
const TOKEN_FAULTS = [
  'invalid_grant', 'html', 'oversize', 'slow', 'missing_access_token', 'server_error',
  'invalid_client', 'invalid_request', 'throttled', 'trickle', 'no_id_token',
];
const GENUINE_FAULTS = new Set(['slow', 'trickle', 'no_id_token']);
const TRICKLE_PIECES = 40;
const REVOCATION_FAULTS = ['slow', 'server_error'];
const OVERSIZE_PADDING = 96 * 1024;

function connectDefaults() {
  return {
    access_token_ttl: 300,
    grant_only: null,
    token_fault: null,
    fault_grant_types: null,
    slow_seconds: 3,
    refresh_delay_ms: 0,
    revocation_fault: null,
    retry_after: '120',
    answer_patch: null,
    // RFC 9207: `iss` in its authorization responses (oidc-provider always sends it).
    send_iss: true,
  };
}

let connect = connectDefaults();
let connectStats;

function resetConnectStats() {
  connectStats = {
    token_calls: Object.fromEntries(GRANT_TYPES.map((type) => [type, 0])),
    token_requests: [],
    revocations: [],
  };
}
resetConnectStats();

function connectState() {
  return {
    ...connect,
    ...structuredClone(connectStats),
    redirect_uris: [...clientMetadata.get(CONNECT).redirect_uris],
    token_faults: TOKEN_FAULTS,
    revocation_faults: REVOCATION_FAULTS,
  };
}

// Validates a POST /__test__/connect body; returns an error message or applies it.
function updateConnect(body) {
  const known = new Set([...Object.keys(connectDefaults()), 'reset_stats']);
  const unknown = Object.keys(body).filter((key) => !known.has(key));
  if (unknown.length) return `unknown settings: ${unknown.join(', ')}`;
  const checks = {
    access_token_ttl: (v) => Number.isInteger(v) && v >= 1,
    grant_only: (v) => v === null || (Array.isArray(v) && v.every((scope) => typeof scope === 'string')),
    token_fault: (v) => v === null || TOKEN_FAULTS.includes(v),
    fault_grant_types: (v) => v === null || (Array.isArray(v) && v.every((type) => GRANT_TYPES.includes(type))),
    slow_seconds: (v) => typeof v === 'number' && v >= 0 && v <= 600,
    refresh_delay_ms: (v) => Number.isInteger(v) && v >= 0 && v <= 600_000,
    revocation_fault: (v) => v === null || REVOCATION_FAULTS.includes(v),
    retry_after: (v) => v === null || typeof v === 'string',
    answer_patch: (v) => v === null || (typeof v === 'object' && !Array.isArray(v)),
    send_iss: (v) => typeof v === 'boolean',
    reset_stats: (v) => typeof v === 'boolean',
  };
  for (const [key, value] of Object.entries(body)) {
    if (!checks[key](value)) return `invalid ${key}: ${JSON.stringify(value)}`;
  }
  const { reset_stats: resetStats, ...settings } = body;
  connect = { ...connect, ...settings };
  if (resetStats) resetConnectStats();
  return null;
}

function sleep(ms) {
  return new Promise((resolve) => { setTimeout(resolve, ms); });
}

// Requests that send the same refresh token are handled one after the other,
// as a database transaction would: of two concurrent refreshes, the first
// rotates and the second finds the token used up.
const refreshQueues = new Map();

async function oneAtATime(key, task) {
  const previous = refreshQueues.get(key) ?? Promise.resolve();
  let done;
  const turn = new Promise((resolve) => { done = resolve; });
  const tail = previous.then(() => turn);
  refreshQueues.set(key, tail);
  await previous;
  try {
    return await task();
  } finally {
    done();
    if (refreshQueues.get(key) === tail) refreshQueues.delete(key);
  }
}

// The client a token or revocation request claims to be (before the provider
// authenticates it), and how it authenticates.
function claimedClient(ctx, params) {
  const header = ctx.get('authorization');
  if (/^basic /i.test(header)) {
    const decoded = Buffer.from(header.slice(6).trim(), 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    let clientId = colon === -1 ? decoded : decoded.slice(0, colon);
    try {
      clientId = decodeURIComponent(clientId.replace(/\+/g, ' '));
    } catch {
      // not form-encoded: taken as it is
    }
    return { clientId, authMethod: 'client_secret_basic' };
  }
  const authMethod = params.has('client_secret') ? 'client_secret_post' : 'none';
  return { clientId: params.get('client_id'), authMethod };
}

// Reads a form body ahead of the provider, which then takes it from req.body
// (oidc-provider logs one warning about an upstream body parser for that).
async function peekForm(ctx) {
  if (ctx.method !== 'POST' || !ctx.is('application/x-www-form-urlencoded')) return new URLSearchParams();
  const raw = await readBody(ctx.req);
  ctx.req.body = raw;
  return new URLSearchParams(raw);
}

function answer(ctx, status, type, body) {
  ctx.status = status;
  ctx.type = type;
  ctx.set('cache-control', 'no-store');
  ctx.body = body;
}

const FAULT_ANSWERS = {
  invalid_grant: (ctx) => answer(ctx, 400, 'application/json', {
    error: 'invalid_grant', error_description: 'grant request is invalid (test fault)',
  }),
  html: (ctx) => answer(ctx, 200, 'text/html; charset=utf-8', page('Sign in', `<h1>Sign in</h1>
<p>Our sign-in service is down for maintenance. Please try again later.</p>`)),
  oversize: (ctx) => answer(ctx, 200, 'application/json', JSON.stringify({
    access_token: `oversize-${randomBytes(16).toString('hex')}`,
    token_type: 'Bearer',
    expires_in: connect.access_token_ttl,
    refresh_token: `oversize-${randomBytes(16).toString('hex')}`,
    padding: 'x'.repeat(OVERSIZE_PADDING),
  })),
  missing_access_token: (ctx) => answer(ctx, 200, 'application/json', {
    token_type: 'Bearer', expires_in: connect.access_token_ttl,
  }),
  server_error: (ctx) => answer(ctx, 503, 'application/json', {
    error: 'server_error', error_description: 'the authorization server is unavailable (test fault)',
  }),
  invalid_client: (ctx) => {
    ctx.set('www-authenticate', 'Basic realm="connect-app"');
    answer(ctx, 401, 'application/json', {
      error: 'invalid_client', error_description: 'client authentication failed (test fault)',
    });
  },
  invalid_request: (ctx) => answer(ctx, 400, 'application/json', {
    error: 'invalid_request', error_description: 'the request is missing a parameter (test fault)',
  }),
  throttled: (ctx) => {
    if (connect.retry_after !== null) ctx.set('retry-after', connect.retry_after);
    answer(ctx, 429, 'application/json', {
      error: 'slow_down', error_description: 'too many requests (test fault)',
    });
  },
};

// The genuine answer, its body sent in TRICKLE_PIECES pieces spread over
// slow_seconds: every read gets a few bytes well within any read timeout.
function trickle(ctx) {
  const body = Buffer.from(typeof ctx.body === 'string' || Buffer.isBuffer(ctx.body)
    ? ctx.body : JSON.stringify(ctx.body));
  const step = Math.ceil(body.length / TRICKLE_PIECES);
  const pause = (connect.slow_seconds * 1000) / TRICKLE_PIECES;
  ctx.type = 'application/json';
  ctx.body = Readable.from((async function* pieces() {
    for (let start = 0; start < body.length; start += step) {
      await sleep(pause);
      yield body.subarray(start, start + step);
    }
  })());
}

async function connectTokenRequest(ctx, next) {
  const params = await peekForm(ctx);
  const { clientId, authMethod } = claimedClient(ctx, params);
  if (clientId !== CONNECT) return next();

  const grantType = params.get('grant_type');
  if (Object.hasOwn(connectStats.token_calls, grantType)) connectStats.token_calls[grantType] += 1;
  const faulted = connect.token_fault !== null
    && (connect.fault_grant_types === null || connect.fault_grant_types.includes(grantType));
  const fault = faulted ? connect.token_fault : null;
  const record = { grant_type: grantType, auth_method: authMethod, fault, status: null };
  connectStats.token_requests.push(record);
  try {
    if (grantType === 'refresh_token' && connect.refresh_delay_ms > 0) await sleep(connect.refresh_delay_ms);
    if (fault && !GENUINE_FAULTS.has(fault)) return FAULT_ANSWERS[fault](ctx);
    if (grantType === 'refresh_token') await oneAtATime(params.get('refresh_token') ?? '', next);
    else await next();
    const patched = connect.answer_patch !== null && ctx.status === 200
      && (connect.fault_grant_types === null || connect.fault_grant_types.includes(grantType));
    if (patched) ctx.body = { ...ctx.body, ...connect.answer_patch };
    if (fault === 'slow') await sleep(connect.slow_seconds * 1000);
    if (fault === 'no_id_token' && ctx.status === 200 && ctx.body?.id_token) {
      const { id_token: _dropped, ...body } = ctx.body;
      ctx.body = body;
    }
    if (fault === 'trickle') trickle(ctx);
  } finally {
    record.status = ctx.status;
  }
}

async function connectRevocationRequest(ctx, next) {
  const params = await peekForm(ctx);
  const { clientId, authMethod } = claimedClient(ctx, params);
  if (clientId !== CONNECT) return next();

  const token = params.get('token');
  let found = null;
  try {
    if (token && await provider.RefreshToken.find(token)) found = 'refresh_token';
    else if (token && await provider.AccessToken.find(token)) found = 'access_token';
  } catch {
    // not a token of this provider's format
  }
  const fault = connect.revocation_fault;
  const record = {
    token_type_hint: params.get('token_type_hint'), token, found, auth_method: authMethod, fault, status: null,
  };
  connectStats.revocations.push(record);
  try {
    if (fault === 'server_error') return FAULT_ANSWERS.server_error(ctx);
    await next();
    if (fault === 'slow') await sleep(connect.slow_seconds * 1000);
  } finally {
    record.status = ctx.status;
  }
}

// A resource server's view of connect-app's access tokens, like a third-party
// API's "who am I" endpoint: unlike userinfo, it needs no openid scope.
async function apiUser(ctx) {
  const match = /^bearer (\S+)$/i.exec(ctx.get('authorization'));
  const token = match && await provider.AccessToken.find(match[1]);
  if (!token) {
    ctx.set('www-authenticate', 'Bearer error="invalid_token"');
    return answer(ctx, 401, 'application/json', { error: 'invalid_token' });
  }
  const account = ACCOUNTS.get(token.accountId);
  return answer(ctx, 200, 'application/json', {
    sub: account.sub,
    preferred_username: account.preferred_username,
    name: account.name,
    email: account.email,
    client_id: token.clientId,
    scope: token.scope ?? '',
  });
}

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
    // connect-app's scopes, named like a code host's: read:user and user:email
    // carry claims as profile and email do; repo carries none.
    'read:user': ['name', 'preferred_username'],
    'user:email': ['email', 'email_verified'],
  },
  scopes: ['openid', 'offline_access', 'profile', 'email', 'repo', 'read:user', 'user:email'],
  responseTypes: ['code'],
  // Put the requested profile and email claims in the ID token itself.
  conformIdTokenClaims: false,
  clientAuthMethods: ['client_secret_basic', 'client_secret_post'],
  // PKCE for every authorization request, S256 only (the only method oidc-provider supports).
  pkce: { required: () => true },
  // Every authorization code grant to a client allowed refresh tokens
  // (connect-app) comes with one, offline_access or not.
  issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
  // Each refresh answers with a new refresh token; the one sent is used up, and
  // sending it again is invalid_grant and revokes the grant (oidc-provider's reuse detection).
  rotateRefreshToken: true,
  // connect-app's tokens outlive the browser session at the provider, as a
  // third-party service's do; the others' end with it unless offline_access.
  expiresWithSession: async (ctx, code) => code.clientId !== CONNECT && !code.scopes.has('offline_access'),
  features: {
    devInteractions: { enabled: false },
    // RFC 7009; revoking a refresh token or an access token ends every token of its grant.
    revocation: { enabled: true },
    userinfo: { enabled: true },
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
    AccessToken: (_ctx, token) => (token.clientId === CONNECT ? connect.access_token_ttl : 300),
    RefreshToken: 3600,
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
  if (ctx.method === 'POST' && ctx.path === '/token') await connectTokenRequest(ctx, next);
  else if (ctx.method === 'POST' && ctx.path === '/token/revocation') await connectRevocationRequest(ctx, next);
  else if (ctx.method === 'GET' && ctx.path === '/api/user') await apiUser(ctx);
  else await next();
  if (ctx.oidc?.route === 'discovery' && ctx.status === 200) ctx.body = overridden(ctx.body);
  if (!connect.send_iss && ctx.status >= 300 && ctx.status < 400) withoutIss(ctx);
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
  if (req.method === 'GET' && path === '/__test__/connect') return sendJson(res, 200, connectState());
  if (req.method === 'GET' && path === '/__test__/discovery') return sendJson(res, 200, discoveryOverrides);
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
      discoveryOverrides = {};
      resetClients();
      connect = connectDefaults();
      resetConnectStats();
      return sendJson(res, 200, faultState());
    case '/__test__/discovery': {
      if (typeof body !== 'object' || body === null || Array.isArray(body)) {
        return sendJson(res, 400, { error: 'the overrides are a JSON object' });
      }
      discoveryOverrides = body;
      return sendJson(res, 200, discoveryOverrides);
    }
    case '/__test__/connect': {
      const error = updateConnect(body);
      if (error) return sendJson(res, 400, { error });
      return sendJson(res, 200, connectState());
    }
    case '/__test__/client': {
      const clientId = body.client ?? GATEWAY;
      const metadata = clientMetadata.get(clientId);
      if (!metadata) return sendJson(res, 400, { error: `unknown client: ${clientId}` });
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
      if (missingOIDCScope && params.client_id === CONNECT && connect.grant_only !== null) {
        // The user grants only some of the scopes (openid is always granted):
        // the others are rejected, and the tokens' scope is narrower than asked.
        const allowed = new Set(['openid', ...connect.grant_only]);
        const granted = missingOIDCScope.filter((scope) => allowed.has(scope));
        const rejected = missingOIDCScope.filter((scope) => !allowed.has(scope));
        if (granted.length) grant.addOIDCScope(granted.join(' '));
        if (rejected.length) grant.rejectOIDCScope(rejected.join(' '));
      } else if (missingOIDCScope) {
        grant.addOIDCScope(missingOIDCScope.join(' '));
      }
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
