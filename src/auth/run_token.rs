//! Run tokens: a short-lived assertion of the caller graph-os signs for each call to a child
//! whose entry sets `auth: {type: run-token, key: REF}`. The child learns who asked and with
//! which scope without ever seeing the caller's own credential (token passthrough is forbidden
//! by the MCP specification).
//!
//! Format: a JWT (RFC 7519) in JWS compact serialization, `alg: HS256`, `typ: graph-os-run+jwt`,
//! signed with the entry's key (HMAC-SHA256, key ≥ 32 bytes). Claims:
//! - `iss` `"graph-os"`, `aud` the server name, `sub` the caller's subject (`token:<digest>`,
//!   `oauth:<issuer digest>:<sub>`, `local`, …), `scope` (`discover` | `delegate` | `manage`);
//! - `method` (`tools/call`), `tool` (the child's own tool name), `args_sha256` (hex SHA-256 of
//!   the arguments' canonical JSON: sorted keys, no whitespace, non-ASCII escaped as `\uXXXX`);
//! - `iat`, `exp` (`iat` + the entry's `ttl`, default 60 s), `jti` (128 random bits, unique).
//!
//! Where it travels: `_meta["io.graph-os/run-token"]` of the `tools/call` request (every child),
//! and the `Graph-Os-Run-Token` header (HTTP children).
//!
//! Verification contract for a child: check the HS256 signature with the shared key (reject any
//! other `alg`), `iss == "graph-os"`, `aud` == its own server name, `exp` in the future (allow a
//! few seconds of skew), `method` and `tool` equal the request's, `args_sha256` equals the digest
//! of the received arguments, and (to refuse replays) that `jti` was not seen before `exp`.
//! Written here rather than with `jsonwebtoken`: graph-os's `jsonwebtoken` build carries only a
//! verifying crypto provider, and HS256 signing is one HMAC over two base64url strings.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;

use super::Identity;

/// `_meta` key of the run token in a `tools/call` request.
pub const META_KEY: &str = "io.graph-os/run-token";

/// HTTP header carrying the run token to an HTTP child.
pub const HEADER: &str = "graph-os-run-token";

/// Shortest accepted key, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// What one run token asserts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Claims {
    /// Always `graph-os`.
    pub iss: &'static str,
    /// The server name.
    pub aud: String,
    /// The caller's subject.
    pub sub: String,
    /// The caller's scope.
    pub scope: &'static str,
    /// The JSON-RPC method.
    pub method: &'static str,
    /// The child's own tool name.
    pub tool: String,
    /// Hex SHA-256 of the arguments' canonical JSON.
    pub args_sha256: String,
    /// Issued at (Unix seconds).
    pub iat: u64,
    /// Expires at (Unix seconds).
    pub exp: u64,
    /// Unique id.
    pub jti: String,
}

impl Claims {
    /// The claims of a `tools/call` of `tool` with `arguments` on `server` by `caller`.
    pub fn for_call(
        caller: &Identity,
        server: &str,
        tool: &str,
        arguments: &serde_json::Value,
        ttl: std::time::Duration,
    ) -> Self {
        let iat = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut jti = [0u8; 16];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut jti);
        Claims {
            iss: "graph-os",
            aud: server.to_string(),
            sub: caller.subject.clone(),
            scope: caller.scope.as_str(),
            method: "tools/call",
            tool: tool.to_string(),
            args_sha256: crate::digest::sha256_hex(
                crate::digest::canonical_json(arguments).as_bytes(),
            ),
            iat,
            exp: iat + ttl.as_secs().max(1),
            jti: hex::encode(jti),
        }
    }
}

/// Signs `claims` with `key` (HS256).
pub fn sign(key: &[u8], claims: &Claims) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"graph-os-run+jwt"}"#);
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap_or_default());
    let input = format!("{header}.{payload}");
    let tag = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        input.as_bytes(),
    );
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Scope;

    #[test]
    fn a_run_token_is_an_hs256_jwt_over_the_claims_that_any_jwt_library_verifies() {
        let key = b"0123456789abcdef0123456789abcdef";
        let who = Identity {
            subject: "token:abc".into(),
            scope: Scope::Delegate,
            kind: crate::auth::CredentialKind::StaticToken,
        };
        let args = serde_json::json!({"b": 2, "a": "é"});
        let claims = Claims::for_call(
            &who,
            "rt",
            "whoami",
            &args,
            std::time::Duration::from_secs(60),
        );
        let token = sign(key, &claims);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let payload: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(payload["sub"], "token:abc");
        assert_eq!(payload["scope"], "delegate");
        assert_eq!(payload["aud"], "rt");
        assert_eq!(payload["exp"].as_u64().unwrap(), claims.iat + 60);
        // The arguments digest is over the canonical JSON (sorted keys, ASCII escapes).
        assert_eq!(
            payload["args_sha256"],
            crate::digest::sha256_hex(br#"{"a":"\u00e9","b":2}"#)
        );
        let expected = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
            format!("{}.{}", parts[0], parts[1]).as_bytes(),
        );
        assert_eq!(URL_SAFE_NO_PAD.decode(parts[2]).unwrap(), expected.as_ref());
        // Two tokens for the same call differ (jti).
        let again = Claims::for_call(
            &who,
            "rt",
            "whoami",
            &args,
            std::time::Duration::from_secs(60),
        );
        assert_ne!(claims.jti, again.jti);
    }
}
