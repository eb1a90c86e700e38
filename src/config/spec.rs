//! The wire shape of one `mcpServers` entry and its validation into a [`ChildSpec`].

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::urls;
use super::{
    AdmissionContext, ChildSpec, ConfigIssue, Launch, Limits, RemoteSpec, SELF_NAME,
    SELF_REGISTRATION_REFUSED, StdioSpec, issue,
};
use crate::net::egress;
use crate::secrets::{self, SecretValue};

/// How a child's tools are exposed to sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExposeMode {
    /// Discovered through find_tools and loaded on demand (default).
    #[default]
    Lazy,
    /// Loaded for every session.
    Eager,
}

/// Remote transport selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TransportKind {
    /// A local process over stdin/stdout.
    #[serde(rename = "stdio")]
    Stdio,
    /// MCP streamable HTTP.
    #[serde(rename = "streamable-http", alias = "streamableHttp", alias = "http")]
    StreamableHttp,
    /// Legacy HTTP+SSE.
    #[serde(rename = "sse")]
    Sse,
}

pub use crate::catalog::drift::DriftPolicy;

/// How front sessions share a child's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SessionIsolation {
    /// One connection (stdio process, or `poolSize` HTTP connections) serves every session
    /// (default). Child→client requests and logs are delivered only when exactly one session
    /// has calls in flight.
    #[default]
    Shared,
    /// Every front session gets its own connection (a process for stdio, an upstream MCP
    /// session for HTTP), closed when idle or when the session ends; relays are exact.
    PerSession,
}

/// How graph-os authenticates itself toward a child (`auth` of an entry). Never the front
/// caller's own token (the MCP specification forbids token passthrough).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthSpec {
    /// `oauth-client-credentials` (remote children: an OAuth 2.1 client credentials grant) or
    /// `run-token` (a short-lived HMAC-signed assertion of the caller per call).
    #[serde(rename = "type")]
    pub kind: AuthKind,
    /// Client credentials: the authorization server's token endpoint (default: discovered from
    /// the child's protected-resource metadata, RFC 9728, and its authorization server's
    /// metadata, RFC 8414).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_url: Option<String>,
    /// Client credentials: the client id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Client credentials: the client secret, as a secret reference (`env://…`, `vault://…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// Client credentials: the scope requested (space separated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Client credentials: the audience (sent as RFC 8707 `resource` and as `audience`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Client credentials: `client_secret_basic` (default), `client_secret_post` or
    /// `private_key_jwt` (RFC 7523: an ES256 assertion signed with `privateKey`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_endpoint_auth: Option<TokenEndpointAuth>,
    /// Client credentials with `private_key_jwt`: the client's P-256 private key (PKCS#8 PEM),
    /// as a secret reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// Client credentials with `private_key_jwt`: the `kid` of the assertion's header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// Run token: the HMAC-SHA256 key, as a secret reference (at least 32 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Run token: lifetime in seconds (1..300, default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<f64>,
}

/// The kind of [`AuthSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AuthKind {
    /// OAuth 2.1 client credentials grant; the access token goes in `Authorization: Bearer`.
    OauthClientCredentials,
    /// A signed assertion of the caller's identity and scope, bound to the call.
    RunToken,
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenEndpointAuth {
    /// HTTP Basic with the form-encoded id and secret (RFC 6749 §2.3.1).
    ClientSecretBasic,
    /// `client_id` and `client_secret` in the form body.
    ClientSecretPost,
    /// A JWT assertion signed with the client's private key (RFC 7523 §2.2, ES256).
    PrivateKeyJwt,
}

/// A root graph-os answers a child's `roots/list` with when the calling client cannot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RootSpec {
    /// Root URI (e.g. `file:///workspace`).
    pub uri: String,
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Bounds on forwarded `tools/call` arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArgumentLimitsSpec {
    /// Serialized size, bytes (1024..67108864, default 4 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Nesting depth (1..256, default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// JSON values in total: objects, arrays, members and scalars (1..10000000, default 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_items: Option<u64>,
    /// Length of one string, bytes (1..67108864, default 4 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_string_bytes: Option<u64>,
}

/// One entry of `mcpServers` as written in the file (or the McpFleet CRD spec).
///
/// Keys are camelCase, unknown keys are rejected, durations are seconds (fractions allowed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.command) != has(self.url)", "message": "exactly one of command or url is required"}
]))]
pub struct ServerSpec {
    /// Executable of a stdio child (exactly one of `command` / `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Arguments of a stdio child.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of a stdio child; sensitive names must hold references (`env://`, `${VAR}`...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory of a stdio child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Endpoint of a remote child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Transport: `stdio`, `streamable-http` (alias `http`, `streamableHttp`) or `sse`.
    #[serde(default, alias = "type", skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportKind>,
    /// HTTP headers of a remote child; sensitive names must hold references.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Exclude this entry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// Glob allowlist over the child's tool names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled_tools: Option<Vec<String>>,
    /// Glob denylist applied after the allowlist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disabled_tools: Vec<String>,
    /// Name prefix override; `""` exposes names unchanged (with `expose: eager`: transparent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// `lazy` (default) or `eager` (loaded for every session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expose: Option<ExposeMode>,
    /// Connect budget and default call timeout, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// `initialize` deadline, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization_timeout: Option<f64>,
    /// Whole catalog probe deadline, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_timeout: Option<f64>,
    /// Tool call deadline, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout: Option<f64>,
    /// Concurrent calls admitted (1..128, default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// Concurrent calls of one principal (caller identity) admitted, so another principal
    /// always finds a slot (1..128, default half of `maxConcurrency`, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency_per_principal: Option<u32>,
    /// How long a call waits for a slot, seconds (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout: Option<f64>,
    /// Connections to a remote child (1..64, default 1; stdio is always 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<u32>,
    /// Restarts per window (0..100, default 5; 0 = never restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// Restart budget window, seconds (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_window: Option<f64>,
    /// Consecutive failures that open the breaker (0..100, default 5; 0 = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_threshold: Option<u32>,
    /// Breaker open time, seconds (default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_cooldown: Option<f64>,
    /// Hosts a remote child may reach although private/loopback or plain http.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_private_hosts: Vec<String>,
    /// Named TLS trust profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_profile: Option<String>,
    /// Scopes a caller must hold to see and use this child (`discover`, `delegate`, `manage`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_scopes: Vec<String>,
    /// `shared` (default) or `per-session`: whether front sessions share the child connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_isolation: Option<SessionIsolation>,
    /// With `per-session`: seconds an unused per-session connection stays open (1..86400, default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_idle_timeout: Option<f64>,
    /// With `per-session`: most per-session connections open at once (1..1024, default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// Seconds a relayed sampling/elicitation/roots request may wait for the client (default 120).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_timeout: Option<f64>,
    /// Roots graph-os answers this child's `roots/list` with when the calling client declared no
    /// roots capability (or no single caller can be known); default none (an empty list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roots: Vec<RootSpec>,
    /// Bounds on forwarded tool-call arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument_limits: Option<ArgumentLimitsSpec>,
    /// How graph-os authenticates toward this child (OAuth client credentials or run tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
    /// `off`, `hold` or `block`: what is served while the child's catalog differs from the
    /// approved one (default: the gateway's `--drift-policy`, itself `off` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_policy: Option<DriftPolicy>,
    /// The approved catalog digest (64 hex digits, as `drift-pending` status shows it); pins the
    /// approval for every replica (REST approvals are refused for a pinned entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_digest: Option<String>,
    /// Grouping shown by list_catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// One-line hint shown by list_catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

pub(super) enum Admission {
    Admitted(Box<ChildSpec>),
    Disabled,
    Refused,
}

/// Seconds bound `(min, max)` for a duration field.
struct SecondsBound {
    field: &'static str,
    min: f64,
    max: f64,
}

const HEADER_FORBIDDEN: &[&str] = &[
    "connection",
    "content-length",
    "host",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn valid_env_key(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && key.len() <= 128
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn valid_header_name(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+.^_`|~-".contains(&b))
}

/// Normalizes a prefix override: non-`[A-Za-z0-9_]` runs → `_`, trim `_`, lowercase, ≤ 10 chars.
pub fn normalize_prefix(raw: &str) -> String {
    let mut out = String::new();
    let mut last_us = false;
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c.to_ascii_lowercase());
            last_us = c == '_';
        } else if !last_us {
            out.push('_');
            last_us = true;
        }
    }
    let trimmed: String = out.trim_matches('_').chars().take(10).collect();
    trimmed.trim_end_matches('_').to_string()
}

fn seconds(
    server: &str,
    value: Option<f64>,
    fallback: f64,
    bound: SecondsBound,
    issues: &mut Vec<ConfigIssue>,
) -> Duration {
    let v = value.unwrap_or(fallback);
    if !v.is_finite() || v < bound.min || v > bound.max {
        issues.push(issue(
            server,
            bound.field,
            &format!("{v} seconds is outside {}..{}", bound.min, bound.max),
        ));
        return Duration::from_secs_f64(fallback.clamp(bound.min, bound.max));
    }
    Duration::from_secs_f64(v)
}

fn count(
    server: &str,
    field: &str,
    value: Option<u32>,
    default: u32,
    min: u32,
    max: u32,
    issues: &mut Vec<ConfigIssue>,
) -> u32 {
    let v = value.unwrap_or(default);
    if v < min || v > max {
        issues.push(issue(
            server,
            field,
            &format!("{v} is outside {min}..{max}"),
        ));
        return default;
    }
    v
}

/// Describes a serde error without the value it quotes (`invalid type: string "ghp_…"` names a
/// credential when someone put one in the wrong place): the kind of problem and what was expected.
pub(crate) fn describe_serde_error(err: &serde_json::Error) -> String {
    let text = err.to_string();
    if let Some(rest) = text.strip_prefix("unknown field `")
        && let Some(end) = rest.find('`')
    {
        let unknown = &rest[..end];
        // serde lists the keys it expected after the unknown one: `a`, `b`, …
        let expected: Vec<&str> = rest[end + 1..].split('`').skip(1).step_by(2).collect();
        return match did_you_mean(unknown, &expected) {
            Some(near) => format!("unknown key '{unknown}' (did you mean '{near}'?)"),
            None => format!("unknown key '{unknown}'"),
        };
    }
    if let Some(rest) = text.strip_prefix("missing field `")
        && let Some(end) = rest.find('`')
    {
        return format!("missing key '{}'", &rest[..end]);
    }
    let kind = if text.starts_with("invalid type") {
        "wrong type"
    } else if text.starts_with("unknown variant") {
        "unknown value"
    } else if text.starts_with("invalid length") {
        "wrong length"
    } else {
        "invalid value"
    };
    match text.rsplit_once(", expected ") {
        Some((_, expected)) => format!("{kind}: expected {}", plain_type(expected)),
        None => kind.to_string(),
    }
}

/// serde's names of JSON types, in the words of a JSON document.
fn plain_type(expected: &str) -> &str {
    match expected {
        "f64" | "f32" => "a number",
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => "a whole number",
        "a sequence" => "a list",
        "a map" => "an object",
        other => other,
    }
}

/// The known key nearest to a mistyped one: at most two edits away (one for short keys), and
/// nearer than any other. `strsim` is already in the tree (clap's suggestions use it).
pub(crate) fn did_you_mean<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = if unknown.chars().count() <= 4 { 1 } else { 2 };
    let mut scored: Vec<(usize, &str)> = known
        .iter()
        .map(|k| {
            let d = strsim::damerau_levenshtein(&unknown.to_lowercase(), &k.to_lowercase());
            (d, *k)
        })
        .filter(|(d, _)| *d <= limit)
        .collect();
    scored.sort();
    match scored.as_slice() {
        [(d, best), rest @ ..] if rest.first().is_none_or(|(d2, _)| d2 > d) => Some(best),
        _ => None,
    }
}

/// Field paths and value-free reasons of an entry that does not deserialize: each key is tried
/// alone (every field is optional), so every bad key is named (three unknown keys: three
/// problems); maps of strings (`env`, `headers`) down to each bad value, nested objects (`auth`,
/// `argumentLimits`) down to an unknown key.
fn reject_messages(entry: &serde_json::Value, err: &serde_json::Error) -> Vec<(String, String)> {
    let Some(obj) = entry.as_object() else {
        return vec![(String::new(), "the entry must be an object".into())];
    };
    let mut out = Vec::new();
    for (key, value) in obj {
        let alone = serde_json::Value::Object([(key.clone(), value.clone())].into_iter().collect());
        let Err(e) = serde_json::from_value::<ServerSpec>(alone) else {
            continue;
        };
        if matches!(key.as_str(), "env" | "headers")
            && let Some(m) = value.as_object()
            && m.values().any(|v| !v.is_string())
        {
            for (k, _) in m.iter().filter(|(_, v)| !v.is_string()) {
                out.push((format!("{key}.{k}"), "wrong type: expected a string".into()));
            }
            continue;
        }
        let reason = describe_serde_error(&e);
        if value.is_object()
            && let Some((inner, hint)) = reason
                .strip_prefix("unknown key '")
                .and_then(|r| r.split_once('\''))
            // An unknown key whose value is an object is itself the unknown key.
            && inner != key
        {
            out.push((format!("{key}.{inner}"), format!("unknown key{hint}")));
            continue;
        }
        out.push((key.clone(), reason));
    }
    if out.is_empty() {
        out.push((String::new(), describe_serde_error(err)));
    }
    out
}

fn parse_values(
    server: &str,
    field: &str,
    map: &BTreeMap<String, String>,
    issues: &mut Vec<ConfigIssue>,
) -> BTreeMap<String, SecretValue> {
    let mut out = BTreeMap::new();
    for (key, raw) in map {
        let path = format!("{field}.{key}");
        if raw.len() > 65_536 {
            issues.push(issue(server, &path, "value is longer than 65536 bytes"));
            continue;
        }
        if raw.contains(['\0', '\r', '\n']) {
            issues.push(issue(server, &path, "value contains NUL, CR or LF"));
            continue;
        }
        match secrets::SecretValue::parse(raw) {
            Ok(value) => {
                if secrets::is_sensitive_name(key) && !value.is_credential_form() {
                    issues.push(issue(
                        server,
                        &path,
                        "inline credential refused: a sensitive name must hold one reference (env://NAME, ${NAME}, vault://…, secret://…), alone or after an auth scheme (`Bearer ${NAME}`)",
                    ));
                    continue;
                }
                out.insert(key.clone(), value);
            }
            Err(e) => issues.push(issue(server, &path, &e.to_string())),
        }
    }
    out
}

/// Whether `url` is graph-os itself — the one rule of the self-registration guard: one of its
/// listen addresses (`host:port`; any loopback name for a loopback address), or one of the hosts
/// it is reached by (`--allowed-host`, the advertised OAuth resource) on **any** port (an ingress
/// on 443 in front of a gateway listening on 8004 is still graph-os). Loopback and unspecified
/// hosts match only with their port: another port there is another local server.
pub fn points_at_self(url: &url::Url, ctx: &AdmissionContext) -> bool {
    let host = normal_host(&egress::url_host(url));
    let port = url.port_or_known_default();
    let at_address = ctx.self_addresses.iter().any(|a| {
        let (h, p) = split_authority(a);
        p.is_some() && p == port && (h == host || (is_loopback_host(&h) && is_loopback_host(&host)))
    });
    at_address
        || ctx.self_hosts.iter().any(|a| {
            let (h, _) = split_authority(a);
            !h.is_empty() && !is_loopback_host(&h) && !is_unspecified_host(&h) && h == host
        })
}

/// `host[:port]`, `[v6][:port]` or a bare IPv6 address: the lowercased host without brackets or
/// a trailing dot, and the port when one is given.
fn split_authority(authority: &str) -> (String, Option<u16>) {
    let a = authority.trim();
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (rest, None),
        }
    } else if a.matches(':').count() == 1 {
        let (h, p) = a.split_once(':').unwrap_or((a, ""));
        (h, p.parse().ok())
    } else {
        (a, None)
    };
    (normal_host(host), port)
}

fn normal_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn is_unspecified_host(host: &str) -> bool {
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
}

/// Whether a host names this machine's loopback.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub(super) fn validate_entry(
    name: &str,
    entry: &serde_json::Value,
    ctx: &AdmissionContext,
    issues: &mut Vec<ConfigIssue>,
) -> Admission {
    if !valid_server_name(name) {
        issues.push(issue(
            name,
            "",
            "server names must match [A-Za-z0-9_.-]{1,128}",
        ));
        return Admission::Refused;
    }
    if name.eq_ignore_ascii_case(SELF_NAME) {
        issues.push(issue(
            name,
            "",
            &format!("{SELF_REGISTRATION_REFUSED}: graph-os never registers itself as a child"),
        ));
        return Admission::Refused;
    }
    if entry.as_object().is_some_and(|o| o.len() > 128) {
        issues.push(issue(name, "", "more than 128 keys"));
        return Admission::Refused;
    }
    let spec: ServerSpec = match serde_json::from_value(entry.clone()) {
        Ok(s) => s,
        Err(e) => {
            let problems = reject_messages(entry, &e);
            // Every other problem too: validate the rest of the entry without the bad keys
            // (unless a key that decides the entry's shape was among them).
            let bad: Vec<&str> = problems
                .iter()
                .map(|(f, _)| f.split('.').next().unwrap_or(""))
                .collect();
            for (field, reason) in &problems {
                issues.push(issue(name, field, reason));
            }
            if let Some(obj) = entry.as_object()
                && !bad
                    .iter()
                    .any(|k| matches!(*k, "" | "command" | "url" | "transport" | "type"))
            {
                let rest: serde_json::Map<String, serde_json::Value> = obj
                    .iter()
                    .filter(|(k, _)| !bad.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if let Ok(spec) = serde_json::from_value::<ServerSpec>(rest.into())
                    && !spec.disabled
                {
                    build_child(name, spec, ctx, issues);
                }
            }
            return Admission::Refused;
        }
    };
    if spec.disabled {
        return Admission::Disabled;
    }
    let before = issues.len();
    let child = build_child(name, spec, ctx, issues);
    if issues.len() > before {
        Admission::Refused
    } else {
        Admission::Admitted(Box::new(child))
    }
}

fn build_child(
    name: &str,
    spec: ServerSpec,
    ctx: &AdmissionContext,
    issues: &mut Vec<ConfigIssue>,
) -> ChildSpec {
    let allowlist = match egress::Allowlist::parse(&spec.allowed_private_hosts) {
        Ok(a) => a,
        Err(reason) => {
            issues.push(issue(name, "allowedPrivateHosts", &reason));
            egress::Allowlist::default()
        }
    };
    let tls = match &spec.tls_profile {
        None => None,
        Some(profile) => match ctx.tls_profiles.get(profile) {
            Some(p) => Some(p.clone()),
            None => {
                let known: Vec<&str> = ctx.tls_profiles.keys().map(String::as_str).collect();
                issues.push(issue(
                    name,
                    "tlsProfile",
                    &format!(
                        "names no profile in tlsProfiles (known: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
                None
            }
        },
    };
    let launch = match (&spec.command, &spec.url) {
        (Some(_), Some(_)) | (None, None) => {
            issues.push(issue(
                name,
                "command",
                "exactly one of `command` or `url` is required",
            ));
            None
        }
        (Some(command), None) => {
            if command.is_empty() || command.len() > 4096 || command.contains('\0') {
                issues.push(issue(name, "command", "must be 1..4096 bytes without NUL"));
            }
            if !matches!(spec.transport, None | Some(TransportKind::Stdio)) {
                issues.push(issue(name, "transport", "a command-based child uses stdio"));
            }
            if spec.args.len() > 128 {
                issues.push(issue(name, "args", "more than 128 arguments"));
            }
            if spec.args.iter().any(|a| a.len() > 8192 || a.contains('\0')) {
                issues.push(issue(
                    name,
                    "args",
                    "an argument is longer than 8192 bytes or contains NUL",
                ));
            }
            if !spec.headers.is_empty() {
                issues.push(issue(
                    name,
                    "headers",
                    "headers apply to remote children only",
                ));
            }
            if spec.tls_profile.is_some() {
                issues.push(issue(
                    name,
                    "tlsProfile",
                    "TLS profiles apply to remote children only",
                ));
            }
            if !spec.allowed_private_hosts.is_empty() {
                issues.push(issue(
                    name,
                    "allowedPrivateHosts",
                    "the egress allow-list applies to remote children only",
                ));
            }
            if spec.env.len() > 256 {
                issues.push(issue(name, "env", "more than 256 variables"));
            }
            for key in spec.env.keys() {
                if !valid_env_key(key) {
                    issues.push(issue(
                        name,
                        &format!("env.{key}"),
                        "names must match [A-Za-z_][A-Za-z0-9_]{0,127}",
                    ));
                }
            }
            let env = parse_values(name, "env", &spec.env, issues);
            Some(Launch::Stdio(StdioSpec {
                command: command.clone(),
                args: spec.args.clone(),
                env,
                cwd: spec.cwd.as_ref().map(Into::into),
            }))
        }
        (None, Some(url)) => {
            if !spec.args.is_empty() || !spec.env.is_empty() || spec.cwd.is_some() {
                issues.push(issue(
                    name,
                    "url",
                    "`args`, `env` and `cwd` apply to stdio children only",
                ));
            }
            let parsed = match urls::parse_remote_url(url) {
                Ok(u) => Some(u),
                Err(reason) => {
                    issues.push(issue(name, "url", &reason));
                    None
                }
            };
            if let Some(u) = &parsed {
                let policy = egress::Policy::with(&ctx.egress, &allowlist);
                if let Err(denied) = policy.check_static(u) {
                    issues.push(issue(name, "url", &denied.to_string()));
                }
                if points_at_self(u, ctx) {
                    issues.push(issue(
                        name,
                        "url",
                        &format!(
                            "{SELF_REGISTRATION_REFUSED}: host '{}' is graph-os itself (a listen address, --allowed-host or the advertised resource); graph-os never registers itself as a child",
                            egress::url_host(u)
                        ),
                    ));
                }
                if tls.is_some() && u.scheme() != "https" {
                    issues.push(issue(
                        name,
                        "tlsProfile",
                        "a TLS profile needs an https:// URL",
                    ));
                }
            }
            if spec.headers.len() > 64 {
                issues.push(issue(name, "headers", "more than 64 headers"));
            }
            for key in spec.headers.keys() {
                if !valid_header_name(key) {
                    issues.push(issue(
                        name,
                        &format!("headers.{key}"),
                        "not a valid header name",
                    ));
                } else if HEADER_FORBIDDEN.contains(&key.to_ascii_lowercase().as_str()) {
                    issues.push(issue(
                        name,
                        &format!("headers.{key}"),
                        "this header is managed by the transport",
                    ));
                }
            }
            let headers = parse_values(name, "headers", &spec.headers, issues);
            let transport = match spec.transport {
                Some(TransportKind::Stdio) => {
                    issues.push(issue(
                        name,
                        "transport",
                        "a url-based child cannot use stdio",
                    ));
                    TransportKind::StreamableHttp
                }
                Some(t) => t,
                None if parsed
                    .as_ref()
                    .is_some_and(|u| u.path().trim_end_matches('/').ends_with("/sse")) =>
                {
                    TransportKind::Sse
                }
                None => TransportKind::StreamableHttp,
            };
            let client_credentials = client_credentials(name, spec.auth.as_ref(), issues);
            if client_credentials.is_some() && transport == TransportKind::Sse {
                issues.push(issue(
                    name,
                    "auth.type",
                    "oauth-client-credentials needs a streamable HTTP child (not legacy SSE)",
                ));
            }
            if client_credentials.is_some()
                && spec
                    .headers
                    .keys()
                    .any(|k| k.eq_ignore_ascii_case("authorization"))
            {
                issues.push(issue(
                    name,
                    "headers.Authorization",
                    "auth oauth-client-credentials sets Authorization itself",
                ));
            }
            parsed.map(|url| {
                Launch::Remote(RemoteSpec {
                    url,
                    transport,
                    headers,
                    allowed_private_hosts: allowlist.clone(),
                    tls: tls.clone(),
                    client_credentials: client_credentials.map(Box::new),
                })
            })
        }
    };

    let globs =
        |field: &str, list: &[String], issues: &mut Vec<ConfigIssue>| -> Vec<glob::Pattern> {
            list.iter()
                .filter_map(|g| match glob::Pattern::new(g) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        issues.push(issue(name, field, &format!("bad glob '{g}': {e}")));
                        None
                    }
                })
                .collect()
        };
    let enabled_tools = spec
        .enabled_tools
        .as_ref()
        .map(|l| globs("enabledTools", l, issues));
    let disabled_tools = globs("disabledTools", &spec.disabled_tools, issues);

    let timeout = spec.timeout;
    if let Some(t) = timeout
        && (!t.is_finite() || !(0.001..=3600.0).contains(&t))
    {
        issues.push(issue(
            name,
            "timeout",
            &format!("{t} seconds is outside 0.001..3600"),
        ));
    }
    let max_concurrency = count(
        name,
        "maxConcurrency",
        spec.max_concurrency,
        8,
        1,
        128,
        issues,
    );
    let limits = Limits {
        initialization_timeout: seconds(
            name,
            spec.initialization_timeout.or(timeout),
            60.0,
            SecondsBound {
                field: "initializationTimeout",
                min: 0.001,
                max: 3600.0,
            },
            issues,
        ),
        probe_timeout: seconds(
            name,
            spec.probe_timeout.or(timeout.map(|t| t.min(300.0))),
            10.0,
            SecondsBound {
                field: "probeTimeout",
                min: 0.001,
                max: 300.0,
            },
            issues,
        ),
        call_timeout: seconds(
            name,
            spec.call_timeout.or(timeout),
            300.0,
            SecondsBound {
                field: "callTimeout",
                min: 0.001,
                max: 3600.0,
            },
            issues,
        ),
        max_concurrency,
        max_concurrency_per_principal: count(
            name,
            "maxConcurrencyPerPrincipal",
            spec.max_concurrency_per_principal,
            (max_concurrency / 2).max(1),
            1,
            128,
            issues,
        ),
        queue_timeout: seconds(
            name,
            spec.queue_timeout,
            30.0,
            SecondsBound {
                field: "queueTimeout",
                min: 0.001,
                max: 300.0,
            },
            issues,
        ),
        pool_size: count(name, "poolSize", spec.pool_size, 1, 1, 64, issues),
        max_restarts: count(name, "maxRestarts", spec.max_restarts, 5, 0, 100, issues),
        restart_window: seconds(
            name,
            spec.restart_window,
            300.0,
            SecondsBound {
                field: "restartWindow",
                min: 0.001,
                max: 86_400.0,
            },
            issues,
        ),
        breaker_threshold: count(
            name,
            "breakerThreshold",
            spec.breaker_threshold,
            5,
            0,
            100,
            issues,
        ),
        breaker_cooldown: seconds(
            name,
            spec.breaker_cooldown,
            15.0,
            SecondsBound {
                field: "breakerCooldown",
                min: 0.001,
                max: 3600.0,
            },
            issues,
        ),
        relay_timeout: seconds(
            name,
            spec.relay_timeout,
            120.0,
            SecondsBound {
                field: "relayTimeout",
                min: 0.001,
                max: 3600.0,
            },
            issues,
        ),
        session_idle_timeout: seconds(
            name,
            spec.session_idle_timeout,
            300.0,
            SecondsBound {
                field: "sessionIdleTimeout",
                min: 0.001,
                max: 86_400.0,
            },
            issues,
        ),
        max_sessions: count(name, "maxSessions", spec.max_sessions, 64, 1, 1024, issues),
    };
    if spec.pool_size.is_some_and(|p| p > 1) && spec.command.is_some() {
        issues.push(issue(
            name,
            "poolSize",
            "stdio children always use one connection",
        ));
    }
    let mut required_scope = None;
    for scope in &spec.required_scopes {
        match scope.parse::<crate::auth::scope::Scope>() {
            Ok(s) => required_scope = required_scope.max(Some(s)),
            Err(_) => issues.push(issue(
                name,
                "requiredScopes",
                "each scope must be one of discover, delegate, manage",
            )),
        }
    }
    if spec.roots.len() > 64 {
        issues.push(issue(name, "roots", "more than 64 roots"));
    }
    for root in &spec.roots {
        if root.uri.is_empty() || root.uri.len() > 4096 || root.uri.contains(char::is_control) {
            issues.push(issue(
                name,
                "roots",
                "a root uri must be 1..4096 bytes without control characters",
            ));
        }
    }
    if spec.command.is_some()
        && spec
            .auth
            .as_ref()
            .is_some_and(|a| a.kind == AuthKind::OauthClientCredentials)
    {
        issues.push(issue(
            name,
            "auth.type",
            "oauth-client-credentials applies to remote children only",
        ));
    }
    let run_token = run_token(name, spec.auth.as_ref(), issues);
    let isolation = spec.session_isolation.unwrap_or_default();
    let approved_digest = spec.approved_digest.map(|d| d.to_ascii_lowercase());
    if approved_digest
        .as_deref()
        .is_some_and(|d| d.len() != 64 || !d.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        issues.push(issue(
            name,
            "approvedDigest",
            "must be 64 hex digits (a catalog digest as drift status shows it)",
        ));
    }
    let arg = spec.argument_limits.clone().unwrap_or_default();
    let big = |field: &str,
               v: Option<u64>,
               default: u64,
               min: u64,
               max: u64,
               issues: &mut Vec<ConfigIssue>|
     -> u64 {
        let v = v.unwrap_or(default);
        if v < min || v > max {
            issues.push(issue(
                name,
                &format!("argumentLimits.{field}"),
                &format!("{v} is outside {min}..{max}"),
            ));
            return default;
        }
        v
    };
    let argument_limits = super::ArgumentLimits {
        max_bytes: big("maxBytes", arg.max_bytes, 4 << 20, 1024, 64 << 20, issues),
        max_depth: count(
            name,
            "argumentLimits.maxDepth",
            arg.max_depth,
            32,
            1,
            256,
            issues,
        ),
        max_items: big("maxItems", arg.max_items, 100_000, 1, 10_000_000, issues),
        max_string_bytes: big(
            "maxStringBytes",
            arg.max_string_bytes,
            4 << 20,
            1,
            64 << 20,
            issues,
        ),
    };
    let prefix = spec.prefix.as_deref().map(normalize_prefix);
    if let (Some(raw), Some(norm)) = (&spec.prefix, &prefix)
        && !raw.is_empty()
        && norm.is_empty()
    {
        issues.push(issue(
            name,
            "prefix",
            "normalizes to an empty prefix; use \"\" for transparent names",
        ));
    }
    ChildSpec {
        name: name.to_string(),
        display_name: None,
        launch: launch.unwrap_or(Launch::Stdio(StdioSpec {
            command: String::new(),
            args: vec![],
            env: BTreeMap::new(),
            cwd: None,
        })),
        prefix,
        expose: spec.expose.unwrap_or_default(),
        enabled_tools,
        disabled_tools,
        limits,
        allowed_private_hosts: spec.allowed_private_hosts,
        tls_profile: spec.tls_profile,
        required_scope,
        isolation,
        roots: spec.roots,
        argument_limits,
        run_token,
        drift_policy: spec.drift_policy,
        approved_digest,
        category: spec.category,
        hint: spec.hint,
    }
}

/// The client credentials grant of an entry whose `auth.type` is `oauth-client-credentials`.
fn client_credentials(
    name: &str,
    auth: Option<&AuthSpec>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<super::ClientCredentials> {
    let auth = auth.filter(|a| a.kind == AuthKind::OauthClientCredentials)?;
    for (field, set) in [("key", auth.key.is_some()), ("ttl", auth.ttl.is_some())] {
        if set {
            issues.push(issue(
                name,
                &format!("auth.{field}"),
                "belongs to auth type run-token",
            ));
        }
    }
    let token_url = match auth.token_url.as_deref().map(url::Url::parse) {
        Some(Ok(u)) if matches!(u.scheme(), "https" | "http") && u.host_str().is_some() => Some(u),
        Some(_) => {
            issues.push(issue(name, "auth.tokenUrl", "must be an http(s) URL"));
            None
        }
        None => None,
    };
    let client_id = match auth.client_id.as_deref() {
        Some(id) if !id.is_empty() && id.len() <= 1024 && !id.contains(char::is_control) => {
            Some(id.to_string())
        }
        _ => {
            issues.push(issue(
                name,
                "auth.clientId",
                "is required (1..1024 bytes without control characters)",
            ));
            None
        }
    };
    let jwt = auth.token_endpoint_auth == Some(TokenEndpointAuth::PrivateKeyJwt);
    // The credential: the secret, or under private_key_jwt the private key (never both).
    let (field, wrong, value, other) = if jwt {
        (
            "auth.privateKey",
            "auth.clientSecret",
            &auth.private_key,
            &auth.client_secret,
        )
    } else {
        (
            "auth.clientSecret",
            "auth.privateKey",
            &auth.client_secret,
            &auth.private_key,
        )
    };
    if other.is_some() {
        issues.push(issue(
            name,
            wrong,
            "does not belong to this tokenEndpointAuth (clientSecret: client_secret_basic/post; privateKey: private_key_jwt)",
        ));
    }
    let client_secret = secret_ref(name, field, value.as_deref(), issues);
    if auth.key_id.is_some() && !jwt {
        issues.push(issue(
            name,
            "auth.keyId",
            "belongs to tokenEndpointAuth private_key_jwt",
        ));
    }
    if auth
        .key_id
        .as_deref()
        .is_some_and(|k| k.is_empty() || k.len() > 256 || k.contains(char::is_control))
    {
        issues.push(issue(
            name,
            "auth.keyId",
            "must be 1..256 bytes without control characters",
        ));
    }
    for (field, v) in [("scope", &auth.scope), ("audience", &auth.audience)] {
        if v.as_deref()
            .is_some_and(|v| v.len() > 4096 || v.contains(char::is_control))
        {
            issues.push(issue(
                name,
                &format!("auth.{field}"),
                "must be ≤ 4096 bytes without control characters",
            ));
        }
    }
    if auth.token_url.is_some() && token_url.is_none() {
        return None;
    }
    Some(super::ClientCredentials {
        token_url,
        client_id: client_id?,
        client_secret: client_secret?,
        scope: auth.scope.clone(),
        audience: auth.audience.clone(),
        method: auth
            .token_endpoint_auth
            .unwrap_or(TokenEndpointAuth::ClientSecretBasic),
        key_id: auth.key_id.clone(),
    })
}

/// The run-token signer settings of an entry whose `auth.type` is `run-token`.
fn run_token(
    name: &str,
    auth: Option<&AuthSpec>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<super::RunTokenSpec> {
    let auth = auth.filter(|a| a.kind == AuthKind::RunToken)?;
    for (field, set) in [
        ("tokenUrl", auth.token_url.is_some()),
        ("clientId", auth.client_id.is_some()),
        ("clientSecret", auth.client_secret.is_some()),
        ("scope", auth.scope.is_some()),
        ("audience", auth.audience.is_some()),
        ("tokenEndpointAuth", auth.token_endpoint_auth.is_some()),
        ("privateKey", auth.private_key.is_some()),
        ("keyId", auth.key_id.is_some()),
    ] {
        if set {
            issues.push(issue(
                name,
                &format!("auth.{field}"),
                "belongs to auth type oauth-client-credentials",
            ));
        }
    }
    let key = secret_ref(name, "auth.key", auth.key.as_deref(), issues);
    let ttl = auth.ttl.unwrap_or(60.0);
    if !(1.0..=300.0).contains(&ttl) {
        issues.push(issue(name, "auth.ttl", "must be 1..300 seconds"));
    }
    Some(super::RunTokenSpec {
        key: key?,
        ttl: Duration::from_secs_f64(ttl.clamp(1.0, 300.0)),
    })
}

/// A required credential field of `auth`: a secret reference, never an inline value.
fn secret_ref(
    name: &str,
    field: &str,
    raw: Option<&str>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<SecretValue> {
    let reason = match raw.map(secrets::SecretValue::parse) {
        Some(Ok(v)) if v.is_reference() => return Some(v),
        Some(Ok(_)) => {
            "inline credential refused: use a reference (env://NAME, vault://…, secret://…)"
                .to_string()
        }
        Some(Err(e)) => e.to_string(),
        None => "is required".to_string(),
    };
    issues.push(issue(name, field, &reason));
    None
}
