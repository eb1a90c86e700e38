//! Fleet configuration: the ecosystem's `mcpServers` file (JSON or YAML) plus graph-os extensions.
//!
//! Design note: the file is parsed in two steps. The outer document only has to be a map of
//! server names to JSON objects; each entry is then validated on its own into a [`ChildSpec`].
//! A bad entry therefore produces [`ConfigIssue`]s naming the server and field and is left out,
//! while every good entry still serves. All defaults and bounds live in this module.

pub mod attest;
pub mod compat;
pub mod material;
mod spec;
pub mod tls;
pub mod urls;
pub mod watch;

pub use spec::{
    ArgumentLimitsSpec, AuthKind, AuthSpec, DriftPolicy, ExposeMode, RootSpec, ServerSpec,
    SessionIsolation, TokenEndpointAuth, TransportKind, points_at_self,
};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::secrets::{self, SecretValue};

/// Largest fleet file accepted (bytes).
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Largest number of servers in one fleet.
pub const MAX_SERVERS: usize = 512;
/// The name graph-os registers under; a child of this name is never admitted.
pub const SELF_NAME: &str = "graph-os";
/// Stable code of an entry refused because it is graph-os itself (its reason starts with it).
pub const SELF_REGISTRATION_REFUSED: &str = "self-registration-refused";

/// One problem found while loading a fleet: which server, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigIssue {
    /// Server name, or `""` for document-level problems.
    pub server: String,
    /// Field path inside the entry (camelCase as written in the file), or `""`.
    pub field: String,
    /// Human-readable reason; never contains a secret value.
    pub reason: String,
}

impl std::fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.server.is_empty(), self.field.is_empty()) {
            (true, true) => write!(f, "{}", self.reason),
            (true, false) => write!(f, "{}: {}", self.field, self.reason),
            (false, true) => write!(f, "server '{}': {}", self.server, self.reason),
            (false, false) => write!(
                f,
                "server '{}' field '{}': {}",
                self.server, self.field, self.reason
            ),
        }
    }
}

/// Errors that stop a fleet file from loading at all (the document itself is unusable).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read fleet file {path}: {error}")]
    Read {
        /// Path that failed.
        path: PathBuf,
        /// Underlying I/O error (said in the message, not chained: printed once).
        error: std::io::Error,
    },
    /// The document is not usable (size, syntax, shape).
    #[error("fleet file {path}: {reason}")]
    Invalid {
        /// Path of the document.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl ConfigError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::Read { .. } => "config-unreadable",
            ConfigError::Invalid { .. } => "config-invalid",
        }
    }
}

/// Stdio launch declaration of a child.
#[derive(Debug, Clone, PartialEq)]
pub struct StdioSpec {
    /// Executable.
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Declared environment (values may be secret references, resolved at spawn time).
    pub env: BTreeMap<String, SecretValue>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
}

/// Remote (streamable HTTP or SSE) declaration of a child.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteSpec {
    /// Endpoint URL, parsed once (`urls::parse_remote_url`): validation and connection use it.
    pub url: url::Url,
    /// Selected transport.
    pub transport: TransportKind,
    /// Declared headers (values may be secret references).
    pub headers: BTreeMap<String, SecretValue>,
    /// `allowedPrivateHosts`, parsed (the egress policy adds the gateway's list at connect time).
    pub allowed_private_hosts: crate::net::egress::Allowlist,
    /// The named TLS profile, resolved from `tlsProfiles`.
    pub tls: Option<std::sync::Arc<tls::TlsProfile>>,
    /// `auth: oauth-client-credentials`: the grant whose access token authenticates requests.
    pub client_credentials: Option<Box<ClientCredentials>>,
}

/// An OAuth 2.1 client credentials grant toward a remote child (validated `auth`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientCredentials {
    /// Token endpoint (`None`: discovered from the child's RFC 9728 metadata and its
    /// authorization server's RFC 8414 metadata at connect time).
    pub token_url: Option<url::Url>,
    /// Client id.
    pub client_id: String,
    /// The credential (a reference, resolved at the child boundary): the client secret, or
    /// under `private_key_jwt` the PKCS#8 PEM private key.
    pub client_secret: SecretValue,
    /// Requested scope.
    pub scope: Option<String>,
    /// Audience / RFC 8707 resource.
    pub audience: Option<String>,
    /// How the client authenticates at the token endpoint.
    pub method: TokenEndpointAuth,
    /// `kid` of a `private_key_jwt` assertion.
    pub key_id: Option<String>,
}

/// `auth: run-token`: graph-os signs a short-lived assertion of the caller for every call.
#[derive(Debug, Clone, PartialEq)]
pub struct RunTokenSpec {
    /// HMAC-SHA256 key (a reference, resolved at the child boundary).
    pub key: SecretValue,
    /// Lifetime of one token.
    pub ttl: Duration,
}

/// How a child is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    /// A local process over stdio.
    Stdio(StdioSpec),
    /// A remote server.
    Remote(RemoteSpec),
}

/// Per-child runtime limits, all defaulted and bounds-checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Deadline for the `initialize` handshake.
    pub initialization_timeout: Duration,
    /// Deadline for one whole catalog probe.
    pub probe_timeout: Duration,
    /// Deadline for one tool call.
    pub call_timeout: Duration,
    /// Concurrent calls admitted.
    pub max_concurrency: u32,
    /// Concurrent calls of one principal admitted (its fair share of `max_concurrency`).
    pub max_concurrency_per_principal: u32,
    /// How long a call may wait for a slot.
    pub queue_timeout: Duration,
    /// Connections for remote children (stdio is always 1).
    pub pool_size: u32,
    /// Restarts allowed per window (0 = never restart).
    pub max_restarts: u32,
    /// Restart budget window.
    pub restart_window: Duration,
    /// Consecutive failures that open the breaker (0 = off).
    pub breaker_threshold: u32,
    /// How long the breaker stays open.
    pub breaker_cooldown: Duration,
    /// How long a relayed child→client request may wait for the client.
    pub relay_timeout: Duration,
    /// `per-session` connections idle this long are closed.
    pub session_idle_timeout: Duration,
    /// Most `per-session` connections open at once.
    pub max_sessions: u32,
}

/// Bounds on forwarded `tools/call` arguments (checked before anything is sent to the child).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgumentLimits {
    /// Serialized size in bytes.
    pub max_bytes: u64,
    /// Nesting depth.
    pub max_depth: u32,
    /// JSON values in total.
    pub max_items: u64,
    /// Bytes of one string.
    pub max_string_bytes: u64,
}

impl Default for ArgumentLimits {
    fn default() -> Self {
        ArgumentLimits {
            max_bytes: 4 << 20,
            max_depth: 32,
            max_items: 100_000,
            max_string_bytes: 4 << 20,
        }
    }
}

/// A validated fleet member, ready for the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildSpec {
    /// Server name (the map key in `mcpServers`, normalized: see [`compat::normalize_server_name`]).
    pub name: String,
    /// The key as written in the file when normalization changed it (`"My Server"` for
    /// `My-Server`), for display.
    pub display_name: Option<String>,
    /// How to reach it.
    pub launch: Launch,
    /// Explicit prefix override (already normalized); `Some("")` = transparent names.
    pub prefix: Option<String>,
    /// Lazy (load on demand) or eager (loaded for every session).
    pub expose: ExposeMode,
    /// Allowlist globs over original tool names (`None` = all).
    pub enabled_tools: Option<Vec<glob::Pattern>>,
    /// Denylist globs applied after the allowlist.
    pub disabled_tools: Vec<glob::Pattern>,
    /// Runtime limits.
    pub limits: Limits,
    /// Hosts allowed despite being private or plain http.
    pub allowed_private_hosts: Vec<String>,
    /// Named TLS profile.
    pub tls_profile: Option<String>,
    /// The scope a caller must hold to see and use this child (the largest of `requiredScopes`).
    pub required_scope: Option<crate::auth::scope::Scope>,
    /// Whether sessions share the child connection.
    pub isolation: SessionIsolation,
    /// Roots answered for the child when no client can.
    pub roots: Vec<RootSpec>,
    /// Bounds on forwarded tool-call arguments.
    pub argument_limits: ArgumentLimits,
    /// `auth: run-token`: sign a caller assertion into every call.
    pub run_token: Option<RunTokenSpec>,
    /// What is served while the catalog differs from the approved one (`None`: the gateway's
    /// default, `--drift-policy`).
    pub drift_policy: Option<DriftPolicy>,
    /// The pinned approved catalog digest (lowercase hex), if any.
    pub approved_digest: Option<String>,
    /// Free-form grouping shown by list_catalog.
    pub category: Option<String>,
    /// One-line hint shown by list_catalog.
    pub hint: Option<String>,
}

impl ChildSpec {
    /// Whether an original tool name passes `enabledTools` / `disabledTools`.
    pub fn tool_enabled(&self, original: &str) -> bool {
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: false,
            require_literal_leading_dot: false,
        };
        if let Some(allow) = &self.enabled_tools
            && !allow.iter().any(|p| p.matches_with(original, opts))
        {
            return false;
        }
        !self
            .disabled_tools
            .iter()
            .any(|p| p.matches_with(original, opts))
    }

    /// Whether the child is a stdio process.
    pub fn is_stdio(&self) -> bool {
        matches!(self.launch, Launch::Stdio(_))
    }
}

/// A loaded fleet: the admitted children plus every issue found.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    /// Where the fleet came from (for messages).
    pub source: String,
    /// Admitted children by name (sorted).
    pub children: BTreeMap<String, ChildSpec>,
    /// Problems: each refused entry or field.
    pub issues: Vec<ConfigIssue>,
    /// Names of entries that were refused.
    pub refused: Vec<String>,
    /// Names of entries that are `disabled: true`.
    pub disabled: Vec<String>,
    /// SHA-256 of the canonical JSON of the admitted entries as written (references only).
    pub revision: String,
    /// Non-fatal findings (keys without effect, normalized names, unset references).
    pub warnings: Vec<ConfigIssue>,
    /// Normalized server name → the key as written, where they differ.
    pub display_names: BTreeMap<String, String>,
    /// The top-level key the servers were read from (`mcpServers`, or VS Code's `servers`).
    pub servers_key: String,
}

impl Fleet {
    /// `N servers admitted, N refused, N disabled, N problems`, each noun in its number.
    pub fn summary(&self) -> String {
        let count =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        format!(
            "{} admitted, {} refused, {} disabled, {}",
            count(self.children.len(), "server", "servers"),
            self.refused.len(),
            self.disabled.len(),
            count(self.issues.len(), "problem", "problems"),
        )
    }

    /// The path of an issue in the document as written: `mcpServers.github.env.TOKEN`,
    /// `servers.My Server.args[1]`, `inputs[0].id`.
    pub fn issue_path(&self, issue: &ConfigIssue) -> String {
        if issue.server.is_empty() {
            return issue.field.clone();
        }
        let key = if self.servers_key.is_empty() {
            "mcpServers"
        } else {
            &self.servers_key
        };
        let name = self
            .display_names
            .get(&issue.server)
            .unwrap_or(&issue.server);
        if issue.field.is_empty() {
            format!("{key}.{name}")
        } else {
            format!("{key}.{name}.{}", issue.field)
        }
    }
}

impl Fleet {
    /// An empty fleet (no config found).
    pub fn empty(source: impl Into<String>) -> Self {
        let revision = crate::digest::sha256_hex(b"{}");
        Fleet {
            source: source.into(),
            revision,
            ..Default::default()
        }
    }
}

/// Options affecting admission that come from the running gateway rather than the file.
#[derive(Debug, Clone, Default)]
pub struct AdmissionContext {
    /// Addresses graph-os itself listens on (`host:port`), for the self-registration guard
    /// ([`points_at_self`]).
    pub self_addresses: Vec<String>,
    /// Hosts graph-os is reached by (`--allowed-host`, the advertised OAuth resource): a URL at
    /// one of them is graph-os on any port.
    pub self_hosts: Vec<String>,
    /// Gateway-level egress settings (loopback profile, `--allowed-private-host`).
    pub egress: crate::net::egress::GatewayEgress,
    /// The document's `tlsProfiles` (filled by [`validate_document`]).
    pub tls_profiles: tls::TlsProfiles,
}

/// Reads and validates a fleet file (JSON or YAML, chosen by extension, else by content).
pub fn load_file(path: &Path, ctx: &AdmissionContext) -> Result<Fleet, ConfigError> {
    let meta = std::fs::metadata(path).map_err(|error| ConfigError::Read {
        path: path.into(),
        error,
    })?;
    if !meta.is_file() {
        return Err(ConfigError::Invalid {
            path: path.into(),
            reason: "not a regular file".into(),
        });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ConfigError::Invalid {
            path: path.into(),
            reason: format!(
                "file is {} bytes; the limit is {MAX_FILE_BYTES}",
                meta.len()
            ),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.into(),
        error,
    })?;
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    );
    let doc = parse_document(&text, yaml).map_err(|reason| ConfigError::Invalid {
        path: path.into(),
        reason,
    })?;
    let origin = compat::Origin {
        file: Some(path),
        env: &compat::process_env,
    };
    let fleet = validate_document_at(&doc, &path.display().to_string(), origin, ctx);
    for w in &fleet.warnings {
        // Warnings name keys and references, never values.
        tracing::warn!(path = %fleet.issue_path(w), "fleet file: {}", w.reason);
    }
    Ok(fleet)
}

/// Parses a fleet document into a JSON value: JSON with comments and trailing commas (JSONC),
/// or YAML through serde-saphyr; a UTF-8 byte order mark is ignored. A JSON syntax error names
/// its line and column.
pub fn parse_document(text: &str, yaml: bool) -> Result<serde_json::Value, String> {
    if yaml {
        serde_saphyr::from_str::<serde_json::Value>(compat::strip_bom(text))
            .map_err(|e| format!("invalid YAML: {e}"))
    } else {
        compat::parse_jsonc(text)
    }
}

/// Validates a whole document; never fails: problems become issues and refused entries.
/// (No file: `${workspaceFolder}` and relative `envFile` paths are refused.)
pub fn validate_document(doc: &serde_json::Value, source: &str, ctx: &AdmissionContext) -> Fleet {
    validate_document_at(doc, source, compat::Origin::none(), ctx)
}

/// [`validate_document`] for a document read from `origin` (its file and environment).
pub fn validate_document_at(
    doc: &serde_json::Value,
    source: &str,
    origin: compat::Origin<'_>,
    ctx: &AdmissionContext,
) -> Fleet {
    let mut fleet = Fleet::empty(source);
    let Some(top) = doc.as_object() else {
        fleet.issues.push(issue(
            "",
            "",
            "the document must be an object with an `mcpServers` map",
        ));
        return fleet;
    };
    const TOP_LEVEL: &[&str] = &["mcpServers", "servers", "inputs", "$schema", "tlsProfiles"];
    for key in top.keys() {
        if !TOP_LEVEL.contains(&key.as_str()) {
            let reason = match spec::did_you_mean(key, TOP_LEVEL) {
                Some(near) => format!("unknown top-level key (did you mean '{near}'?)"),
                None => "unknown top-level key".to_string(),
            };
            fleet.issues.push(issue("", key, &reason));
        }
    }
    let servers_key = if top.contains_key("mcpServers") {
        if top.contains_key("servers") {
            fleet.issues.push(issue(
                "",
                "servers",
                "both `mcpServers` and `servers` (its VS Code alias) are present: `servers` is ignored; keep one",
            ));
        }
        "mcpServers"
    } else if top.contains_key("servers") {
        "servers"
    } else {
        "mcpServers"
    };
    fleet.servers_key = servers_key.to_string();
    let inputs = compat::parse_inputs(top.get("inputs"), &mut fleet.issues, &mut fleet.warnings);
    // tlsProfiles (src/config/tls.rs): validated first, entries refer to them by name.
    let ctx = &AdmissionContext {
        tls_profiles: tls::parse_profiles(top.get("tlsProfiles"), &mut fleet.issues),
        ..ctx.clone()
    };
    let servers = match top.get(servers_key) {
        None => return fleet,
        Some(serde_json::Value::Object(m)) => m,
        Some(_) => {
            fleet.issues.push(issue(
                "",
                servers_key,
                "must be an object mapping server names to entries",
            ));
            return fleet;
        }
    };
    if servers.len() > MAX_SERVERS {
        fleet.issues.push(issue(
            "",
            servers_key,
            &format!("{} servers; the limit is {MAX_SERVERS}", servers.len()),
        ));
        return fleet;
    }
    // Names: normalized deterministically; two keys normalizing to one name are both refused.
    let mut by_name: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for written in servers.keys() {
        by_name
            .entry(compat::normalize_server_name(written))
            .or_default()
            .push(written);
    }
    let mut admitted: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
    for (name, written) in &by_name {
        if written.len() > 1 {
            for w in written {
                let others: Vec<String> = written
                    .iter()
                    .filter(|o| *o != w)
                    .map(|o| format!("'{o}'"))
                    .collect();
                fleet.issues.push(issue(
                    w,
                    "",
                    &format!(
                        "normalizes to the server name '{name}', as does {}: rename one",
                        others.join(", ")
                    ),
                ));
                fleet.refused.push((*w).clone());
            }
            continue;
        }
        let written = written[0];
        let entry = &servers[written];
        if name != written {
            fleet.display_names.insert(name.clone(), written.clone());
            fleet.warnings.push(issue(
                name,
                "",
                &format!("the server name '{written}' is served as '{name}' (normalized)"),
            ));
        }
        let mut issues = Vec::new();
        let prepared = compat::prepare_entry(
            name,
            entry,
            origin,
            &inputs,
            &mut issues,
            &mut fleet.warnings,
        );
        // A field compatibility refused is reported once (not again by validation).
        let refused_fields: std::collections::BTreeSet<String> = issues
            .iter()
            .map(|i| i.field.split(['[', '.']).next().unwrap_or("").to_string())
            .collect();
        let mut later = Vec::new();
        let admission = spec::validate_entry(name, &prepared.entry, ctx, &mut later);
        issues.extend(later.into_iter().filter(|i| {
            let root = i.field.split(['[', '.']).next().unwrap_or("");
            !refused_fields.contains(root)
        }));
        match admission {
            spec::Admission::Admitted(mut child) if issues.is_empty() => {
                child.display_name = (name != written).then(|| written.clone());
                if let Launch::Stdio(s) = &mut child.launch {
                    for (k, v) in prepared.env_file {
                        // `env` in the entry wins over its envFile.
                        s.env.entry(k).or_insert_with(|| SecretValue::literal(v));
                    }
                    if s.env.len() > 256 {
                        issues.push(issue(name, "envFile", "more than 256 variables with env"));
                    }
                }
                if issues.is_empty() {
                    admitted.insert(name.clone(), entry.clone());
                    fleet.children.insert(name.clone(), *child);
                } else {
                    fleet.refused.push(name.clone());
                }
            }
            spec::Admission::Disabled if issues.is_empty() => fleet.disabled.push(name.clone()),
            _ => fleet.refused.push(name.clone()),
        }
        fleet.issues.extend(issues);
    }
    if let Some(profiles) = top.get("tlsProfiles") {
        // Not a server name (those match [A-Za-z0-9_.-]); absent documents hash as before.
        admitted.insert("$tlsProfiles".into(), profiles.clone());
    }
    fleet.revision = crate::digest::sha256_hex(
        crate::digest::canonical_json(&serde_json::Value::Object(admitted)).as_bytes(),
    );
    fleet
}

/// Resolves which fleet file to use: `--config`, `$GRAPH_OS_CONFIG`, `./mcp_config.json`, then
/// `$XDG_CONFIG_HOME/graph-os/mcp_config.json` (or `~/.config/...`). `None` = no file found.
pub fn resolve_config_path(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("GRAPH_OS_CONFIG").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let local = PathBuf::from("mcp_config.json");
    if local.is_file() {
        return Some(local);
    }
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    let candidate = xdg.join("graph-os").join("mcp_config.json");
    candidate.is_file().then_some(candidate)
}

pub(crate) fn issue(server: &str, field: &str, reason: &str) -> ConfigIssue {
    ConfigIssue {
        server: server.into(),
        field: field.into(),
        reason: reason.into(),
    }
}

/// True when a header or env name looks like it carries a credential.
pub fn is_sensitive_name(name: &str) -> bool {
    secrets::is_sensitive_name(name)
}

#[cfg(test)]
mod tests;
