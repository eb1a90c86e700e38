//! OAuth 2.1 client credentials toward a remote child: graph-os is the OAuth client, the child
//! the resource server. The access token is fetched from the configured token endpoint through
//! the egress policy, cached until shortly before it expires, and sent as `Authorization:
//! Bearer` on every request to the child. Any failure fails the child closed with
//! `child-auth-failed` (never a request without the token).
//!
//! Written here rather than with rmcp's `auth` feature: rmcp's `AuthClient` drives the
//! interactive authorization-code flow (and pulls the `oauth2` crate); the client credentials
//! grant is one form POST, and it must go through graph-os's own egress client.

use std::time::{Duration, Instant};

use crate::config::{ClientCredentials, TokenEndpointAuth};

/// Stable code of an authentication failure toward a child.
pub const AUTH_FAILED: &str = "child-auth-failed";

/// Largest token endpoint answer read.
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;

/// A token is refreshed this long before it expires.
const REFRESH_MARGIN: Duration = Duration::from_secs(30);

/// Lifetime assumed when the endpoint gives no `expires_in`.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

/// Why no token could be obtained (never contains the secret or a token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("client credentials grant at {endpoint} failed: {reason}")]
pub struct AuthFailure {
    /// The token endpoint's origin.
    pub endpoint: String,
    /// What went wrong (status and the endpoint's `error` code, or the transport failure).
    pub reason: String,
}

/// Access tokens of one child's client credentials grant.
pub struct TokenSource {
    grant: ClientCredentials,
    token_url: url::Url,
    /// The authorization server's issuer identifier, when discovered (a `private_key_jwt`
    /// assertion's audience; else the token endpoint).
    issuer: Option<url::Url>,
    secret: String,
    client: reqwest::Client,
    cached: tokio::sync::Mutex<Option<(String, Instant)>>,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("token_url", &self.token_url.as_str())
            .field("client_id", &self.grant.client_id)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    /// A source for `grant` (token endpoint `token_url`) whose secret resolved to `secret`;
    /// requests go through `client` (an egress-policy client).
    pub fn new(
        grant: ClientCredentials,
        endpoint: TokenEndpoint,
        secret: String,
        client: reqwest::Client,
    ) -> Self {
        TokenSource {
            grant,
            token_url: endpoint.token_url,
            issuer: endpoint.issuer,
            secret,
            client,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    fn failure(&self, reason: impl Into<String>) -> AuthFailure {
        AuthFailure {
            endpoint: self.token_url.origin().ascii_serialization(),
            reason: reason.into(),
        }
    }

    /// A valid access token: the cached one, or a new one from the token endpoint.
    pub async fn token(&self) -> Result<String, AuthFailure> {
        let mut cached = self.cached.lock().await;
        if let Some((token, expires)) = cached.as_ref()
            && Instant::now() + REFRESH_MARGIN < *expires
        {
            return Ok(token.clone());
        }
        let (token, lifetime) = self.fetch().await?;
        *cached = Some((token.clone(), Instant::now() + lifetime));
        Ok(token)
    }

    /// Forgets the cached token (the child refused it): the next request fetches a new one.
    pub async fn invalidate(&self) {
        *self.cached.lock().await = None;
    }

    async fn fetch(&self) -> Result<(String, Duration), AuthFailure> {
        let g = &self.grant;
        let mut form: Vec<(&str, &str)> = vec![("grant_type", "client_credentials")];
        if let Some(scope) = &g.scope {
            form.push(("scope", scope));
        }
        if let Some(audience) = &g.audience {
            form.push(("resource", audience));
            form.push(("audience", audience));
        }
        let mut request = self
            .client
            .post(self.token_url.clone())
            .header(http::header::ACCEPT, "application/json")
            .timeout(Duration::from_secs(30));
        let assertion;
        match g.method {
            TokenEndpointAuth::ClientSecretBasic => {
                // RFC 6749 §2.3.1: id and secret are form-encoded before Basic encoding.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                request = request.basic_auth(enc(&g.client_id), Some(enc(&self.secret)));
            }
            TokenEndpointAuth::ClientSecretPost => {
                form.push(("client_id", &g.client_id));
                form.push(("client_secret", &self.secret));
            }
            TokenEndpointAuth::PrivateKeyJwt => {
                let audience = self.issuer.as_ref().unwrap_or(&self.token_url);
                assertion = client_assertion(
                    &self.secret,
                    &g.client_id,
                    audience.as_str(),
                    g.key_id.as_deref(),
                )
                .map_err(|e| self.failure(e))?;
                form.push(("client_id", &g.client_id));
                form.push(("client_assertion_type", JWT_BEARER));
                form.push(("client_assertion", &assertion));
            }
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let response = request
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| self.failure(format!("request failed: {}", error_chain(&e))))?;
        let status = response.status();
        let body = read_bounded(response).await.map_err(|e| self.failure(e))?;
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if !status.is_success() {
            let code = json
                .get("error")
                .and_then(|e| e.as_str())
                .filter(|e| e.len() <= 64 && e.bytes().all(|b| b.is_ascii_graphic()))
                .unwrap_or("no error code");
            return Err(self.failure(format!("HTTP {}: {code}", status.as_u16())));
        }
        let token = json
            .get("access_token")
            .and_then(|t| t.as_str())
            .filter(|t| {
                !t.is_empty() && t.len() <= 16 * 1024 && t.bytes().all(|b| b.is_ascii_graphic())
            })
            .ok_or_else(|| self.failure("the answer has no usable access_token"))?;
        if let Some(kind) = json.get("token_type").and_then(|t| t.as_str())
            && !kind.eq_ignore_ascii_case("bearer")
        {
            return Err(self.failure(format!("token_type {kind:?} is not Bearer")));
        }
        let lifetime = json
            .get("expires_in")
            .and_then(|e| e.as_u64())
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_LIFETIME);
        tracing::debug!(endpoint = %self.token_url.origin().ascii_serialization(), lifetime_s = lifetime.as_secs(), "client credentials token obtained");
        Ok((token.to_string(), lifetime))
    }
}

/// The token endpoint of the authorization server protecting `resource`: its RFC 9728
/// protected-resource metadata (path-suffixed, then root well-known URL) names the authorization
/// server, whose RFC 8414 metadata (then OpenID discovery) names the token endpoint.
/// An authorization server's token endpoint, and its issuer identifier when discovered.
#[derive(Debug, Clone)]
pub struct TokenEndpoint {
    /// Where the grant is posted.
    pub token_url: url::Url,
    /// The issuer (RFC 8414 `issuer`, else the metadata's URL), when discovered.
    pub issuer: Option<url::Url>,
}

/// `client_assertion_type` of a JWT client assertion (RFC 7523 §2.2).
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// A `private_key_jwt` client assertion (RFC 7523 §3): ES256 over `{iss, sub: client_id, aud,
/// iat, exp: +60 s, jti}`, signed with the PKCS#8 PEM P-256 key `pem`. Signed with ring here
/// (already the project's signer) rather than pulling a JOSE crate for one compact JWS.
pub fn client_assertion(
    pem: &str,
    client_id: &str,
    audience: &str,
    key_id: Option<&str>,
) -> Result<String, String> {
    use base64::Engine as _;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let body: String = pem
        .lines()
        .filter(|l| !l.trim_start().starts_with("-----"))
        .map(str::trim)
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| "the private key is not a PEM document".to_string())?;
    let rng = ring::rand::SystemRandom::new();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
        .map_err(|_| "the private key is not a PKCS#8 P-256 (ES256) key".to_string())?;
    let mut header = serde_json::json!({"alg": "ES256", "typ": "JWT"});
    if let Some(kid) = key_id {
        header["kid"] = kid.into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let mut jti = [0u8; 16];
    ring::rand::SecureRandom::fill(&rng, &mut jti).map_err(|_| "no randomness".to_string())?;
    let claims = serde_json::json!({
        "iss": client_id, "sub": client_id, "aud": audience,
        "iat": now, "exp": now + 60, "jti": hex::encode(jti),
    });
    let signing_input = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string())
    );
    let signature = key
        .sign(&rng, signing_input.as_bytes())
        .map_err(|_| "signing failed".to_string())?;
    Ok(format!(
        "{signing_input}.{}",
        b64.encode(signature.as_ref())
    ))
}

/// Discovers the token endpoint of the authorization server protecting `resource` (RFC 9728
/// protected-resource metadata, then RFC 8414 or OpenID metadata).
pub async fn discover_token_url(
    client: &reqwest::Client,
    resource: &url::Url,
) -> Result<TokenEndpoint, AuthFailure> {
    let fail = |reason: String| AuthFailure {
        endpoint: resource.origin().ascii_serialization(),
        reason,
    };
    let well_known = |base: &url::Url, name: &str| -> Vec<url::Url> {
        let path = base.path().trim_end_matches('/');
        let mut out = Vec::new();
        for p in [
            format!("/.well-known/{name}{path}"),
            format!("/.well-known/{name}"),
        ] {
            let mut u = base.clone();
            u.set_path(&p);
            u.set_query(None);
            u.set_fragment(None);
            if !out.contains(&u) {
                out.push(u);
            }
        }
        out
    };
    let get = |u: url::Url| async move {
        let response = client
            .get(u)
            .header(http::header::ACCEPT, "application/json")
            .timeout(Duration::from_secs(15))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body = read_bounded(response).await.ok()?;
        serde_json::from_slice::<serde_json::Value>(&body).ok()
    };
    let mut issuer = None;
    for u in well_known(resource, "oauth-protected-resource") {
        if let Some(doc) = get(u).await
            && let Some(s) = doc
                .pointer("/authorization_servers/0")
                .and_then(|s| s.as_str())
        {
            issuer = url::Url::parse(s).ok();
            break;
        }
    }
    let issuer = issuer.ok_or_else(|| {
        fail("no protected-resource metadata names an authorization server".into())
    })?;
    let mut candidates = well_known(&issuer, "oauth-authorization-server");
    candidates.extend(well_known(&issuer, "openid-configuration"));
    for u in candidates {
        if let Some(doc) = get(u).await
            && let Some(t) = doc.get("token_endpoint").and_then(|t| t.as_str())
        {
            let token_url = url::Url::parse(t)
                .ok()
                .filter(|u| matches!(u.scheme(), "https" | "http"))
                .ok_or_else(|| fail("the token_endpoint is not an http(s) URL".into()))?;
            let named = doc
                .get("issuer")
                .and_then(|i| i.as_str())
                .and_then(|i| url::Url::parse(i).ok());
            return Ok(TokenEndpoint {
                token_url,
                issuer: Some(named.unwrap_or_else(|| issuer.clone())),
            });
        }
    }
    Err(fail(format!(
        "the authorization server {} publishes no token_endpoint",
        issuer.origin().ascii_serialization()
    )))
}

async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading the answer failed: {}", error_chain(&e)))?
    {
        if body.len() + chunk.len() > MAX_TOKEN_RESPONSE {
            return Err(format!(
                "the answer is larger than {MAX_TOKEN_RESPONSE} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use ring::signature::{ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, KeyPair};

    use super::*;

    #[test]
    fn a_private_key_jwt_assertion_verifies_with_the_clients_public_key() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 =
            ring::signature::EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref());
        let pem = format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n");
        let jwt = client_assertion(&pem, "graph-os", "https://as.example/", Some("k1")).unwrap();

        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let json = |p: &str| -> serde_json::Value {
            serde_json::from_slice(&url.decode(p).unwrap()).unwrap()
        };
        assert_eq!(
            json(parts[0]),
            serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": "k1"})
        );
        let claims = json(parts[1]);
        assert_eq!(claims["iss"], "graph-os");
        assert_eq!(claims["sub"], "graph-os");
        assert_eq!(claims["aud"], "https://as.example/");
        assert_eq!(
            claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
            60
        );
        assert_eq!(claims["jti"].as_str().unwrap().len(), 32);

        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        let public = ring::signature::UnparsedPublicKey::new(
            &ECDSA_P256_SHA256_FIXED,
            key.public_key().as_ref(),
        );
        let signed = format!("{}.{}", parts[0], parts[1]);
        assert!(
            public
                .verify(signed.as_bytes(), &url.decode(parts[2]).unwrap())
                .is_ok()
        );
    }

    #[test]
    fn a_key_that_is_not_pkcs8_p256_is_refused_without_echoing_it() {
        let e = client_assertion(
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWNhbmFyeQ==\n-----END PRIVATE KEY-----",
            "c",
            "a",
            None,
        )
        .unwrap_err();
        assert!(e.contains("PKCS#8 P-256"), "{e}");
        assert!(
            !e.contains("secret-canary") && !e.contains("c2VjcmV0"),
            "{e}"
        );
        assert!(client_assertion("not pem at all !!", "c", "a", None).is_err());
    }
}
