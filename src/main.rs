//! The `graph-os` command line: serve (default), validate, bench.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use graph_os::config::{self, AdmissionContext, Fleet};
use graph_os::mux::{Multiplexer, MuxSettings};
use graph_os::server::http::HttpOptions;

mod bench;
mod doctor;

/// graph-os: an MCP fleet gateway with progressive tool discovery.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve MCP (the default when no subcommand is given).
    Serve(Box<ServeArgs>),
    /// Validate a fleet file: print every problem (server, field, reason); exit 1 if any.
    Validate {
        /// Fleet file (JSON or YAML `mcpServers`).
        #[arg(long, short)]
        config: Option<PathBuf>,
        #[command(flatten)]
        profile: ProfileArgs,
    },
    /// Print the JSON Schema of the fleet file (published as schema/mcp_config.schema.json;
    /// point a file's `$schema` at it for editor completion).
    Schema,
    /// Benchmarks: forwarding (N sequential tools/call, direct vs through graph-os) or
    /// `bench discovery` (find_tools ranking quality and latency).
    Bench(bench::BenchArgs),
    /// Self-check of the binary (protocol floor, config schema, CRD generation); with --config
    /// also of a fleet file: validation, each stdio `command` found on PATH, each remote URL
    /// against the egress policy, the variables each child would get (names only). Exits 1 on
    /// any failure.
    Doctor {
        /// Fleet file to check.
        #[arg(long, short)]
        config: Option<PathBuf>,
        #[command(flatten)]
        profile: ProfileArgs,
    },
    /// Approve a child's changed catalog on a running gateway (drift guard): the digest is the
    /// `pending_digest` of the child's `drift` status. Publishes a new catalog generation.
    Approve {
        /// Server name.
        server: String,
        /// The pending catalog digest (64 hex digits).
        digest: String,
        /// The gateway's base URL.
        #[arg(long, env = "GRAPH_OS_URL", default_value = "http://127.0.0.1:8004")]
        url: String,
        /// Environment variable holding a bearer token with the manage scope.
        #[arg(long, default_value = "GRAPH_OS_TOKEN")]
        token_env: String,
    },
    /// A running gateway's children (state, breaker, in-flight, restarts, tools, last error) and
    /// catalog identity, from its admin API (discover scope).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A running gateway's catalog identity and one row per server (discover scope).
    Catalog {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Re-lists every child of a running gateway and publishes a new catalog generation when
    /// something changed (manage scope).
    Refresh {
        /// Deadline for probing every child, milliseconds (1..120000).
        #[arg(long, default_value_t = 30_000)]
        deadline_ms: u64,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// The listen profile a fleet file is checked for (validate, doctor).
#[derive(clap::Args, Debug, Clone)]
struct ProfileArgs {
    /// Check for a gateway that does not listen on loopback only: loopback child URLs then need
    /// allowedPrivateHosts (the default checks for the local profile).
    #[arg(long)]
    remote_profile: bool,
    /// Gateway-level egress allow-list, as for serve.
    #[arg(
        long = "allowed-private-host",
        env = "GRAPH_OS_ALLOWED_PRIVATE_HOSTS",
        value_delimiter = ','
    )]
    allowed_private_hosts: Vec<String>,
}

impl ProfileArgs {
    /// The admission context of this profile; a bad allow-list entry is an error to print.
    fn context(&self) -> Result<AdmissionContext, String> {
        let allowed = graph_os::net::egress::Allowlist::parse(&self.allowed_private_hosts)
            .map_err(|e| format!("--allowed-private-host: {e}"))?;
        Ok(AdmissionContext {
            egress: graph_os::net::egress::GatewayEgress {
                allow_loopback: !self.remote_profile,
                allowed,
            },
            ..Default::default()
        })
    }
}

/// Where a running gateway's admin API is, for the admin commands.
#[derive(clap::Args, Debug, Clone)]
struct AdminArgs {
    /// The gateway's base URL (its HTTP listener, or --admin-addr of a stdio gateway).
    #[arg(long, env = "GRAPH_OS_URL", default_value = "http://127.0.0.1:8004")]
    url: String,
    /// Environment variable holding a bearer token (never passed on the command line).
    #[arg(long, default_value = "GRAPH_OS_TOKEN")]
    token_env: String,
    /// Print the gateway's JSON answer instead of a table.
    #[arg(long)]
    json: bool,
}

impl AdminArgs {
    fn target(&self) -> graph_os::admin_client::AdminTarget {
        graph_os::admin_client::AdminTarget {
            url: self.url.clone(),
            token_env: self.token_env.clone(),
        }
    }
}

/// Prints an admin answer as JSON or as the table `text` makes of it.
fn print_admin(
    json: bool,
    answer: &serde_json::Value,
    text: fn(&serde_json::Value) -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(answer)?);
    } else {
        print!("{}", text(answer));
    }
    Ok(())
}

#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
enum Transport {
    /// MCP over stdin/stdout (logs on stderr).
    Stdio,
    /// MCP streamable HTTP on /mcp, plus /healthz, /readyz and /metrics.
    StreamableHttp,
}

#[derive(clap::Args, Debug, Clone)]
struct ServeArgs {
    /// Front transport.
    #[arg(long, value_enum, default_value = "stdio")]
    transport: Transport,
    /// Fleet file. Default: $GRAPH_OS_CONFIG, ./mcp_config.json, then $XDG_CONFIG_HOME/graph-os/mcp_config.json.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Interactive discovery budget in seconds (find_tools and load_tools wait this long for starting children).
    #[arg(long, default_value_t = 5.0)]
    discovery_budget: f64,
    /// Listen host for streamable HTTP.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Listen port for streamable HTTP.
    #[arg(long, default_value_t = 8004)]
    port: u16,
    /// Extra Host header value accepted on /mcp (repeatable; loopback names are always accepted).
    #[arg(
        long = "allowed-host",
        env = "GRAPH_OS_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
    /// Extra Origin accepted on /mcp, e.g. https://app.example.com:443 (repeatable).
    #[arg(
        long = "allowed-origin",
        env = "GRAPH_OS_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    allowed_origins: Vec<String>,
    /// With the stdio transport: also serve /healthz, /readyz and /metrics on this address (e.g. 127.0.0.1:9464).
    #[arg(long)]
    admin_addr: Option<std::net::SocketAddr>,
    /// Seconds in-flight calls may run after SIGTERM before the server stops.
    #[arg(long, default_value_t = 30.0)]
    drain_timeout: f64,
    /// State directory (catalog generation record, replica heartbeats, knowledge-graph projection).
    /// Replicas that share it agree on generations. Default: $XDG_STATE_HOME/graph-os/<hash of the fleet file path>.
    #[arg(long, env = "GRAPH_OS_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// This replica's id in the state directory (default: <hostname>-<pid>).
    #[arg(long, env = "GRAPH_OS_REPLICA_ID")]
    replica_id: Option<String>,
    /// Installed discovery models (the semantic tier: scripts/install-semantic-model.py).
    /// Default: $XDG_DATA_HOME/graph-os/models, else ~/.local/share/graph-os/models.
    #[arg(long, env = "GRAPH_OS_MODELS_DIR")]
    models_dir: Option<PathBuf>,
    /// Drift guard for entries without `driftPolicy`: off (default), hold (serve the approved
    /// catalog until a change is approved) or block (hide a changed child until approval).
    #[arg(long, env = "GRAPH_OS_DRIFT_POLICY", value_enum, default_value = "off")]
    drift_policy: graph_os::config::DriftPolicy,
    /// Serve the McpFleet kube://NAMESPACE/NAME instead of a file: watched for hot reloads, with the
    /// catalog generation record and replica heartbeats in Leases of that namespace.
    #[arg(long, env = "GRAPH_OS_FLEET")]
    fleet: Option<String>,
    /// Keep the catalog generation record and replica heartbeats in Leases named after
    /// kube://NAMESPACE/NAME even when the fleet comes from a file (replicas fed by a ConfigMap).
    /// Implied by --fleet kube://…
    #[arg(long, env = "GRAPH_OS_GENERATION_STORE")]
    generation_store: Option<String>,
    /// A bearer token for HTTP callers, as SCOPE=REFERENCE (scope: discover, delegate, manage; reference:
    /// env://NAME or ${NAME}). Repeatable. With any credential source, /mcp requires a credential.
    #[arg(long = "token")]
    tokens: Vec<String>,
    /// OAuth 2.1: accept JWT access tokens from this issuer (its RFC 8414 metadata and JWKS are
    /// fetched and cached). Requires --oauth-audience.
    #[arg(long, env = "GRAPH_OS_OAUTH_ISSUER")]
    oauth_issuer: Option<String>,
    /// OAuth 2.1: this resource's identifier (RFC 8707), e.g. https://graph-os.example/mcp; a token's
    /// `aud` must contain it.
    #[arg(long, env = "GRAPH_OS_OAUTH_AUDIENCE")]
    oauth_audience: Option<String>,
    /// OAuth 2.1: the claim carrying scopes (`scope`, `scp`, `roles`, ...).
    #[arg(long, default_value = "scope")]
    oauth_scope_claim: String,
    /// OAuth 2.1: least seconds between two fetches of the issuer's JWKS (a token with an unknown
    /// `kid` triggers a refetch at most this often).
    #[arg(long, default_value_t = 10.0)]
    oauth_jwks_min_refresh: f64,
    /// OAuth 2.1: map a claim value to a graph-os scope, VALUE=SCOPE (repeatable). Default: the values
    /// discover, delegate, manage (and mcp:discover, ...) map to themselves.
    #[arg(long = "oauth-scope-map")]
    oauth_scope_map: Vec<String>,
    /// Grant this scope (discover or delegate) to /mcp requests without a credential. Without it, and
    /// with any credential source configured, such requests get 401.
    #[arg(long, value_parser = ["discover", "delegate"])]
    anonymous_scope: Option<String>,
    /// Serve streamable HTTP on a non-loopback address without any credential source (every caller
    /// is anonymous with delegate scope). Refused without this flag.
    #[arg(long)]
    allow_unauthenticated: bool,
    /// 2025-era HTTP sessions open at once (all principals).
    #[arg(long, default_value_t = 1000)]
    max_sessions: usize,
    /// 2025-era HTTP sessions open at once per principal.
    #[arg(long, default_value_t = 100)]
    max_sessions_per_principal: usize,
    /// Seconds an HTTP session may stay idle before it is closed.
    #[arg(long, default_value_t = 300.0)]
    session_idle_timeout: f64,
    /// 2026-era principals whose loaded sets are kept (least recently used evicted).
    #[arg(long, default_value_t = 10_000)]
    max_principals: usize,
    /// Largest /mcp request body, bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_request_bytes: usize,
    /// Seconds a whole HTTP request body may take once the gateway reads it (0: no deadline);
    /// later: 408 request-body-timeout.
    #[arg(long, default_value_t = 60.0)]
    request_body_timeout: f64,
    /// Bytes per second an HTTP request body must average after --request-body-grace (0: no
    /// minimum); slower: 408 request-body-too-slow.
    #[arg(long, default_value_t = graph_os::server::listener::DEFAULT_BODY_MIN_RATE)]
    request_body_min_rate: u64,
    /// Seconds of a request body before --request-body-min-rate applies.
    #[arg(long, default_value_t = 10.0)]
    request_body_grace: f64,
    /// HTTP connections open at once (0: no cap); one more gets 503 connections-exhausted.
    #[arg(long, default_value_t = graph_os::server::listener::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// HTTP connections open at once from one client IP address (0: no cap; behind a proxy the
    /// client is the proxy); one more gets 503 peer-connections-exhausted.
    #[arg(long, default_value_t = graph_os::server::listener::DEFAULT_MAX_CONNECTIONS_PER_IP)]
    max_connections_per_ip: usize,
    /// Where HTTP sessions and 2026 principals live: `memory` (this process) or Redis/Valkey for
    /// replicas sharing sessions: redis://[USER@]HOST[:PORT][/DB], rediss://… (TLS), or a secret
    /// reference (env://NAME, ${NAME}, secret://…, vault://…) holding such a URL. A URL written
    /// here must not carry a password: use --session-store-password or a reference.
    #[arg(long, env = "GRAPH_OS_SESSION_STORE", default_value = "memory")]
    session_store: String,
    /// The session store's password, as a secret reference (env://NAME or ${NAME}).
    #[arg(long, env = "GRAPH_OS_SESSION_STORE_PASSWORD")]
    session_store_password: Option<String>,
    /// A TLS profile for rediss:// (a JSON or YAML file holding one profile in the fleet file's
    /// `tlsProfiles` format: caFile/caPem replace the system roots, clientCertFile/clientCertPem
    /// and clientKey for mTLS).
    #[arg(long, env = "GRAPH_OS_SESSION_STORE_TLS_PROFILE")]
    session_store_tls_profile: Option<PathBuf>,
    /// Prefix of every key and channel in the session store.
    #[arg(long, default_value = "graphos:")]
    session_store_prefix: String,
    /// Log line format on stderr: text, or json (one JSON object per line; the container
    /// image's default).
    #[arg(long, env = "GRAPH_OS_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: graph_os::telemetry::LogFormat,
    /// Log one line per HTTP request (target graph_os::access): method, path, status, duration,
    /// principal digest, MCP method and tool name.
    #[arg(long, env = "GRAPH_OS_ACCESS_LOG")]
    access_log: bool,
    /// Export traces over OTLP/HTTP (protobuf) to this collector base URL, e.g.
    /// http://otel-collector:4318 (/v1/traces is appended). The standard OTEL_EXPORTER_OTLP_*
    /// and OTEL_SERVICE_NAME variables also apply; without either, no traces are exported.
    #[arg(long, env = "GRAPH_OS_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    #[command(flatten)]
    egress: EgressArgs,
}

/// Trust boundary II: egress policy, child process groups, secret backends, attestation key.
#[derive(clap::Args, Debug, Clone)]
struct EgressArgs {
    /// A host, *.domain, IP address or CIDR every remote child (and OAuth/Vault) may reach although
    /// it is private or loopback, or over plain http (repeatable; entries add allowedPrivateHosts).
    #[arg(
        long = "allowed-private-host",
        env = "GRAPH_OS_ALLOWED_PRIVATE_HOSTS",
        value_delimiter = ','
    )]
    allowed_private_hosts: Vec<String>,
    /// Seconds a stopped stdio child's process group has between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 5.0)]
    child_stop_grace: f64,
    /// HashiCorp Vault address for vault:// references (https only).
    #[arg(long, env = "VAULT_ADDR")]
    vault_addr: Option<String>,
    /// Vault token as a reference (env://NAME or ${NAME}); alternative to --vault-k8s-role.
    #[arg(long, env = "GRAPH_OS_VAULT_TOKEN")]
    vault_token: Option<String>,
    /// Vault Kubernetes auth: the role to log in as (with the pod's service-account token).
    #[arg(long, env = "GRAPH_OS_VAULT_K8S_ROLE")]
    vault_k8s_role: Option<String>,
    /// Vault Kubernetes auth mount.
    #[arg(long, default_value = "kubernetes")]
    vault_k8s_mount: String,
    /// Service-account token file for Vault Kubernetes auth.
    #[arg(
        long,
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    vault_sa_token_file: PathBuf,
    /// PEM CA bundle trusted for Vault (replaces the system roots).
    #[arg(long, env = "VAULT_CACERT")]
    vault_ca_file: Option<PathBuf>,
    /// Vault Enterprise namespace (X-Vault-Namespace).
    #[arg(long, env = "VAULT_NAMESPACE")]
    vault_namespace: Option<String>,
    /// Seconds a Vault secret is cached when Vault gives no lease duration (0 = never cached).
    #[arg(long, default_value_t = 60.0)]
    vault_cache_ttl: f64,
    /// Key for the attestation of materialized secrets and the freshness identity, as a reference
    /// (env://NAME, ${NAME}); the same on every replica. Default: a process-ephemeral key.
    #[arg(long, env = "GRAPH_OS_ATTESTATION_KEY")]
    attestation_key: Option<String>,
}

/// Applies the Trust-boundary-II settings before any child starts: egress policy, stop grace,
/// the child reaper, MCP_FLEET_SECRET_REFS, secret backends, attestation key.
fn trust_boundary(
    args: &EgressArgs,
    local_profile: bool,
) -> anyhow::Result<graph_os::net::egress::GatewayEgress> {
    use graph_os::net::egress;
    let allowed = egress::Allowlist::parse(&args.allowed_private_hosts)
        .map_err(|e| anyhow::anyhow!("--allowed-private-host: {e}"))?;
    let gateway = egress::GatewayEgress {
        allow_loopback: local_profile,
        allowed,
    };
    egress::set_gateway(gateway.clone());
    if !(0.0..=600.0).contains(&args.child_stop_grace) {
        anyhow::bail!("--child-stop-grace must be 0..600 seconds");
    }
    let grace = std::time::Duration::from_secs_f64(args.child_stop_grace);
    graph_os::transport::stdio::set_stop_grace(grace);
    if let Err(e) = graph_os::transport::reaper::start(grace) {
        tracing::warn!(error = %e, "cannot start the child reaper: children rely on the parent-death signal alone");
    }
    match graph_os::secrets::refs::init_from_env() {
        Ok(0) => {}
        Ok(n) => tracing::info!(entries = n, "MCP_FLEET_SECRET_REFS loaded"),
        Err(e) => tracing::error!(
            "{e}; every env:// alias that needs the mapping fails closed (secret-unavailable)"
        ),
    }
    graph_os::secrets::set_backend(std::sync::Arc::new(
        graph_os::kube::secrets::KubeSecrets::lazy(),
    ));
    if let Some(addr) = &args.vault_addr {
        use graph_os::secrets::vault;
        let addr =
            url::Url::parse(addr).map_err(|_| anyhow::anyhow!("--vault-addr is not a URL"))?;
        let auth = match (&args.vault_token, &args.vault_k8s_role) {
            (Some(t), None) => {
                let value = graph_os::secrets::SecretValue::parse(t)
                    .ok()
                    .filter(|v| v.is_bare_reference() && v.externals().count() == 0)
                    .ok_or_else(|| anyhow::anyhow!("--vault-token must be one env://NAME or ${{NAME}} reference, never a literal token"))?;
                vault::VaultAuth::Token(value)
            }
            (None, Some(role)) => vault::VaultAuth::Kubernetes {
                role: role.clone(),
                mount: args.vault_k8s_mount.clone(),
                jwt_path: args.vault_sa_token_file.clone(),
            },
            (None, None) => anyhow::bail!("--vault-addr needs --vault-token or --vault-k8s-role"),
            (Some(_), Some(_)) => {
                anyhow::bail!("--vault-token and --vault-k8s-role exclude each other")
            }
        };
        if !(0.0..=86_400.0).contains(&args.vault_cache_ttl) {
            anyhow::bail!("--vault-cache-ttl must be 0..86400 seconds");
        }
        let backend = vault::Vault::new(vault::VaultConfig {
            addr,
            auth,
            namespace: args.vault_namespace.clone(),
            ca_file: args.vault_ca_file.clone(),
            cache_ttl: std::time::Duration::from_secs_f64(args.vault_cache_ttl),
        })
        .map_err(|e| anyhow::anyhow!("--vault-addr: {e}"))?;
        graph_os::secrets::set_vault_backend(std::sync::Arc::new(std::sync::Arc::new(backend)));
    }
    if let Some(reference) = &args.attestation_key {
        let value = graph_os::secrets::SecretValue::parse(reference)
            .ok()
            .filter(|v| v.is_bare_reference() && v.externals().count() == 0)
            .ok_or_else(|| {
                anyhow::anyhow!("--attestation-key must be one env://NAME or ${{NAME}} reference")
            })?;
        let key = value
            .resolve(&graph_os::secrets::process_env)
            .map_err(|e| anyhow::anyhow!("--attestation-key: {e}"))?;
        graph_os::config::attest::set_key(key.as_bytes())
            .map_err(|e| anyhow::anyhow!("--attestation-key: {e}"))?;
    }
    Ok(gateway)
}

/// The session store named by `--session-store` (`None`: memory, built by the HTTP front).
async fn session_store(
    args: &ServeArgs,
    opts: &HttpOptions,
    replica: &str,
) -> anyhow::Result<Option<std::sync::Arc<dyn graph_os::mux::session_store::SessionStore>>> {
    use graph_os::secrets::{SecretValue, process_env};
    let raw = args.session_store.trim();
    if raw.eq_ignore_ascii_case("memory") {
        return Ok(None);
    }
    let reference = SecretValue::parse(raw).map_err(|e| anyhow::anyhow!("--session-store: {e}"))?;
    let url = if reference.is_reference() {
        let prefetched = graph_os::secrets::prefetch(std::iter::once(&reference)).await;
        reference
            .resolve(&graph_os::secrets::lookup_with(&prefetched))
            .map_err(|e| anyhow::anyhow!("--session-store: {e}"))?
    } else {
        let parsed = url::Url::parse(raw).map_err(|_| {
            anyhow::anyhow!(
                "--session-store: `memory`, a redis:// or rediss:// URL, or a secret reference"
            )
        })?;
        if parsed.password().is_some() {
            anyhow::bail!(
                "--session-store: the URL carries a password; pass it as --session-store-password env://NAME (or the whole URL as a reference)"
            );
        }
        raw.to_string()
    };
    let scheme = url
        .split("://")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if scheme != "redis" && scheme != "rediss" {
        anyhow::bail!(
            "--session-store: only redis:// and rediss:// (Redis ≥ 6, Valkey) are supported"
        );
    }
    let password = match &args.session_store_password {
        None => None,
        Some(r) => {
            let v = SecretValue::parse(r)
                .ok()
                .filter(|v| v.is_bare_reference() && v.externals().count() == 0)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--session-store-password must be one env://NAME or ${{NAME}} reference"
                    )
                })?;
            Some(
                v.resolve(&process_env)
                    .map_err(|e| anyhow::anyhow!("--session-store-password: {e}"))?,
            )
        }
    };
    let tls = match &args.session_store_tls_profile {
        None => None,
        Some(path) => {
            if scheme != "rediss" {
                anyhow::bail!("--session-store-tls-profile needs a rediss:// URL");
            }
            Some(graph_os::config::tls::redis_certificates(path).await?)
        }
    };
    graph_os::net::crypto::install_crypto();
    let store =
        graph_os::session_redis::RedisSessionStore::open(graph_os::session_redis::RedisConfig {
            url,
            password,
            tls,
            prefix: args.session_store_prefix.clone(),
            replica: replica.to_string(),
            ttl: opts.store_ttl(),
        })
        .map_err(|e| anyhow::anyhow!("--session-store: {e}"))?;
    Ok(Some(store))
}

/// The credential sources of the HTTP front, from the command line.
fn credentials(args: &ServeArgs) -> anyhow::Result<graph_os::auth::Credentials> {
    use graph_os::auth::{Credentials, Scope, oauth};
    let tokens = graph_os::auth::Tokens::from_specs(&args.tokens, &graph_os::secrets::process_env)
        .map_err(|e| anyhow::anyhow!("--token: {e}"))?;
    let oauth = match (&args.oauth_issuer, &args.oauth_audience) {
        (None, None) => None,
        (Some(issuer), Some(audience)) => {
            graph_os::net::crypto::install_crypto();
            let mut config = oauth::OAuthConfig::new(issuer.clone(), audience.clone());
            config.http = Some(
                graph_os::transport::http::client()
                    .map_err(|e| anyhow::anyhow!("--oauth-issuer: HTTP client: {e}"))?,
            );
            config.scope_claim = args.oauth_scope_claim.clone();
            if !(0.1..=3600.0).contains(&args.oauth_jwks_min_refresh) {
                anyhow::bail!("--oauth-jwks-min-refresh must be 0.1..3600 seconds");
            }
            config.min_refresh_interval =
                std::time::Duration::from_secs_f64(args.oauth_jwks_min_refresh);
            for m in &args.oauth_scope_map {
                let (value, scope) = m
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--oauth-scope-map expects VALUE=SCOPE"))?;
                let scope: Scope = scope
                    .parse()
                    .map_err(|e| anyhow::anyhow!("--oauth-scope-map: {e}"))?;
                config.scope_map.push((value.to_string(), scope));
            }
            Some(
                oauth::OAuthValidator::new(config)
                    .map_err(|e| anyhow::anyhow!("--oauth-issuer: {e}"))?,
            )
        }
        _ => anyhow::bail!("--oauth-issuer and --oauth-audience go together"),
    };
    let anonymous = args
        .anonymous_scope
        .as_deref()
        .map(|s| s.parse::<Scope>())
        .transpose()
        .map_err(|e| anyhow::anyhow!("--anonymous-scope: {e}"))?;
    Ok(Credentials {
        tokens,
        oauth,
        anonymous,
    })
}

/// The McpFleet source: its first version, the stream of later ones, and the client.
struct KubeFleet {
    client: kube::Client,
    fleet: graph_os::kube::source::FleetRef,
    initial: Fleet,
    updates: tokio::sync::mpsc::UnboundedReceiver<graph_os::kube::source::Update>,
    observed: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

async fn kube_fleet(reference: &str, ctx: &AdmissionContext) -> anyhow::Result<KubeFleet> {
    graph_os::net::crypto::install_crypto();
    let fleet: graph_os::kube::source::FleetRef = reference
        .parse()
        .map_err(|e| anyhow::anyhow!("--fleet: {e}"))?;
    let client = kube::Client::try_default()
        .await
        .map_err(|e| anyhow::anyhow!("no Kubernetes client: {e}"))?;
    graph_os::secrets::set_backend(std::sync::Arc::new(
        graph_os::kube::secrets::KubeSecrets::new(client.clone()),
    ));
    let observed = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let mut updates =
        graph_os::kube::source::watch(client.clone(), fleet.clone(), ctx.clone(), observed.clone());
    let initial = match tokio::time::timeout(std::time::Duration::from_secs(30), updates.recv())
        .await
    {
        Ok(Some(Ok(f))) => f,
        Ok(Some(Err(issues))) => Fleet {
            issues,
            ..Fleet::empty(fleet.to_string())
        },
        _ => {
            tracing::warn!(fleet = %fleet, "no McpFleet version within 30 s: serving an empty fleet until it arrives");
            Fleet::empty(fleet.to_string())
        }
    };
    Ok(KubeFleet {
        client,
        fleet,
        initial,
        updates,
        observed,
    })
}

/// Whether a listen host is loopback only (the local-development profile).
fn is_loopback_listen(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h == "localhost"
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn default_state_dir(config: Option<&std::path::Path>) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("state")))
        .unwrap_or_else(std::env::temp_dir);
    let key = config
        .map(|p| {
            std::path::absolute(p)
                .unwrap_or_else(|_| p.to_path_buf())
                .display()
                .to_string()
        })
        .unwrap_or_else(|| "no-config".into());
    base.join("graph-os")
        .join(&graph_os::digest::sha256_hex(key.as_bytes())[..16])
}

fn load_fleet(
    path: Option<&std::path::Path>,
    ctx: &AdmissionContext,
) -> Result<Fleet, config::ConfigError> {
    match config::resolve_config_path(path) {
        Some(p) => config::load_file(&p, ctx),
        None => {
            tracing::warn!(
                "no fleet file found (--config, $GRAPH_OS_CONFIG, ./mcp_config.json, XDG config dir): serving an empty fleet"
            );
            Ok(Fleet::empty("none"))
        }
    }
}

fn main() -> ExitCode {
    // First of all, before any secret is read and before any child or helper process starts:
    // non-dumpable, so a child under this uid cannot read this process's environ or memory
    // (src/transport/isolation.rs, docs/threat-model.md). Serving without it is refused.
    if let Err(e) = graph_os::transport::isolation::harden_gateway() {
        eprintln!("graph-os: process-isolation-failed: prctl(PR_SET_DUMPABLE, 0): {e}");
        return ExitCode::FAILURE;
    }
    graph_os::memory::bound_allocator_retention();
    // The child reaper (src/transport/reaper.rs) is this binary started with a hidden argument.
    let mut raw = std::env::args();
    if raw.nth(1).as_deref() == Some(graph_os::transport::reaper::ARG) {
        return ExitCode::from(graph_os::transport::reaper::run(raw.next().as_deref()) as u8);
    }
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Validate { config, profile }) => validate(config, &profile),
        Some(Command::Schema) => {
            print!("{}", config::compat::file_schema_json());
            ExitCode::SUCCESS
        }
        Some(Command::Bench(args)) => {
            graph_os::telemetry::init("warn");
            run_async(bench::run(args))
        }
        Some(Command::Serve(args)) => serve(*args),
        Some(Command::Doctor { config, profile }) => {
            let binary = doctor();
            let fleet = match config {
                Some(path) => match profile.context() {
                    Ok(ctx) => doctor::fleet(&path, &ctx),
                    Err(e) => {
                        println!("doctor: {e}");
                        ExitCode::FAILURE
                    }
                },
                None => ExitCode::SUCCESS,
            };
            if binary == ExitCode::SUCCESS {
                fleet
            } else {
                binary
            }
        }
        Some(Command::Approve {
            server,
            digest,
            url,
            token_env,
        }) => run_async(async move {
            let target = graph_os::admin_client::AdminTarget { url, token_env };
            let answer = target.approve(&server, &digest).await?;
            println!("{}", serde_json::to_string_pretty(&answer)?);
            Ok(())
        }),
        Some(Command::Status { admin }) => run_async(async move {
            let answer = admin.target().status().await?;
            print_admin(admin.json, &answer, graph_os::admin_client::status_table)
        }),
        Some(Command::Catalog { admin }) => run_async(async move {
            let answer = admin.target().catalog().await?;
            print_admin(admin.json, &answer, graph_os::admin_client::catalog_table)
        }),
        Some(Command::Refresh { deadline_ms, admin }) => run_async(async move {
            let answer = admin.target().refresh(deadline_ms).await?;
            println!("{}", serde_json::to_string_pretty(&answer)?);
            Ok(())
        }),
        None => serve(cli.serve),
    }
}

fn run_async(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("graph-os: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Reported>() => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("graph-os: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Checks that this build can serve: the MCP protocol versions it needs, the fleet schema and
/// validation on known documents, the MCP face and the McpFleet CRD. Run by the Dockerfile.
fn doctor() -> ExitCode {
    use graph_os::server::GatewayHandler;
    use rmcp::ServerHandler;
    let mut failures = Vec::new();
    let versions: Vec<String> = rmcp::model::ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .map(|v| v.to_string())
        .collect();
    for needed in ["2025-06-18", "2025-11-25", "2026-07-28"] {
        if !versions.iter().any(|v| v == needed) {
            failures.push(format!(
                "protocol {needed} is not supported by this build (have {versions:?})"
            ));
        }
    }
    let good = serde_json::json!({"mcpServers": {"a": {"command": "x", "env": {"API_TOKEN": "env://A"}}, "b": {"url": "https://b.example/mcp"}}});
    let fleet = config::validate_document(&good, "doctor", &AdmissionContext::default());
    if !fleet.issues.is_empty() || fleet.children.len() != 2 {
        failures.push(format!(
            "fleet validation rejects a known-good document: {:?}",
            fleet.issues
        ));
    }
    let bad =
        serde_json::json!({"mcpServers": {"a": {"command": "x", "env": {"API_TOKEN": "literal"}}}});
    if config::validate_document(&bad, "doctor", &AdmissionContext::default())
        .issues
        .is_empty()
    {
        failures.push("fleet validation admits an inline credential".into());
    }
    if !graph_os::kube::crd::crd_yaml().contains("mcpfleets.graphos.dev") {
        failures.push("the McpFleet CRD does not generate".into());
    }
    let state = std::env::temp_dir().join(format!("graph-os-doctor-{}", std::process::id()));
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(async {
            let settings = MuxSettings {
                state_dir: state.clone(),
                ..Default::default()
            };
            let mux = match Multiplexer::start(Fleet::empty("doctor"), settings) {
                Ok(mux) => mux,
                Err(e) => {
                    failures.push(e.to_string());
                    return;
                }
            };
            let info = GatewayHandler::new(mux.clone()).get_info();
            if info.capabilities.tools.is_none() {
                failures.push("the MCP face advertises no tools capability".into());
            }
            mux.shutdown().await;
        }),
        Err(e) => failures.push(format!("no async runtime: {e}")),
    }
    let _ = std::fs::remove_dir_all(&state);
    if failures.is_empty() {
        println!(
            "graph-os {}: ok (protocols {})",
            env!("CARGO_PKG_VERSION"),
            versions.join(", ")
        );
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("doctor: {f}");
        }
        ExitCode::FAILURE
    }
}

fn validate(path: Option<PathBuf>, profile: &ProfileArgs) -> ExitCode {
    let Some(path) = config::resolve_config_path(path.as_deref()) else {
        eprintln!("graph-os validate: no fleet file found (pass --config PATH)");
        return ExitCode::FAILURE;
    };
    let ctx = match profile.context() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("graph-os validate: {e}");
            return ExitCode::FAILURE;
        }
    };
    match config::load_file(&path, &ctx) {
        Err(e) => {
            println!("{}: {e}", e.code());
            ExitCode::FAILURE
        }
        Ok(fleet) => {
            // Every problem on its own line, with its path in the document as written
            // (`mcpServers.github.env.TOKEN`); warnings (not fatal) after them, on stderr.
            for issue in &fleet.issues {
                println!("{issue} (at {})", fleet.issue_path(issue));
            }
            for warning in &fleet.warnings {
                eprintln!("warning: {}: {}", fleet.issue_path(warning), warning.reason);
            }
            println!(
                "{}: {} servers admitted, {} refused, {} disabled, {} problems",
                path.display(),
                fleet.children.len(),
                fleet.refused.len(),
                fleet.disabled.len(),
                fleet.issues.len()
            );
            if fleet.issues.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    run_async(async move {
        let telemetry = graph_os::telemetry::init_serve(&graph_os::telemetry::Options {
            default_level: "info".into(),
            format: args.log_format,
            access_log: args.access_log,
            otlp_endpoint: args.otlp_endpoint.clone(),
        });
        let served = serve_inner(args).await;
        if let Err(e) = &served {
            // Through the configured log format (a JSON log pipeline sees the fatal error as a
            // record, not a stray text line); the exit code says the rest.
            tracing::error!(error = %format!("{e:#}"), "graph-os cannot serve");
        }
        telemetry.shutdown().await;
        served.map_err(Reported::wrap)
    })
}

/// An error already logged through tracing: `run_async` does not print it a second time.
#[derive(Debug)]
struct Reported(anyhow::Error);

impl Reported {
    fn wrap(e: anyhow::Error) -> anyhow::Error {
        anyhow::Error::new(Reported(e))
    }
}

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Reported {}

async fn serve_inner(args: ServeArgs) -> anyhow::Result<()> {
    {
        // What graph-os is reached at: a child URL pointing at it is refused
        // (`config::points_at_self`): the listen addresses with their port, the hosts it is
        // reached by (--allowed-host, the advertised OAuth resource) on any port.
        let mut self_addresses = Vec::new();
        let mut self_hosts = Vec::new();
        let authority = |host: &str, port: u16| {
            if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        };
        if args.transport == Transport::StreamableHttp {
            let port = args.port;
            self_addresses.push(authority(&args.host, port));
            if matches!(args.host.as_str(), "0.0.0.0" | "::" | "[::]") {
                self_addresses
                    .extend(["127.0.0.1", "localhost", "::1"].map(|h| authority(h, port)));
            }
            self_hosts.extend(args.allowed_hosts.iter().cloned());
            if let Some(host) = args
                .oauth_audience
                .as_deref()
                .and_then(|a| url::Url::parse(a).ok())
                .and_then(|u| u.host_str().map(str::to_string))
            {
                self_hosts.push(host);
            }
        }
        if let Some(a) = args.admin_addr {
            self_addresses.push(a.to_string());
        }
        // Local-development profile: every address graph-os listens on is loopback (stdio is local).
        let local_profile = (args.transport == Transport::Stdio || is_loopback_listen(&args.host))
            && args.admin_addr.is_none_or(|a| a.ip().is_loopback());
        let egress = trust_boundary(&args.egress, local_profile)?;
        let ctx = AdmissionContext {
            self_addresses,
            self_hosts,
            egress,
            ..Default::default()
        };
        let kube_source = match &args.fleet {
            Some(r) => Some(kube_fleet(r, &ctx).await?),
            None => None,
        };
        let fleet = match &kube_source {
            Some(k) => k.initial.clone(),
            None => load_fleet(args.config.as_deref(), &ctx)?,
        };
        for issue in &fleet.issues {
            tracing::warn!(server = %issue.server, field = %issue.field, "config problem: {}", issue.reason);
        }
        tracing::info!(source = %fleet.source, servers = fleet.children.len(), "serving fleet");
        if !(0.1..=60.0).contains(&args.discovery_budget) {
            anyhow::bail!("--discovery-budget must be 0.1..60 seconds");
        }
        let settings = MuxSettings {
            discovery_budget: std::time::Duration::from_secs_f64(args.discovery_budget),
            ..Default::default()
        };
        let config_path =
            config::resolve_config_path(args.config.as_deref()).filter(|p| p.is_file());
        let credentials = std::sync::Arc::new(credentials(&args)?);
        if args.transport == Transport::StreamableHttp
            && !credentials.configured()
            && !is_loopback_listen(&args.host)
            && !args.allow_unauthenticated
        {
            anyhow::bail!(
                "refusing to serve {} without a credential source: every caller would be anonymous with \
                 delegate scope. Configure --token SCOPE=env://NAME or --oauth-issuer/--oauth-audience, \
                 or pass --allow-unauthenticated to accept that",
                args.host
            );
        }
        if let Some(oauth) = &credentials.oauth {
            let oauth = oauth.clone();
            tokio::spawn(async move {
                if let Err(e) = oauth.warm().await {
                    tracing::warn!(code = e.code(), "OAuth issuer not reachable yet: {e}");
                }
            });
        }
        let mut settings = settings;
        settings.state_dir = args
            .state_dir
            .clone()
            .unwrap_or_else(|| default_state_dir(config_path.as_deref()));
        settings.drift_policy = args.drift_policy;
        settings.models_dir = args
            .models_dir
            .clone()
            .or_else(graph_os::discovery::semantic::default_models_dir);
        settings.replica_id = args.replica_id.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "host".into());
            format!("{host}-{}", std::process::id())
        });
        tracing::info!(state_dir = %settings.state_dir.display(), replica = %settings.replica_id, "catalog state");
        let mut status_writer = None;
        let (mux, config_path) = match kube_source {
            Some(k) => {
                let store = graph_os::kube::lease_store::LeaseStore::new(
                    kube::Api::namespaced(k.client.clone(), &k.fleet.namespace),
                    &k.fleet.name,
                );
                let mux = Multiplexer::start_with_store(
                    fleet,
                    settings,
                    Some(std::sync::Arc::new(store)),
                )?;
                let reload = mux.clone();
                let mut updates = k.updates;
                tokio::spawn(async move {
                    while let Some(update) = updates.recv().await {
                        let _ = reload.reload(update).await;
                    }
                });
                let writer =
                    graph_os::kube::status::spawn(k.client, k.fleet, mux.clone(), k.observed);
                status_writer = Some(writer);
                (mux, None)
            }
            None => {
                let store: Option<std::sync::Arc<dyn graph_os::catalog::store::GenerationStore>> =
                    match &args.generation_store {
                        Some(r) => {
                            graph_os::net::crypto::install_crypto();
                            let at: graph_os::kube::source::FleetRef = r
                                .parse()
                                .map_err(|e| anyhow::anyhow!("--generation-store: {e}"))?;
                            let client = kube::Client::try_default()
                                .await
                                .map_err(|e| anyhow::anyhow!("no Kubernetes client: {e}"))?;
                            Some(std::sync::Arc::new(
                                graph_os::kube::lease_store::LeaseStore::new(
                                    kube::Api::namespaced(client, &at.namespace),
                                    &at.name,
                                ),
                            ))
                        }
                        None => None,
                    };
                (
                    Multiplexer::start_with_store(fleet, settings, store)?,
                    config_path,
                )
            }
        };
        // Hot reload: keep the watcher alive for the life of the server.
        let _watcher = match &config_path {
            Some(path) => match config::watch::watch(path, ctx.clone()) {
                Ok((watcher, mut updates)) => {
                    let mux = mux.clone();
                    tokio::spawn(async move {
                        while let Some(update) = updates.recv().await {
                            let _ = mux.reload(update).await;
                        }
                    });
                    Some(watcher)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch the fleet file; hot reload is off");
                    None
                }
            },
            None => None,
        };
        let drain_timeout =
            std::time::Duration::from_secs_f64(args.drain_timeout.clamp(0.0, 3600.0));
        let seconds = |s: f64| {
            std::time::Duration::try_from_secs_f64(s.clamp(0.0, 86_400.0)).unwrap_or_default()
        };
        let listener = graph_os::server::listener::Limits {
            body: graph_os::server::listener::BodyDeadline {
                timeout: seconds(args.request_body_timeout),
                min_rate: args.request_body_min_rate,
                grace: seconds(args.request_body_grace),
            },
            max_connections: args.max_connections,
            max_connections_per_ip: args.max_connections_per_ip,
            ..Default::default()
        };
        let served = match args.transport {
            Transport::Stdio => match args.admin_addr {
                None => {
                    // One stdio client and no other listener: every child connection is its own.
                    graph_os::child::serve_one_front();
                    graph_os::server::serve_stdio(mux).await
                }
                Some(addr) => {
                    let opts = HttpOptions {
                        drain_timeout,
                        serve_mcp: false,
                        listener,
                        credentials: credentials.clone(),
                        ..HttpOptions::new(addr)
                    };
                    let admin = tokio::spawn(graph_os::server::http::serve(mux.clone(), opts));
                    let result = graph_os::server::serve_stdio(mux).await;
                    admin.abort();
                    result
                }
            },
            Transport::StreamableHttp => {
                let addr = format!("{}:{}", args.host, args.port)
                    .parse::<std::net::SocketAddr>()
                    .or_else(|_| format!("[{}]:{}", args.host, args.port).parse())?;
                if !(1.0..=86_400.0).contains(&args.session_idle_timeout) {
                    anyhow::bail!("--session-idle-timeout must be 1..86400 seconds");
                }
                let opts = HttpOptions {
                    allowed_hosts: args.allowed_hosts.clone(),
                    allowed_origins: args.allowed_origins.clone(),
                    drain_timeout,
                    serve_mcp: true,
                    credentials: credentials.clone(),
                    sessions: graph_os::server::sessions::SessionLimits {
                        max_sessions: args.max_sessions.max(1),
                        max_per_principal: args.max_sessions_per_principal.max(1),
                        idle: std::time::Duration::from_secs_f64(args.session_idle_timeout),
                        ..Default::default()
                    },
                    max_principals: args.max_principals.max(1),
                    max_request_bytes: args.max_request_bytes.max(64 << 10),
                    listener,
                    ..HttpOptions::new(addr)
                };
                let opts = HttpOptions {
                    session_store: session_store(&args, &opts, mux.instance_id()).await?,
                    ..opts
                };
                graph_os::server::http::serve(mux, opts).await
            }
        };
        // Hand the status Lease over at once instead of letting it expire.
        if let Some(writer) = status_writer {
            writer.stop().await;
        }
        served
    }
}
