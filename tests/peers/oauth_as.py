"""A real local OAuth 2.1 authorization server for graph-os' acceptance tests. TEST-ONLY.

Built on the MCP Python SDK's own authorization-server support (`mcp.server.auth`): its routes
serve RFC 8414 metadata, RFC 7591 dynamic client registration, the authorization endpoint
(authorization code + PKCE S256), the token endpoint (code and refresh-token grants) and
revocation. This module adds the provider behind them and what the SDK leaves out:

* the client credentials grant (RFC 6749 §4.4, OAuth 2.1 §4.2) at the same token endpoint: a
  registered client authenticates with client_secret_basic (id and secret form-encoded, then
  Basic) or client_secret_post and gets an access token whose sub is its client_id, aud the
  request's `resource` (else `audience`, else --audience), scope the requested scope; no refresh
  token. A wrong secret is 401 `invalid_client`;

* access tokens are RS256 JWTs (RFC 9068 shape): iss, sub, aud (the RFC 8707 `resource` of the
  request, else --audience), iat, nbf, exp (1 h), scope (space separated), client_id, jti;
* `jwks_uri` in the metadata (the SDK's `OAuthMetadata` has no such field) and the JWKS at `/jwks`;
* auto-approval: /authorize redirects straight back to the client's redirect_uri with `code`,
  `state` and the RFC 9207 `iss`; no login UI, and any scope is granted (also beyond the
  registered ones, so step-up re-authorization works). The subject is --sub, or the `login_hint` query
  parameter of the authorization request when given;
* test-only admin endpoints, which a real authorization server must never have:
    POST /test/rotate?keep_old=0|1  new key pair with a new kid; the JWKS then serves only the
                                    new key (keep_old=0, the default) or both (keep_old=1).
                                    Answers {"kid": new, "kids": [served kids]}.
    POST /test/mint                 JSON {sub, scope (string or list), aud (string or list),
                                    exp_offset_s (3600), nbf_offset_s (0), iss_override,
                                    kid_override, sign_with_unknown_key (false), omit: [claim
                                    names], extra: {claims}} -> {"token": ...}, signed with the
                                    current key (or a throwaway key the JWKS never shows).
    GET /test/stats                 {"client_credentials_grants": N, "by_audience": {AUD: N}} (tokens
                                    issued by that grant, in all and per audience).

Usage: python oauth_as.py --port P [--audience URL] [--keys-dir DIR] [--issuer URL] [--sub NAME] [--cc-ttl S]

--port 0 picks a free port. The issuer defaults to http://127.0.0.1:P (no trailing slash; it is
compared as an exact string). With --keys-dir, the current private key (PEM), its kid and the
served JWKS are written there at start and after every rotation. Prints `READY <port>` on stdout
once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import pathlib
import secrets
import socket
import sys
import time
from typing import Any
from urllib.parse import parse_qs

import jwt
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mcp.server.auth.handlers.metadata import MetadataHandler
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import build_metadata, cors_middleware, create_auth_routes
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken

ACCESS_TOKEN_TTL = 3600
REFRESH_TOKEN_TTL = 24 * 3600
CODE_TTL = 300
METADATA_PATH = "/.well-known/oauth-authorization-server"

# The authorization request's login_hint, seen by the provider's `authorize`.
_login_hint: contextvars.ContextVar[str | None] = contextvars.ContextVar("login_hint", default=None)


class OAuthMetadataWithJwks(OAuthMetadata):
    """RFC 8414 metadata plus `jwks_uri` (§2), which the SDK's model lacks."""

    jwks_uri: AnyHttpUrl


class ApprovingClient(OAuthClientInformationFull):
    """A registered client that may ask for any scope: the SDK's default refuses scopes beyond
    those registered, which would break step-up authorization (SEP-2350) in tests."""

    def validate_scope(self, requested_scope: str | None) -> list[str] | None:
        return None if requested_scope is None else requested_scope.split()


class KeyRing:
    """RSA signing keys: the current one signs; the JWKS serves the published ones."""

    def __init__(self, keys_dir: pathlib.Path | None):
        self.keys_dir = keys_dir
        self.published: list[tuple[str, rsa.RSAPrivateKey]] = []
        self.rotate(keep_old=False)

    @staticmethod
    def _new() -> tuple[str, rsa.RSAPrivateKey]:
        return secrets.token_hex(8), rsa.generate_private_key(public_exponent=65537, key_size=2048)

    @property
    def current(self) -> tuple[str, rsa.RSAPrivateKey]:
        return self.published[-1]

    def rotate(self, keep_old: bool) -> str:
        key = self._new()
        self.published = [*self.published, key] if keep_old else [key]
        self._write()
        return key[0]

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid, private in self.published:
            jwk = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
            jwk.update({"kid": kid, "use": "sig", "alg": "RS256"})
            jwk.pop("key_ops", None)
            keys.append(jwk)
        return {"keys": keys}

    def _write(self) -> None:
        if self.keys_dir is None:
            return
        self.keys_dir.mkdir(parents=True, exist_ok=True)
        kid, private = self.current
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        (self.keys_dir / "current.pem").write_bytes(pem)
        (self.keys_dir / "current.kid").write_text(kid)
        (self.keys_dir / "jwks.json").write_text(json.dumps(self.jwks(), indent=2))


class TestProvider:
    """An in-memory `OAuthAuthorizationServerProvider` that approves every request."""

    def __init__(self, issuer: str, audience: str, default_sub: str, keys: KeyRing):
        self.issuer = issuer
        self.audience = audience
        self.default_sub = default_sub
        self.keys = keys
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.refresh_tokens: dict[str, RefreshToken] = {}
        self.revoked_jti: set[str] = set()
        self.client_credentials_grants = 0
        self.grants_by_audience = {}

    # -- tokens ---------------------------------------------------------------------------------

    def mint(
        self,
        *,
        sub: str,
        scopes: list[str],
        aud: str | list[str],
        client_id: str | None = None,
        exp_offset_s: int = ACCESS_TOKEN_TTL,
        nbf_offset_s: int = 0,
        iss_override: str | None = None,
        kid_override: str | None = None,
        sign_with_unknown_key: bool = False,
        omit: list[str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": iss_override if iss_override is not None else self.issuer,
            "sub": sub,
            "aud": aud,
            "iat": now,
            "nbf": now + nbf_offset_s,
            "exp": now + exp_offset_s,
            "scope": " ".join(scopes),
            "jti": secrets.token_hex(12),
        }
        if client_id is not None:
            claims["client_id"] = client_id
        claims.update(extra or {})
        for name in omit or []:
            claims.pop(name, None)
        kid, private = KeyRing._new() if sign_with_unknown_key else self.keys.current
        headers = {"kid": kid_override if kid_override is not None else kid, "typ": "at+jwt"}
        return jwt.encode(claims, private, algorithm="RS256", headers=headers)

    def _issue(self, client: OAuthClientInformationFull, scopes: list[str], resource: str | None, subject: str | None):
        sub = subject or self.default_sub
        access = self.mint(sub=sub, scopes=scopes, aud=resource or self.audience, client_id=client.client_id)
        refresh = secrets.token_urlsafe(32)
        self.refresh_tokens[refresh] = RefreshToken(
            token=refresh,
            client_id=client.client_id,
            scopes=scopes,
            expires_at=int(time.time()) + REFRESH_TOKEN_TTL,
            resource=resource,
            subject=sub,
        )
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=ACCESS_TOKEN_TTL,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )

    # -- OAuthAuthorizationServerProvider -------------------------------------------------------

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = ApprovingClient.model_validate(client_info.model_dump())

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(32)
        scopes = params.scopes if params.scopes is not None else (client.scope or "").split()
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=scopes,
            expires_at=time.time() + CODE_TTL,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject=_login_hint.get() or self.default_sub,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state, iss=self.issuer)

    async def load_authorization_code(self, client: OAuthClientInformationFull, authorization_code: str):
        code = self.codes.get(authorization_code)
        return code if code is not None and code.client_id == client.client_id else None

    async def exchange_authorization_code(self, client: OAuthClientInformationFull, authorization_code):
        if self.codes.pop(authorization_code.code, None) is None:
            raise TokenError(error="invalid_grant", error_description="authorization code already used")
        return self._issue(client, authorization_code.scopes, authorization_code.resource, authorization_code.subject)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str):
        token = self.refresh_tokens.get(refresh_token)
        return token if token is not None and token.client_id == client.client_id else None

    async def exchange_refresh_token(self, client: OAuthClientInformationFull, refresh_token, scopes: list[str]):
        self.refresh_tokens.pop(refresh_token.token, None)  # rotate
        return self._issue(client, scopes, refresh_token.resource, refresh_token.subject)

    async def load_access_token(self, token: str) -> AccessToken | None:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            private = dict(self.keys.published)[kid]
            claims = jwt.decode(
                token, private.public_key(), algorithms=["RS256"], issuer=self.issuer, options={"verify_aud": False}
            )
        except (jwt.PyJWTError, KeyError):
            return None
        if claims.get("jti") in self.revoked_jti:
            return None
        aud = claims.get("aud")
        return AccessToken(
            token=token,
            client_id=claims.get("client_id", ""),
            scopes=claims.get("scope", "").split(),
            expires_at=claims.get("exp"),
            resource=aud if isinstance(aud, str) else None,
            subject=claims.get("sub"),
            claims={"iss": claims.get("iss"), "jti": claims.get("jti")},
        )

    async def revoke_token(self, token) -> None:
        if isinstance(token, RefreshToken):
            self.refresh_tokens.pop(token.token, None)
        elif token.claims and token.claims.get("jti"):
            self.revoked_jti.add(token.claims["jti"])


class WithLoginHint:
    """ASGI wrapper: exposes the request's `login_hint` query parameter to the provider. (A
    class, not a function: Starlette would take a function for a request handler.)"""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        hint = parse_qs(scope.get("query_string", b"").decode()).get("login_hint", [None])[0]
        reset = _login_hint.set(hint)
        try:
            await self.app(scope, receive, send)
        finally:
            _login_hint.reset(reset)


def build_app(issuer: str, audience: str, default_sub: str, keys: KeyRing, cc_ttl: int = ACCESS_TOKEN_TTL) -> Starlette:
    provider = TestProvider(issuer, audience, default_sub, keys)
    registration = ClientRegistrationOptions(enabled=True)
    revocation = RevocationOptions(enabled=True)
    routes = create_auth_routes(
        provider,
        issuer_url=AnyHttpUrl(issuer),
        client_registration_options=registration,
        revocation_options=revocation,
    )

    # The SDK's metadata, re-validated from strings so the issuer keeps its exact form (a bare
    # `AnyHttpUrl` would gain a trailing slash), plus jwks_uri.
    base = issuer.rstrip("/")
    sdk_metadata = build_metadata(AnyHttpUrl(issuer), None, registration, revocation)
    fields = json.loads(sdk_metadata.model_dump_json(exclude_none=True))
    fields.update(
        {
            "issuer": issuer,
            "authorization_endpoint": f"{base}/authorize",
            "token_endpoint": f"{base}/token",
            "registration_endpoint": f"{base}/register",
            "revocation_endpoint": f"{base}/revoke",
            "jwks_uri": f"{base}/jwks",
            "authorization_response_iss_parameter_supported": True,
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        }
    )
    metadata = OAuthMetadataWithJwks.model_validate(fields)
    metadata_route = Route(
        METADATA_PATH,
        endpoint=cors_middleware(MetadataHandler(metadata).handle, ["GET", "OPTIONS"]),
        methods=["GET", "OPTIONS"],
    )
    routes = [metadata_route if r.path == METADATA_PATH else r for r in routes]
    token_route = next(r for r in routes if r.path == "/token")
    sdk_token = token_route.app  # an ASGI app (the SDK's handler behind its CORS middleware)

    async def client_credentials(request: Request, form) -> Response:
        client_id, secret = form.get("client_id"), form.get("client_secret")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            import base64
            from urllib.parse import unquote_plus

            try:
                raw_id, _, raw_secret = base64.b64decode(header[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raw_id, raw_secret = "", ""
            client_id, secret = unquote_plus(raw_id), unquote_plus(raw_secret)
        client = provider.clients.get(client_id or "")
        if client is None or not client.client_secret or not secrets.compare_digest(
                client.client_secret.encode(), (secret or "").encode()):
            return JSONResponse({"error": "invalid_client", "error_description": "client authentication failed"},
                                status_code=401, headers={"WWW-Authenticate": "Basic"})
        scopes = (form.get("scope") or "").split()
        resource = form.get("resource") or form.get("audience")
        access = provider.mint(sub=client.client_id, scopes=scopes, aud=resource or audience,
                               client_id=client.client_id, exp_offset_s=cc_ttl)
        provider.client_credentials_grants += 1
        key = resource or audience or ""
        provider.grants_by_audience[key] = provider.grants_by_audience.get(key, 0) + 1
        return JSONResponse({"access_token": access, "token_type": "Bearer",
                             "expires_in": cc_ttl, "scope": " ".join(scopes)},
                            headers={"Cache-Control": "no-store"})

    class Token:
        """`grant_type=client_credentials` here; every other grant goes to the SDK's handler with
        the request body replayed."""

        async def __call__(self, scope, receive, send):
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            fields = parse_qs(body.decode(errors="replace"))
            if scope["method"] == "POST" and fields.get("grant_type") == ["client_credentials"]:
                form = {k: v[0] for k, v in fields.items()}
                response = await client_credentials(Request(scope), form)
                await response(scope, receive, send)
                return
            sent = False

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await sdk_token(scope, replay, send)

    routes = [Route("/token", Token(), methods=token_route.methods) if r.path == "/token" else r for r in routes]
    routes = [Route(r.path, WithLoginHint(r.app), methods=r.methods) if r.path == "/authorize" else r for r in routes]

    async def jwks(_: Request) -> Response:
        return JSONResponse(keys.jwks(), headers={"Cache-Control": "no-store"})

    async def rotate(request: Request) -> Response:
        keep_old = request.query_params.get("keep_old", "0") in ("1", "true")
        kid = keys.rotate(keep_old=keep_old)
        return JSONResponse({"kid": kid, "kids": [k for k, _ in keys.published]})

    async def mint(request: Request) -> Response:
        try:
            body = await request.json()
            scope = body.get("scope", "")
            token = provider.mint(
                sub=body.get("sub", default_sub),
                scopes=scope.split() if isinstance(scope, str) else list(scope),
                aud=body.get("aud", audience),
                exp_offset_s=int(body.get("exp_offset_s", ACCESS_TOKEN_TTL)),
                nbf_offset_s=int(body.get("nbf_offset_s", 0)),
                iss_override=body.get("iss_override"),
                kid_override=body.get("kid_override"),
                sign_with_unknown_key=bool(body.get("sign_with_unknown_key", False)),
                omit=body.get("omit"),
                extra=body.get("extra"),
            )
        except (ValueError, TypeError, AttributeError) as e:
            return JSONResponse({"error": "invalid_request", "error_description": str(e)}, status_code=400)
        return JSONResponse({"token": token})

    async def stats(_: Request) -> Response:
        return JSONResponse({"client_credentials_grants": provider.client_credentials_grants,
                             "by_audience": provider.grants_by_audience})

    routes += [
        Route("/test/stats", stats, methods=["GET"]),
        Route("/jwks", jwks, methods=["GET"]),
        Route("/test/rotate", rotate, methods=["POST"]),
        Route("/test/mint", mint, methods=["POST"]),
    ]
    return Starlette(routes=routes)


async def serve(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    issuer = args.issuer or f"http://127.0.0.1:{port}"
    audience = args.audience or "http://127.0.0.1:8004/mcp"
    keys = KeyRing(pathlib.Path(args.keys_dir) if args.keys_dir else None)
    app = build_app(issuer, audience, args.sub, keys, args.cc_ttl)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            return
        await asyncio.sleep(0.02)
    print(f"READY {port}", flush=True)
    await task


def main() -> None:
    parser = argparse.ArgumentParser(description="Test-only OAuth 2.1 authorization server (auto-approving).")
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--audience", help="aud when a request names no resource (default http://127.0.0.1:8004/mcp)")
    parser.add_argument("--keys-dir", help="write the current private key, its kid and the JWKS here")
    parser.add_argument("--issuer", help="issuer identifier (default http://127.0.0.1:PORT)")
    parser.add_argument("--sub", default="test-user", help="subject of authorized users without login_hint")
    parser.add_argument("--cc-ttl", type=int, default=ACCESS_TOKEN_TTL, help="lifetime (s) of client credentials tokens")
    args = parser.parse_args()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
