"""Smoke test of the test-only OAuth authorization server (tests/peers/oauth_as.py) on its own:
metadata, dynamic registration, authorization code + PKCE, RS256 JWTs, refresh, rotation, mint."""
import base64
import hashlib
import secrets
from urllib.parse import parse_qs, urlencode, urlparse

import httpx2
import jwt
import pytest


RESOURCE = "http://127.0.0.1:8004/mcp"
REDIRECT = "http://127.0.0.1:1/callback"


def verify(http, metadata, token, audience):
    kid = jwt.get_unverified_header(token)["kid"]
    jwks = http.get(metadata["jwks_uri"]).json()
    key = jwt.PyJWK(next(k for k in jwks["keys"] if k["kid"] == kid)).key
    return jwt.decode(token, key, algorithms=["RS256"], audience=audience, issuer=metadata["issuer"])


def authorize(http, metadata, client_id, verifier, **extra):
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    state = secrets.token_urlsafe(16)
    query = {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT, "state": state,
             "code_challenge": challenge, "code_challenge_method": "S256", **extra}
    response = http.get(f"{metadata['authorization_endpoint']}?{urlencode(query)}")
    assert response.status_code == 302, response.text
    params = parse_qs(urlparse(response.headers["location"]).query)
    assert params["state"] == [state] and params["iss"] == [metadata["issuer"]]
    return params["code"][0]


def test_code_flow_with_pkce_issues_rs256_jwts_bound_to_the_resource(oauth_as, tmp_path):
    with httpx2.Client(follow_redirects=False) as http:
        metadata = http.get(f"{oauth_as}/.well-known/oauth-authorization-server").json()
        assert metadata["issuer"] == oauth_as  # exact, no trailing slash
        assert metadata["jwks_uri"] == f"{oauth_as}/jwks"
        assert metadata["code_challenge_methods_supported"] == ["S256"]
        registered = http.post(metadata["registration_endpoint"], json={
            "redirect_uris": [REDIRECT], "scope": "discover", "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"]})
        assert registered.status_code == 201, registered.text
        client_id = registered.json()["client_id"]

        verifier = secrets.token_urlsafe(48)
        code = authorize(http, metadata, client_id, verifier, scope="discover delegate", resource=RESOURCE,
                         login_hint="carol")
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": client_id,
                "code_verifier": verifier, "resource": RESOURCE}
        tokens = http.post(metadata["token_endpoint"], data=form).json()
        assert tokens["token_type"] == "Bearer" and tokens["expires_in"] == 3600
        assert jwt.get_unverified_header(tokens["access_token"])["alg"] == "RS256"
        claims = verify(http, metadata, tokens["access_token"], RESOURCE)
        assert (claims["sub"], claims["scope"], claims["aud"]) == ("carol", "discover delegate", RESOURCE)
        assert claims["exp"] - claims["iat"] == 3600 and claims["nbf"] <= claims["iat"]
        # A code is good once.
        assert http.post(metadata["token_endpoint"], data=form).json()["error"] == "invalid_grant"

        # The refresh token rotates and keeps subject and resource.
        refresh = {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"], "client_id": client_id}
        refreshed = http.post(metadata["token_endpoint"], data=refresh).json()
        assert verify(http, metadata, refreshed["access_token"], RESOURCE)["sub"] == "carol"
        assert http.post(metadata["token_endpoint"], data=refresh).status_code == 400

        # Without a resource indicator the audience is --audience; a wrong verifier is refused.
        code = authorize(http, metadata, client_id, verifier, scope="manage")
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": client_id}
        bad = http.post(metadata["token_endpoint"], data={**form, "code_verifier": "x" * 50})
        assert bad.json()["error"] == "invalid_grant"
        code = authorize(http, metadata, client_id, verifier, scope="manage")
        tokens = http.post(metadata["token_endpoint"], data={**form, "code": code, "code_verifier": verifier}).json()
        claims = verify(http, metadata, tokens["access_token"], "http://127.0.0.1:9/default")
        assert (claims["sub"], claims["scope"]) == ("test-user", "manage")


def test_rotation_and_minting_for_negative_cases(oauth_as, tmp_path):
    with httpx2.Client() as http:
        metadata = http.get(f"{oauth_as}/.well-known/oauth-authorization-server").json()
        first = http.get(metadata["jwks_uri"]).json()["keys"]
        assert [k["kty"] for k in first] == ["RSA"] and first[0]["alg"] == "RS256"
        assert (tmp_path / "keys" / "current.kid").read_text() == first[0]["kid"]

        both = http.post(f"{oauth_as}/test/rotate?keep_old=1").json()
        assert both["kids"] == [first[0]["kid"], both["kid"]]
        only = http.post(f"{oauth_as}/test/rotate?keep_old=0").json()
        assert only["kids"] == [only["kid"]]
        assert [k["kid"] for k in http.get(metadata["jwks_uri"]).json()["keys"]] == [only["kid"]]

        def mint(**body):
            return http.post(f"{oauth_as}/test/mint", json=body).json()["token"]

        claims = verify(http, metadata, mint(sub="bob", scope=["discover", "manage"], aud=RESOURCE), RESOURCE)
        assert (claims["sub"], claims["scope"]) == ("bob", "discover manage")
        with pytest.raises(jwt.ExpiredSignatureError):
            verify(http, metadata, mint(aud=RESOURCE, exp_offset_s=-600), RESOURCE)
        with pytest.raises(jwt.ImmatureSignatureError):
            verify(http, metadata, mint(aud=RESOURCE, nbf_offset_s=600), RESOURCE)
        with pytest.raises(jwt.InvalidAudienceError):
            verify(http, metadata, mint(aud="http://elsewhere/mcp"), RESOURCE)
        with pytest.raises(jwt.InvalidIssuerError):
            verify(http, metadata, mint(aud=RESOURCE, iss_override="https://evil.example"), RESOURCE)
        served = {k["kid"] for k in http.get(metadata["jwks_uri"]).json()["keys"]}
        assert jwt.get_unverified_header(mint(sign_with_unknown_key=True))["kid"] not in served
        assert jwt.get_unverified_header(mint(kid_override="nope"))["kid"] == "nope"
        assert "jti" not in jwt.decode(mint(omit=["jti"]), options={"verify_signature": False})
