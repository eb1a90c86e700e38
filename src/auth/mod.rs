//! Credentials and scopes: who a caller is and what it may do.
//!
//! stdio is the trusted local user (every scope). HTTP callers present a bearer token, which is
//! either a configured static token (a secret reference resolved at startup, compared by SHA-256
//! digest in constant time) or an OAuth 2.1 JWT access token validated by [`oauth`]. Scopes are
//! ordered: `discover` ⊂ `delegate` ⊂ `manage`. A credential is never logged; an [`Identity`]
//! carries only a digest or the token subject.

pub mod oauth;
pub mod run_token;
pub mod scope;

pub use scope::Scope;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::secrets::SecretValue;

/// Where an identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    /// The local user on stdio.
    Local,
    /// A configured static bearer token.
    StaticToken,
    /// An OAuth 2.1 JWT access token.
    OAuth,
    /// No credential: anonymous access explicitly granted (`--anonymous-scope`), or no
    /// credential source configured at all (local development).
    Anonymous,
}

/// An authenticated (or explicitly anonymous) caller. Never holds a secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// Stable subject: `local`, `token:<digest>`, `oauth:<issuer digest>:<sub>`, `anonymous`
    /// (or `addr:<ip>` / `handle:<name>` when no credential source is configured).
    pub subject: String,
    /// The broadest scope granted.
    pub scope: Scope,
    /// How it was established.
    pub kind: CredentialKind,
}

impl Identity {
    /// The trusted local user (stdio).
    pub fn local() -> Self {
        Identity {
            subject: "local".into(),
            scope: Scope::Manage,
            kind: CredentialKind::Local,
        }
    }

    /// An anonymous caller with `scope`, keyed by `subject`.
    pub fn anonymous(subject: impl Into<String>, scope: Scope) -> Self {
        Identity {
            subject: subject.into(),
            scope,
            kind: CredentialKind::Anonymous,
        }
    }
}

/// Configured bearer tokens.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], Scope)>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Parses `SCOPE=REFERENCE` specs (e.g. `manage=env://ADMIN_TOKEN`) and resolves them now.
    pub fn from_specs(
        specs: &[String],
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let mut entries = Vec::new();
        for spec in specs {
            // Never echo the input: a mistyped flag may hold a literal token.
            let (scope, reference) = spec.split_once('=').ok_or_else(|| {
                "--token expects SCOPE=REFERENCE (e.g. manage=env://ADMIN_TOKEN); the value given has no '='"
                    .to_string()
            })?;
            // The part before '=' may be a token typed in the wrong place: never echo it either.
            let scope: Scope = scope.parse().map_err(|_| {
                "--token expects SCOPE=REFERENCE with SCOPE one of discover, delegate, manage"
                    .to_string()
            })?;
            let value = SecretValue::parse(reference).map_err(|e| e.to_string())?;
            if !value.is_reference() {
                return Err("--token values must be references (env://NAME or ${NAME}), never literal tokens".into());
            }
            let token = value.resolve(lookup).map_err(|e| e.to_string())?;
            if token.len() < 16 {
                return Err(format!("the {scope:?} token is shorter than 16 characters"));
            }
            entries.push((digest(&token), scope));
        }
        Ok(Tokens { entries })
    }

    /// Whether any token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The scope a presented bearer token grants.
    pub fn scope_of(&self, presented: &str) -> Option<Scope> {
        self.scope_of_digest(&digest(presented))
    }

    fn scope_of_digest(&self, d: &[u8; 32]) -> Option<Scope> {
        // Compare every entry so timing does not reveal which one matched.
        let mut found = None;
        for (known, scope) in &self.entries {
            let equal = known
                .iter()
                .zip(d.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
            if equal {
                found = Some(found.map_or(*scope, |s: Scope| s.max(*scope)));
            }
        }
        found
    }

    /// The scope of an HTTP request's `Authorization` header (`None` = no or unknown token).
    pub fn scope_of_header(&self, header: Option<&str>) -> Option<Scope> {
        bearer(header).and_then(|t| self.scope_of(t))
    }

    /// The identity of a presented static token (`None` = not a configured token).
    pub fn identify(&self, presented: &str) -> Option<Identity> {
        // One digest: it both finds the token and names its subject.
        let d = digest(presented);
        self.scope_of_digest(&d).map(|scope| Identity {
            subject: format!("token:{}", hex::encode(&d[..8])),
            scope,
            kind: CredentialKind::StaticToken,
        })
    }
}

/// The token of an `Authorization: Bearer …` header (scheme case-insensitive, RFC 6750).
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Why an HTTP request's credential was refused; carries the response the HTTP layer sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthFailure {
    /// 401 (no or bad credential), 403 (insufficient scope) or 503 (issuer unavailable).
    pub status: u16,
    /// Stable code (`authentication-required`, `token-unknown`, `token-expired`, …).
    pub code: &'static str,
    /// The `WWW-Authenticate` challenge.
    pub challenge: String,
}

/// Every credential source of the HTTP front, and the anonymous policy.
///
/// - A bearer token is a configured static token, else (with OAuth configured) a JWT validated
///   against the issuer; else it is refused 401 — never treated as anonymous.
/// - Without a credential: 401, unless `anonymous` grants a scope explicitly.
/// - With no credential source at all (local development) every caller is anonymous with the
///   `anonymous` scope (default delegate), keyed by its `Mcp-Principal` header or client address.
#[derive(Default)]
pub struct Credentials {
    /// Static bearer tokens.
    pub tokens: Tokens,
    /// OAuth 2.1 JWT validation.
    pub oauth: Option<oauth::OAuthValidator>,
    /// Scope granted to requests without a credential (`None`: refused when any source is configured).
    pub anonymous: Option<Scope>,
}

impl Credentials {
    /// Whether any credential source is configured.
    pub fn configured(&self) -> bool {
        !self.tokens.is_empty() || self.oauth.is_some()
    }

    fn challenge(&self, error: Option<&oauth::OAuthError>) -> String {
        match &self.oauth {
            Some(v) => v.www_authenticate(error, None),
            None if error.is_some() => {
                "Bearer realm=\"graph-os\", error=\"invalid_token\"".to_string()
            }
            None => "Bearer realm=\"graph-os\"".to_string(),
        }
    }

    /// The identity of a request with this `Authorization` header. `dev_subject` keys anonymous
    /// callers when no credential source is configured (the `Mcp-Principal` header or the
    /// client address).
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        dev_subject: impl FnOnce() -> String,
    ) -> Result<Identity, AuthFailure> {
        let token = bearer(authorization);
        if !self.configured() {
            let subject = match token {
                // An unverifiable bearer still separates loaded sets (never its value).
                Some(t) => format!("bearer:{}", &hex::encode(digest(t))[..16]),
                None => dev_subject(),
            };
            return Ok(Identity::anonymous(
                subject,
                self.anonymous.unwrap_or(Scope::Delegate),
            ));
        }
        let Some(token) = token else {
            return match self.anonymous {
                Some(scope) => Ok(Identity::anonymous("anonymous", scope)),
                None => Err(AuthFailure {
                    status: 401,
                    code: "authentication-required",
                    challenge: self.challenge(None),
                }),
            };
        };
        if token.len() > 16 * 1024 {
            return Err(AuthFailure {
                status: 401,
                code: "token-malformed",
                challenge: self.challenge(Some(&oauth::OAuthError::Malformed("too long"))),
            });
        }
        if let Some(identity) = self.tokens.identify(token) {
            return Ok(identity);
        }
        match &self.oauth {
            None => Err(AuthFailure {
                status: 401,
                code: "token-unknown",
                challenge: self.challenge(Some(&oauth::OAuthError::SignatureInvalid)),
            }),
            Some(v) => v.validate(token).await.map_err(|e| AuthFailure {
                status: e.http_status(),
                code: e.code(),
                challenge: v.www_authenticate(
                    Some(&e),
                    e.is_insufficient_scope().then_some(Scope::Discover),
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_resolve_from_references_and_map_to_scopes() {
        let env = |k: &str| match k {
            "ADMIN" => Some("admin-token-0123456789".to_string()),
            "READ" => Some("read-token-0123456789".to_string()),
            _ => None,
        };
        let t = Tokens::from_specs(
            &["manage=env://ADMIN".into(), "discover=${READ}".into()],
            &env,
        )
        .unwrap();
        assert_eq!(t.scope_of("admin-token-0123456789"), Some(Scope::Manage));
        assert_eq!(
            t.scope_of_header(Some("Bearer read-token-0123456789")),
            Some(Scope::Discover)
        );
        assert_eq!(t.scope_of("nope"), None);
        assert!(Tokens::from_specs(&["manage=literal-token-123456".into()], &env).is_err());
        assert!(Tokens::from_specs(&["root=env://ADMIN".into()], &env).is_err());
        assert!(Tokens::from_specs(&["manage=env://MISSING".into()], &env).is_err());
    }
}
