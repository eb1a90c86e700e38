//! Callers and scopes. stdio is the trusted local user (every scope). HTTP callers present a
//! bearer token; configured tokens (secret references, resolved at startup) map to a scope:
//! `discover` ⊂ `delegate` ⊂ `manage`. Tokens are compared by SHA-256 digest in constant time
//! and never logged. With no tokens configured, HTTP MCP callers get `delegate` and the REST
//! admin API refuses everyone (fail closed).

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::secrets::SecretValue;

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// find_tools, list_catalog, multiplexer_status, fleet_graph.
    Discover,
    /// load/unload/call tools, catalog_dispatch.
    Delegate,
    /// catalog_refresh.
    Manage,
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "discover" => Ok(Scope::Discover),
            "delegate" => Ok(Scope::Delegate),
            "manage" => Ok(Scope::Manage),
            other => Err(format!(
                "unknown scope '{other}' (discover, delegate, manage)"
            )),
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
            let (scope, reference) = spec.split_once('=').ok_or_else(|| {
                format!(
                    "--token expects SCOPE=REFERENCE, got '{}'",
                    spec.split('=').next().unwrap_or_default()
                )
            })?;
            let scope: Scope = scope.parse()?;
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
        let d = digest(presented);
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
        header
            .and_then(|h| h.strip_prefix("Bearer "))
            .and_then(|t| self.scope_of(t.trim()))
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
