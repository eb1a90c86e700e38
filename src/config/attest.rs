//! Attestation of materialized secrets and the keyed freshness identity of a child declaration.
//!
//! - **Attestation.** When a child's secrets are materialized they are bound to
//!   `HMAC-SHA-256(key, canonical declaration)` — command, args, cwd, url, transport, TLS
//!   profile (name and content), private-host policy, time bounds and other parent-only
//!   controls, env and header names with their values *as written* (references, never resolved
//!   material). Material whose binding does not verify against the current declaration is never
//!   used: it is re-resolved, and the mismatch is logged as the event `secret-material-rebound`
//!   (no values).
//! - **Freshness identity.** A keyed opaque identity of the declaration for freshness records:
//!   credentials (references, sensitive names) contribute only `"credential-present"`, so a
//!   rotated secret keeps the identity while any change of the declaration changes it.
//!
//! The key is process-ephemeral (32 random bytes) unless configured (`--attestation-key
//! REFERENCE`, the same on every replica); with the ephemeral key a restart conservatively
//! counts every declaration as changed.

use std::collections::HashMap;
use std::sync::OnceLock;

use ring::hmac;
use serde_json::{Value, json};

use crate::config::{ChildSpec, Launch, TransportKind};

static KEY: OnceLock<(hmac::Key, bool)> = OnceLock::new();

/// Configures the key (from resolved material; hashed into a 256-bit key). Fails when a key is
/// in use already.
pub fn set_key(material: &[u8]) -> Result<(), String> {
    if material.len() < 16 {
        return Err("the attestation key must be at least 16 bytes".into());
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, material);
    KEY.set((hmac::Key::new(hmac::HMAC_SHA256, digest.as_ref()), false))
        .map_err(|_| "the attestation key is already in use".to_string())
}

fn key() -> &'static hmac::Key {
    &KEY.get_or_init(|| {
        let rng = ring::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)
            .expect("the system random number generator is available");
        (key, true)
    })
    .0
}

/// Whether the key is process-ephemeral (not configured).
pub fn key_is_ephemeral() -> bool {
    KEY.get().is_none_or(|(_, ephemeral)| *ephemeral)
}

fn mac(label: &[u8], data: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key());
    ctx.update(label);
    ctx.update(b"\0");
    ctx.update(data);
    ctx.sign()
}

fn ms(d: std::time::Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

fn transport_name(spec: &ChildSpec) -> &'static str {
    match &spec.launch {
        Launch::Stdio(_) => "stdio",
        Launch::Remote(r) => match r.transport {
            TransportKind::Sse => "sse",
            _ => "streamable-http",
        },
    }
}

/// SHA-256 over a TLS profile's content (CA and client certificates, key reference, version,
/// server name).
fn tls_digest(spec: &ChildSpec) -> Option<String> {
    let Launch::Remote(r) = &spec.launch else {
        return None;
    };
    let p = r.tls.as_ref()?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for c in p.ca.iter().chain(p.client_cert.iter()) {
        ctx.update(&(c.len() as u64).to_be_bytes());
        ctx.update(c.as_ref());
    }
    ctx.update(format!("{:?}|{:?}|{:?}|", p.ca_mode, p.min_version, p.server_name).as_bytes());
    if let Some(k) = &p.client_key {
        ctx.update(k.as_written().as_bytes());
    }
    Some(hex::encode(ctx.finish()))
}

/// The canonical declaration a child's material is bound to (values as written: references,
/// never resolved material).
pub fn declaration(spec: &ChildSpec) -> Value {
    let l = &spec.limits;
    let launch = match &spec.launch {
        Launch::Stdio(s) => json!({
            "command": s.command,
            "args": s.args,
            "cwd": s.cwd.as_ref().map(|c| c.display().to_string()),
            "env": s.env.iter().map(|(k, v)| (k.clone(), Value::String(v.as_written()))).collect::<serde_json::Map<_, _>>(),
        }),
        Launch::Remote(r) => json!({
            "url": r.url.as_str(),
            "transport": transport_name(spec),
            "headers": r.headers.iter().map(|(k, v)| (k.clone(), Value::String(v.as_written()))).collect::<serde_json::Map<_, _>>(),
        }),
    };
    json!({
        "format": "graph-os-child-declaration/v1",
        "server": spec.name,
        "launch": launch,
        "tlsProfile": spec.tls_profile,
        "tlsProfileContent": tls_digest(spec),
        "allowedPrivateHosts": spec.allowed_private_hosts,
        "limits": {
            "initializationTimeoutMs": ms(l.initialization_timeout),
            "probeTimeoutMs": ms(l.probe_timeout),
            "callTimeoutMs": ms(l.call_timeout),
            "queueTimeoutMs": ms(l.queue_timeout),
            "relayTimeoutMs": ms(l.relay_timeout),
            "sessionIdleTimeoutMs": ms(l.session_idle_timeout),
            "restartWindowMs": ms(l.restart_window),
            "breakerCooldownMs": ms(l.breaker_cooldown),
            "maxConcurrency": l.max_concurrency,
            "poolSize": l.pool_size,
            "maxRestarts": l.max_restarts,
            "breakerThreshold": l.breaker_threshold,
            "maxSessions": l.max_sessions,
        },
        "sessionIsolation": format!("{:?}", spec.isolation),
        "requiredScope": spec.required_scope.map(|s| format!("{s:?}")),
    })
}

/// The keyed digest of a declaration.
pub fn declaration_digest(spec: &ChildSpec) -> [u8; 32] {
    let text = crate::digest::canonical_json(&declaration(spec));
    let tag = mac(b"graph-os:child-declaration:v1", text.as_bytes());
    tag.as_ref().try_into().unwrap_or([0; 32])
}

fn material_bytes(declaration: &[u8; 32], values: &HashMap<String, String>) -> Vec<u8> {
    let mut keys: Vec<&String> = values.keys().collect();
    keys.sort();
    let mut out = declaration.to_vec();
    for k in keys {
        for part in [k.as_bytes(), values[k].as_bytes()] {
            out.extend_from_slice(&(part.len() as u64).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

/// Binds materialized `values` to a declaration digest.
pub fn bind(declaration: &[u8; 32], values: &HashMap<String, String>) -> Vec<u8> {
    mac(
        b"graph-os:materialized:v1",
        &material_bytes(declaration, values),
    )
    .as_ref()
    .to_vec()
}

/// Verifies a binding in constant time.
pub fn verify(declaration: &[u8; 32], values: &HashMap<String, String>, binding: &[u8]) -> bool {
    let mut data = b"graph-os:materialized:v1\0".to_vec();
    data.extend(material_bytes(declaration, values));
    hmac::verify(key(), &data, binding).is_ok()
}

fn token(label: &str, v: &Value) -> String {
    let mut data = label.as_bytes().to_vec();
    data.push(0);
    data.extend(crate::digest::canonical_json(v).as_bytes());
    hex::encode(mac(b"graph-os:mcp-freshness-field:v1", &data).as_ref())
}

/// The keyed opaque freshness identity of a declaration (hex). Credentials contribute only
/// `"credential-present"`, so rotating a secret keeps it; any other change changes it.
pub fn freshness_identity(spec: &ChildSpec) -> String {
    let pairs =
        |label: &str, map: &std::collections::BTreeMap<String, crate::secrets::SecretValue>| {
            map.iter()
                .map(|(k, v)| {
                    let value = if v.is_reference() || crate::secrets::is_sensitive_name(k) {
                        Value::String("credential-present".into())
                    } else {
                        Value::String(token(
                            &format!("{label}:{k}"),
                            &Value::String(v.as_written()),
                        ))
                    };
                    json!([k, value])
                })
                .collect::<Vec<_>>()
        };
    let (command, args, url, env, headers) = match &spec.launch {
        Launch::Stdio(s) => (
            json!(s.command),
            json!(s.args),
            Value::Null,
            pairs("environment", &s.env),
            vec![],
        ),
        Launch::Remote(r) => (
            Value::Null,
            Value::Null,
            json!(r.url.as_str()),
            vec![],
            pairs("headers", &r.headers),
        ),
    };
    let disabled: Vec<String> = spec
        .disabled_tools
        .iter()
        .map(|p| p.as_str().to_string())
        .collect();
    let payload = json!({
        "format": "mcp-freshness/v1",
        "server": token("server", &json!(spec.name)),
        "command": token("command", &command),
        "args": token("args", &args),
        "url": token("url", &url),
        "tls_profile": token("tls_profile", &json!(spec.tls_profile)),
        "tls_profile_ref": token("tls_profile_ref", &json!(tls_digest(spec))),
        "private_hosts": token("private_hosts", &json!(spec.allowed_private_hosts)),
        "disabled_tools": token("disabled_tools", &json!(disabled)),
        "transport": transport_name(spec),
        "environment": env,
        "headers": headers,
    });
    let text = crate::digest::canonical_json(&payload);
    hex::encode(mac(b"graph-os:mcp-freshness:v1", text.as_bytes()).as_ref())
}
