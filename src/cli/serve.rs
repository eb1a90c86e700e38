//! `graph-os serve`: its flags, and the plain [`gateway::Config`] they become. The flags'
//! defaults are the gateway's own (`gateway::defaults` and its neighbours), written once.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::ValueEnum;
use graph_os::gateway::{self, defaults};

#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
pub enum Transport {
    /// MCP over stdin/stdout (logs on stderr).
    Stdio,
    /// MCP streamable HTTP on /mcp, plus /healthz, /readyz and /metrics.
    StreamableHttp,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Front transport.
    #[arg(long, value_enum, default_value = "stdio")]
    transport: Transport,
    /// Fleet file. Default: $GRAPH_OS_CONFIG, ./mcp_config.json, then $XDG_CONFIG_HOME/graph-os/mcp_config.json.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Interactive discovery budget in seconds (find_tools and load_tools wait this long for starting children).
    #[arg(long, default_value_t = defaults::DISCOVERY_BUDGET)]
    discovery_budget: f64,
    /// Listen host for streamable HTTP.
    #[arg(long, default_value = defaults::HOST)]
    host: String,
    /// Listen port for streamable HTTP.
    #[arg(long, default_value_t = defaults::PORT)]
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
    #[arg(long, default_value_t = defaults::DRAIN_TIMEOUT)]
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
    #[arg(long, default_value = defaults::OAUTH_SCOPE_CLAIM)]
    oauth_scope_claim: String,
    /// OAuth 2.1: least seconds between two fetches of the issuer's JWKS (a token with an unknown
    /// `kid` triggers a refetch at most this often).
    #[arg(long, default_value_t = defaults::OAUTH_JWKS_MIN_REFRESH)]
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
    #[arg(long, default_value_t = defaults::MAX_SESSIONS)]
    max_sessions: usize,
    /// 2025-era HTTP sessions open at once per principal.
    #[arg(long, default_value_t = defaults::MAX_SESSIONS_PER_PRINCIPAL)]
    max_sessions_per_principal: usize,
    /// Seconds an HTTP session may stay idle before it is closed.
    #[arg(long, default_value_t = defaults::SESSION_IDLE_TIMEOUT)]
    session_idle_timeout: f64,
    /// 2026-era principals whose loaded sets are kept (least recently used evicted).
    #[arg(long, default_value_t = defaults::MAX_PRINCIPALS)]
    max_principals: usize,
    /// Largest /mcp request body, bytes.
    #[arg(long, default_value_t = graph_os::server::http::DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Seconds a whole HTTP request body may take once the gateway reads it (0: no deadline);
    /// later: 408 request-body-timeout.
    #[arg(long, default_value_t = defaults::REQUEST_BODY_TIMEOUT)]
    request_body_timeout: f64,
    /// Bytes per second an HTTP request body must average after --request-body-grace (0: no
    /// minimum); slower: 408 request-body-too-slow.
    #[arg(long, default_value_t = graph_os::server::listener::DEFAULT_BODY_MIN_RATE)]
    request_body_min_rate: u64,
    /// Seconds of a request body before --request-body-min-rate applies.
    #[arg(long, default_value_t = defaults::REQUEST_BODY_GRACE)]
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
    #[arg(long, env = "GRAPH_OS_SESSION_STORE", default_value = defaults::SESSION_STORE)]
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
    #[arg(long, default_value = defaults::SESSION_STORE_PREFIX)]
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
pub struct EgressArgs {
    /// A host, *.domain, IP address or CIDR every remote child (and OAuth/Vault) may reach although
    /// it is private or loopback, or over plain http (repeatable; entries add allowedPrivateHosts).
    #[arg(
        long = "allowed-private-host",
        env = "GRAPH_OS_ALLOWED_PRIVATE_HOSTS",
        value_delimiter = ','
    )]
    allowed_private_hosts: Vec<String>,
    /// Seconds a stopped stdio child's process group has between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = defaults::CHILD_STOP_GRACE)]
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
    #[arg(long, default_value = defaults::VAULT_K8S_MOUNT)]
    vault_k8s_mount: String,
    /// Service-account token file for Vault Kubernetes auth.
    #[arg(long, default_value = defaults::VAULT_SA_TOKEN_FILE)]
    vault_sa_token_file: PathBuf,
    /// PEM CA bundle trusted for Vault (replaces the system roots).
    #[arg(long, env = "VAULT_CACERT")]
    vault_ca_file: Option<PathBuf>,
    /// Vault Enterprise namespace (X-Vault-Namespace).
    #[arg(long, env = "VAULT_NAMESPACE")]
    vault_namespace: Option<String>,
    /// Seconds a Vault secret is cached when Vault gives no lease duration (0 = never cached).
    #[arg(long, default_value_t = defaults::VAULT_CACHE_TTL)]
    vault_cache_ttl: f64,
    /// Key for the attestation of materialized secrets and the freshness identity, as a reference
    /// (env://NAME, ${NAME}); the same on every replica. Default: a process-ephemeral key.
    #[arg(long, env = "GRAPH_OS_ATTESTATION_KEY")]
    attestation_key: Option<String>,
}

impl ServeArgs {
    /// The gateway's configuration (every value as given: `gateway::build` checks ranges).
    pub fn config(self) -> gateway::Config {
        let e = self.egress;
        gateway::Config {
            front: match self.transport {
                Transport::Stdio => gateway::Front::Stdio,
                Transport::StreamableHttp => gateway::Front::StreamableHttp,
            },
            fleet: match self.fleet {
                Some(reference) => gateway::FleetSpec::McpFleet(reference),
                None => gateway::FleetSpec::File(self.config),
            },
            generation_store: self.generation_store,
            discovery_budget: self.discovery_budget,
            state_dir: self.state_dir,
            replica_id: self.replica_id,
            models_dir: self.models_dir,
            drift_policy: self.drift_policy,
            drain_timeout: self.drain_timeout,
            admin_addr: self.admin_addr,
            http: gateway::HttpConfig {
                host: self.host,
                port: self.port,
                allowed_hosts: self.allowed_hosts,
                allowed_origins: self.allowed_origins,
                max_sessions: self.max_sessions,
                max_sessions_per_principal: self.max_sessions_per_principal,
                session_idle_timeout: self.session_idle_timeout,
                max_principals: self.max_principals,
                max_request_bytes: self.max_request_bytes,
                request_body_timeout: self.request_body_timeout,
                request_body_min_rate: self.request_body_min_rate,
                request_body_grace: self.request_body_grace,
                max_connections: self.max_connections,
                max_connections_per_ip: self.max_connections_per_ip,
            },
            auth: gateway::AuthConfig {
                tokens: self.tokens,
                oauth_issuer: self.oauth_issuer,
                oauth_audience: self.oauth_audience,
                oauth_scope_claim: self.oauth_scope_claim,
                oauth_jwks_min_refresh: self.oauth_jwks_min_refresh,
                oauth_scope_map: self.oauth_scope_map,
                anonymous_scope: self.anonymous_scope,
                allow_unauthenticated: self.allow_unauthenticated,
            },
            session_store: gateway::SessionStoreConfig {
                url: self.session_store,
                password: self.session_store_password,
                tls_profile: self.session_store_tls_profile,
                prefix: self.session_store_prefix,
            },
            trust: gateway::TrustConfig {
                allowed_private_hosts: e.allowed_private_hosts,
                child_stop_grace: e.child_stop_grace,
                vault_addr: e.vault_addr,
                vault_token: e.vault_token,
                vault_k8s_role: e.vault_k8s_role,
                vault_k8s_mount: e.vault_k8s_mount,
                vault_sa_token_file: e.vault_sa_token_file,
                vault_ca_file: e.vault_ca_file,
                vault_namespace: e.vault_namespace,
                vault_cache_ttl: e.vault_cache_ttl,
                attestation_key: e.attestation_key,
            },
            // This binary is the reaper's executable (`transport::reaper`).
            spawn_reaper: true,
        }
    }
}

/// Serves with the logging the flags ask for; a fatal error is logged through it once.
pub fn serve(args: ServeArgs) -> ExitCode {
    super::run_async(async move {
        let telemetry = graph_os::telemetry::init_serve(&graph_os::telemetry::Options {
            default_level: "info".into(),
            format: args.log_format,
            access_log: args.access_log,
            otlp_endpoint: args.otlp_endpoint.clone(),
        });
        let served = gateway::run(args.config()).await;
        if let Err(e) = &served {
            // Through the configured log format (a JSON log pipeline sees the fatal error as a
            // record, not a stray text line); the exit code says the rest.
            tracing::error!(error = %format!("{e:#}"), "graph-os cannot serve");
        }
        telemetry.shutdown().await;
        served.map_err(super::Reported::wrap)
    })
}
