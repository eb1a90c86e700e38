//! Secret references and their resolution at the child boundary.
//!
//! Values in a fleet file are either literals or references: `env://NAME`, `${NAME}` /
//! `${env:NAME}` templates (possibly inside a longer string such as `Bearer ${TOKEN}`),
//! `vault://…` and `secret://…`. References are resolved only when a child is started; a missing
//! one fails that child closed with [`SecretError::Unavailable`] (code `secret-unavailable`),
//! never an empty string. Resolved material lives only in the child's launch parameters.

use std::fmt;

pub mod refs;
pub mod vault;

/// Names of credential-looking keys (env vars, headers) that must never hold literals.
const SENSITIVE_TOKENS: &[&str] = &[
    "AUTHORIZATION",
    "COOKIE",
    "CREDENTIAL",
    "CREDENTIALS",
    "PASSWORD",
    "PASSWD",
    "SECRET",
    "TOKEN",
    "APIKEY",
];
const SENSITIVE_PAIRS: &[(&str, &str)] = &[
    ("API", "KEY"),
    ("HMAC", "KEY"),
    ("PRIVATE", "KEY"),
    ("ACCESS", "KEY"),
];

/// True when an env or header name looks like it carries a credential.
pub fn is_sensitive_name(name: &str) -> bool {
    let norm = name.to_ascii_uppercase().replace('-', "_");
    let parts: Vec<&str> = norm.split('_').filter(|p| !p.is_empty()).collect();
    parts.iter().any(|p| SENSITIVE_TOKENS.contains(p))
        || parts
            .windows(2)
            .any(|w| SENSITIVE_PAIRS.contains(&(w[0], w[1])))
}

/// One piece of a parsed value.
#[derive(Clone, PartialEq, Eq)]
pub enum Part {
    /// Literal text.
    Text(String),
    /// `${NAME}` / `${env:NAME}`: the gateway's environment variable NAME.
    Var(String),
    /// `env://NAME`: an alias resolved from the gateway's environment.
    EnvRef(String),
    /// `vault://path` or `secret://namespace/name#key`: resolved by a secret backend.
    External(String),
}

/// A configured value: literal text, a reference, or a template mixing both.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue {
    parts: Vec<Part>,
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print literal material: a literal may be a mistyped credential.
        if self.is_reference() {
            write!(f, "SecretValue(ref)")
        } else {
            write!(f, "SecretValue(literal)")
        }
    }
}

/// Why a value could not be parsed or resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The reference syntax is invalid.
    #[error("invalid reference: {0}")]
    Invalid(String),
    /// The referenced secret is not available (missing variable, no backend).
    #[error("secret reference {reference} is unavailable")]
    Unavailable {
        /// The reference (never the value).
        reference: String,
    },
    /// The resolved value contains NUL, CR or LF.
    #[error("secret reference {reference} resolved to a value with NUL, CR or LF")]
    BadValue {
        /// The reference (never the value).
        reference: String,
    },
}

impl SecretError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            SecretError::Invalid(_) => "secret-reference-invalid",
            SecretError::Unavailable { .. } | SecretError::BadValue { .. } => "secret-unavailable",
        }
    }
}

fn valid_alias(name: &str) -> bool {
    let mut b = name.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_uppercase())
        && name.len() <= 128
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

fn valid_var(name: &str) -> bool {
    let mut b = name.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

fn valid_external(path: &str) -> bool {
    let mut b = path.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphanumeric())
        && path.len() <= 512
        && !path.contains("..")
        && b.all(|c| c.is_ascii_alphanumeric() || b"_./#-".contains(&c))
}

impl SecretValue {
    /// Parses a configured string.
    pub fn parse(raw: &str) -> Result<Self, SecretError> {
        let lower = raw.to_ascii_lowercase();
        for scheme in ["env://", "vault://", "secret://"] {
            if lower.starts_with(scheme) {
                let rest = &raw[scheme.len()..];
                if scheme == "env://" {
                    if !raw.starts_with("env://") || !valid_alias(rest) {
                        return Err(SecretError::Invalid(
                            "env:// takes an alias matching [A-Z][A-Z0-9_]{0,127}".into(),
                        ));
                    }
                    return Ok(SecretValue {
                        parts: vec![Part::EnvRef(rest.into())],
                    });
                }
                if !raw.starts_with(scheme) || !valid_external(rest) {
                    return Err(SecretError::Invalid(format!(
                        "{scheme} path must match [A-Za-z0-9][A-Za-z0-9_./#-]{{0,511}} without '..'"
                    )));
                }
                return Ok(SecretValue {
                    parts: vec![Part::External(raw.into())],
                });
            }
        }
        let mut parts = Vec::new();
        let mut rest = raw;
        while let Some(start) = rest.find("${") {
            let Some(len) = rest[start..].find('}') else {
                return Err(SecretError::Invalid("unterminated ${ template".into()));
            };
            if start > 0 {
                parts.push(Part::Text(rest[..start].into()));
            }
            let inner = &rest[start + 2..start + len];
            let var = inner.strip_prefix("env:").unwrap_or(inner);
            if !valid_var(var) {
                return Err(SecretError::Invalid(
                    "templates take ${NAME} or ${env:NAME}".into(),
                ));
            }
            parts.push(Part::Var(var.into()));
            rest = &rest[start + len + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.into()));
        }
        Ok(SecretValue { parts })
    }

    /// A literal value (for tests and programmatic fleets).
    pub fn literal(text: impl Into<String>) -> Self {
        SecretValue {
            parts: vec![Part::Text(text.into())],
        }
    }

    /// True when the value contains at least one reference.
    pub fn is_reference(&self) -> bool {
        self.parts.iter().any(|p| !matches!(p, Part::Text(_)))
    }

    /// True when the value is exactly one reference and nothing else.
    pub fn is_bare_reference(&self) -> bool {
        matches!(self.parts.as_slice(), [p] if !matches!(p, Part::Text(_)))
    }

    /// The form a sensitive name (TOKEN, AUTHORIZATION, …) must have: one bare reference, or an
    /// auth scheme word and a space before exactly one `${…}` reference (`Bearer ${TOKEN}`,
    /// `token ${GH}`). Anything else — literal text glued to a reference
    /// (`sk-inline${HOME}`), text after it, two references — may carry an inline credential.
    pub fn is_credential_form(&self) -> bool {
        match self.parts.as_slice() {
            [p] => !matches!(p, Part::Text(_)),
            [Part::Text(scheme), p] if !matches!(p, Part::Text(_)) => {
                let Some(word) = scheme.strip_suffix(' ') else {
                    return false;
                };
                let mut b = word.bytes();
                matches!(b.next(), Some(c) if c.is_ascii_alphabetic())
                    && word.len() <= 32
                    && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            }
            _ => false,
        }
    }

    /// The value as written in the config (references, never resolved material).
    pub fn as_written(&self) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.clone(),
                Part::Var(v) => format!("${{{v}}}"),
                Part::EnvRef(a) => format!("env://{a}"),
                Part::External(r) => r.clone(),
            })
            .collect()
    }

    /// Resolves the value using `lookup` for environment names.
    pub fn resolve(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, SecretError> {
        self.resolve_checked(lookup, &['\0', '\r', '\n'])
    }

    /// Resolves key material (a PEM private key): like [`SecretValue::resolve`], but the value
    /// may span lines (it never becomes an env variable or a header).
    pub fn resolve_material(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, SecretError> {
        self.resolve_checked(lookup, &['\0'])
    }

    fn resolve_checked(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
        forbidden: &[char],
    ) -> Result<String, SecretError> {
        let mut out = String::new();
        for part in &self.parts {
            let (reference, value) = match part {
                Part::Text(t) => {
                    out.push_str(t);
                    continue;
                }
                Part::Var(v) => (format!("${{{v}}}"), lookup(v)),
                // `env://A` first asks for "env://A" (a lookup that knows MCP_FLEET_SECRET_REFS
                // answers it), then for the plain name A.
                Part::EnvRef(a) => {
                    let reference = format!("env://{a}");
                    let value = lookup(&reference).or_else(|| lookup(a));
                    (reference, value)
                }
                // vault:// and secret:// are served by a backend (prefetched by `materialize`).
                Part::External(r) => (r.clone(), lookup(r)),
            };
            let Some(value) = value else {
                return Err(SecretError::Unavailable { reference });
            };
            if value.contains(forbidden) {
                return Err(SecretError::BadValue { reference });
            }
            out.push_str(&value);
        }
        Ok(out)
    }
}

/// Looks a name up in the gateway's own environment (`env://NAME` looks up NAME).
pub fn process_env(name: &str) -> Option<String> {
    if name.contains("://") && !name.starts_with("env://") {
        return None;
    }
    std::env::var(name.strip_prefix("env://").unwrap_or(name)).ok()
}

impl SecretValue {
    /// The `vault://` / `secret://` references in this value.
    pub fn externals(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::External(r) => Some(r.as_str()),
            _ => None,
        })
    }

    /// The `env://ALIAS` aliases in this value.
    pub fn env_aliases(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::EnvRef(a) => Some(a.as_str()),
            _ => None,
        })
    }
}

/// Resolves `secret://` / `vault://` references (Kubernetes Secrets, Vault).
pub trait SecretBackend: Send + Sync {
    /// The secret value of a reference, or `None` when it is unavailable.
    fn fetch(&self, reference: &str) -> futures::future::BoxFuture<'static, Option<String>>;

    /// The value and how long it may be reused without asking the backend again (zero: read it
    /// again at every child start).
    fn fetch_ttl(
        &self,
        reference: &str,
    ) -> futures::future::BoxFuture<'static, Option<(String, std::time::Duration)>> {
        let fut = self.fetch(reference);
        Box::pin(async move { fut.await.map(|v| (v, std::time::Duration::ZERO)) })
    }

    /// Forgets anything cached for a reference (its declaration changed: re-resolve it).
    fn invalidate(&self, _reference: &str) {}
}

static KUBE_BACKEND: std::sync::OnceLock<std::sync::Arc<dyn SecretBackend>> =
    std::sync::OnceLock::new();
static VAULT_BACKEND: std::sync::OnceLock<std::sync::Arc<dyn SecretBackend>> =
    std::sync::OnceLock::new();

/// Installs the process-wide backend of `secret://` references (first call wins).
pub fn set_backend(backend: std::sync::Arc<dyn SecretBackend>) {
    let _ = KUBE_BACKEND.set(backend);
}

/// Installs the process-wide backend of `vault://` references (first call wins).
pub fn set_vault_backend(backend: std::sync::Arc<dyn SecretBackend>) {
    let _ = VAULT_BACKEND.set(backend);
}

fn backend_for(reference: &str) -> Option<&'static std::sync::Arc<dyn SecretBackend>> {
    if reference.starts_with("secret://") {
        KUBE_BACKEND.get()
    } else if reference.starts_with("vault://") {
        VAULT_BACKEND.get()
    } else {
        None
    }
}

/// Forgets what the backend caches for a reference.
pub fn invalidate_external(reference: &str) {
    if let Some(b) = backend_for(reference) {
        b.invalidate(reference);
    }
}

/// Fetches one external reference (`None` = unavailable: no backend, missing, backend down).
pub async fn fetch_external(reference: &str) -> Option<(String, std::time::Duration)> {
    backend_for(reference)?.fetch_ttl(reference).await
}

/// Fetches every external reference among `values` (at the child boundary, just before start).
pub async fn prefetch<'a>(
    values: impl Iterator<Item = &'a SecretValue>,
) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    for reference in values.flat_map(|v| v.externals().map(str::to_string).collect::<Vec<_>>()) {
        if out.contains_key(&reference) {
            continue;
        }
        if let Some((value, _)) = fetch_external(&reference).await {
            out.insert(reference, value);
        }
    }
    out
}

/// A lookup that serves external references from `prefetched` and names from the environment.
pub fn lookup_with(
    prefetched: &std::collections::HashMap<String, String>,
) -> impl Fn(&str) -> Option<String> + '_ {
    move |name: &str| {
        if name.starts_with("env://") {
            process_env(name).or_else(|| prefetched.get(name).cloned())
        } else if name.contains("://") {
            prefetched.get(name).cloned()
        } else {
            process_env(name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sensitive_names_follow_the_credential_policy() {
        for n in [
            "GITHUB_TOKEN",
            "api-key",
            "Authorization",
            "DB_PASSWORD",
            "X_HMAC_KEY",
            "client_secret",
            "APIKEY",
        ] {
            assert!(is_sensitive_name(n), "{n}");
        }
        for n in ["PATH", "HOME", "TOKENIZER_PATH2X", "KEYBOARD", "MONKEY"] {
            assert!(!is_sensitive_name(n), "{n}");
        }
    }

    #[test]
    fn references_resolve_and_missing_ones_fail_closed() {
        let env = |k: &str| (k == "ALIAS").then(|| "s3cr3t".to_string());
        assert_eq!(
            SecretValue::parse("env://ALIAS")
                .unwrap()
                .resolve(&env)
                .unwrap(),
            "s3cr3t"
        );
        assert_eq!(
            SecretValue::parse("Bearer ${ALIAS}")
                .unwrap()
                .resolve(&env)
                .unwrap(),
            "Bearer s3cr3t"
        );
        assert_eq!(
            SecretValue::parse("${env:ALIAS}")
                .unwrap()
                .resolve(&env)
                .unwrap(),
            "s3cr3t"
        );
        let err = SecretValue::parse("env://MISSING")
            .unwrap()
            .resolve(&env)
            .unwrap_err();
        assert_eq!(err.code(), "secret-unavailable");
        assert!(!err.to_string().contains("s3cr3t"));
        let err = SecretValue::parse("vault://kv/app#token")
            .unwrap()
            .resolve(&env)
            .unwrap_err();
        assert_eq!(err.code(), "secret-unavailable");
    }

    #[test]
    fn malformed_references_are_rejected() {
        for bad in [
            "env://lower",
            "ENV://X",
            "vault://../x",
            "${1BAD}",
            "${OPEN",
        ] {
            assert!(SecretValue::parse(bad).is_err(), "{bad}");
        }
        assert!(!SecretValue::parse("plain").unwrap().is_reference());
        assert!(SecretValue::parse("x ${A} y").unwrap().is_reference());
    }

    #[test]
    fn debug_never_prints_material() {
        let v = SecretValue::parse("hunter2").unwrap();
        assert!(!format!("{v:?}").contains("hunter2"));
    }
}
