//! Materialization of a child's secrets at the child boundary, bound to its declaration.
//!
//! [`materialize`] runs just before a child connection is opened: it fetches every external
//! reference (`vault://`, `secret://`) and every `env://ALIAS` that `MCP_FLEET_SECRET_REFS`
//! maps, and binds the result to the HMAC of the child's declaration ([`super::attest`]). The
//! material is kept in memory only (never written, logged or returned) and reused by later
//! connections of the same declaration while every value's TTL allows (Kubernetes Secrets:
//! never reused, read at every start; Vault: its lease/cache TTL). Material of a changed
//! declaration is never used: it is dropped and re-resolved, and the event
//! `secret-material-rebound` is logged (server name only).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::attest;
use crate::config::{ChildSpec, Launch};
use crate::secrets::refs::{self, Mapped};
use crate::secrets::{SecretValue, fetch_external, process_env};

/// Resolved references of one child connection.
#[derive(Default)]
pub struct Material {
    values: HashMap<String, String>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Material({} values)", self.values.len())
    }
}

impl Material {
    /// The lookup transports resolve values with: `env://A` → the live variable A, else the
    /// mapped material; `vault://`/`secret://` → the material; `${A}` → the variable A.
    pub fn lookup(&self) -> impl Fn(&str) -> Option<String> + '_ {
        move |name: &str| {
            if name.starts_with("env://") {
                process_env(name).or_else(|| self.values.get(name).cloned())
            } else if name.contains("://") {
                self.values.get(name).cloned()
            } else {
                process_env(name)
            }
        }
    }
}

struct Stored {
    declaration: [u8; 32],
    binding: Vec<u8>,
    values: HashMap<String, String>,
    expires: Instant,
}

static REGISTRY: Mutex<Option<HashMap<String, Stored>>> = Mutex::new(None);

async fn fetch(
    reference: &str,
    key: String,
    out: &mut HashMap<String, String>,
) -> Option<Duration> {
    let (value, t) = fetch_external(reference).await?;
    out.insert(key, value);
    Some(t)
}

/// Every secret value a child's launch needs (env or headers, TLS client key).
pub fn values_of(spec: &ChildSpec) -> Vec<&SecretValue> {
    match &spec.launch {
        Launch::Stdio(s) => s.env.values().collect(),
        Launch::Remote(r) => r
            .headers
            .values()
            .chain(r.tls.iter().flat_map(|t| t.secret_values()))
            .collect(),
    }
}

/// Fetches (or reuses, while bound to the same declaration and fresh) a child's secret material.
/// Never fails: a reference that cannot be resolved is absent and the transport fails the
/// child closed with `secret-unavailable`.
pub async fn materialize(spec: &ChildSpec) -> Material {
    let values = values_of(spec);
    if values.iter().all(|v| !v.is_reference()) {
        return Material::default();
    }
    let declaration = attest::declaration_digest(spec);
    {
        let mut guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        let registry = guard.get_or_insert_with(HashMap::new);
        match registry.get(&spec.name) {
            Some(stored) if stored.declaration != declaration => {
                registry.remove(&spec.name);
                for v in &values {
                    v.externals().for_each(crate::secrets::invalidate_external);
                    for alias in v.env_aliases() {
                        if let Mapped::To(target) = refs::mapped(alias) {
                            target
                                .externals()
                                .for_each(crate::secrets::invalidate_external);
                        }
                    }
                }
                tracing::info!(
                    target: "graph_os::secrets",
                    event = "secret-material-rebound",
                    server = %spec.name,
                    "the child's declaration changed since its secrets were materialized: the material is discarded and re-resolved"
                );
            }
            Some(stored)
                if Instant::now() < stored.expires
                    && attest::verify(&declaration, &stored.values, &stored.binding) =>
            {
                return Material {
                    values: stored.values.clone(),
                };
            }
            _ => {}
        }
    }
    let mut out: HashMap<String, String> = HashMap::new();
    let mut ttl = Duration::MAX;
    let mut complete = true;
    for v in &values {
        for r in v.externals() {
            if out.contains_key(r) {
                continue;
            }
            match fetch(r, r.to_string(), &mut out).await {
                Some(t) => ttl = ttl.min(t),
                None => complete = false,
            }
        }
        for alias in v.env_aliases() {
            let key = format!("env://{alias}");
            if process_env(alias).is_some() || out.contains_key(&key) {
                continue;
            }
            match refs::mapped(alias) {
                Mapped::Absent => {}
                Mapped::Broken => complete = false,
                Mapped::To(target) => {
                    if let Some(a) = target.env_aliases().next() {
                        match process_env(a) {
                            Some(value) => {
                                out.insert(key, value);
                            }
                            None => complete = false,
                        }
                    } else if let Some(r) = target.externals().next() {
                        match fetch(r, key, &mut out).await {
                            Some(t) => ttl = ttl.min(t),
                            None => complete = false,
                        }
                    }
                }
            }
        }
    }
    if complete && !ttl.is_zero() {
        let binding = attest::bind(&declaration, &out);
        let mut guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        guard.get_or_insert_with(HashMap::new).insert(
            spec.name.clone(),
            Stored {
                declaration,
                binding,
                values: out.clone(),
                expires: Instant::now()
                    .checked_add(ttl)
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365)),
            },
        );
    } else {
        // Remember the declaration (no values) so a later change is still reported.
        let mut guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        guard.get_or_insert_with(HashMap::new).insert(
            spec.name.clone(),
            Stored {
                declaration,
                binding: vec![],
                values: HashMap::new(),
                expires: Instant::now(),
            },
        );
    }
    Material { values: out }
}
