//! The composition root: everything `graph-os serve` assembles, built in one place from a plain
//! [`Config`] (no command line here: `main.rs` parses flags into a `Config`; a test writes one).
//!
//! [`build`] applies the trust boundary (egress policy, child stop grace, secret backends,
//! attestation key), opens the fleet source (a file or an McpFleet) and the stores (the state
//! directory's, with the generation record in Leases where asked: [`crate::mux::Stores`]),
//! starts the [`Multiplexer`] on them, and starts the one reload loop that applies every later fleet
//! version, whichever source sent it. [`Gateway::serve`] then runs the front (stdio, with an
//! optional admin listener, or streamable HTTP) until shutdown. Every way `build` can fail is a
//! [`BuildError`] with a stable code; nothing here panics on a bad setting or state directory.
//!
//! Nothing in the library imports this module: it sits on top (`tests/structure.rs`).

mod front;
mod source;
mod trust;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{AdmissionContext, ConfigError, DriftPolicy};
use crate::mux::{Multiplexer, MuxSettings, StartupError};

pub use front::{AuthConfig, HttpConfig, SessionStoreConfig};
pub use source::FleetSpec;
pub use trust::TrustConfig;

/// Defaults shared by [`Config::default`] and the command line's flags (one place for each).
pub mod defaults {
    /// Listen host of the HTTP front (loopback: the local-development profile).
    pub const HOST: &str = "127.0.0.1";
    /// Listen port of the HTTP front.
    pub const PORT: u16 = 8004;
    /// Seconds find_tools and load_tools wait for starting children.
    pub const DISCOVERY_BUDGET: f64 = 5.0;
    /// Seconds in-flight calls may run after SIGTERM.
    pub const DRAIN_TIMEOUT: f64 = 30.0;
    /// 2025-era sessions open at once.
    pub const MAX_SESSIONS: usize = 1000;
    /// 2025-era sessions open at once per principal.
    pub const MAX_SESSIONS_PER_PRINCIPAL: usize = 100;
    /// Seconds a session may stay idle.
    pub const SESSION_IDLE_TIMEOUT: f64 = 300.0;
    /// 2026-era principals kept.
    pub const MAX_PRINCIPALS: usize = 10_000;
    /// Seconds a whole request body may take.
    pub const REQUEST_BODY_TIMEOUT: f64 = 60.0;
    /// Seconds of a body before the minimum rate applies.
    pub const REQUEST_BODY_GRACE: f64 = 10.0;
    /// The claim carrying OAuth scopes.
    pub const OAUTH_SCOPE_CLAIM: &str = "scope";
    /// Least seconds between two JWKS fetches.
    pub const OAUTH_JWKS_MIN_REFRESH: f64 = 10.0;
    /// Sessions live in this process.
    pub const SESSION_STORE: &str = "memory";
    /// Prefix of every key and channel in the session store.
    pub const SESSION_STORE_PREFIX: &str = "graphos:";
    /// Seconds between SIGTERM and SIGKILL for a stopped child's process group.
    pub const CHILD_STOP_GRACE: f64 = 5.0;
    /// Vault's Kubernetes auth mount.
    pub const VAULT_K8S_MOUNT: &str = "kubernetes";
    /// The pod's service-account token.
    pub const VAULT_SA_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    /// Seconds a Vault secret without a lease duration is cached.
    pub const VAULT_CACHE_TTL: f64 = 60.0;
}

/// Which front the gateway serves MCP on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Front {
    /// MCP over stdin/stdout (logs on stderr).
    #[default]
    Stdio,
    /// MCP streamable HTTP on `/mcp`, plus `/healthz`, `/readyz` and `/metrics`.
    StreamableHttp,
}

/// Everything the gateway is built from. Durations are seconds as given (validated by
/// [`build`], which names the flag of a value out of range).
#[derive(Clone, Debug)]
pub struct Config {
    /// The MCP front.
    pub front: Front,
    /// Where the fleet comes from.
    pub fleet: FleetSpec,
    /// Keep the generation record and heartbeats in Leases named by `kube://NS/NAME` although
    /// the fleet comes from a file (implied by [`FleetSpec::McpFleet`]).
    pub generation_store: Option<String>,
    /// find_tools/load_tools wait for starting children this long (0.1..60 s).
    pub discovery_budget: f64,
    /// State directory (default: under `$XDG_STATE_HOME`, keyed by the fleet file's path).
    pub state_dir: Option<PathBuf>,
    /// This replica's id (default: `<hostname>-<pid>`).
    pub replica_id: Option<String>,
    /// Installed discovery models (default: the XDG data directory's).
    pub models_dir: Option<PathBuf>,
    /// Drift guard for entries without `driftPolicy`.
    pub drift_policy: DriftPolicy,
    /// Seconds in-flight calls may run after a shutdown signal (clamped to 0..3600).
    pub drain_timeout: f64,
    /// With the stdio front: also serve `/healthz`, `/readyz`, `/metrics` and the admin API here.
    pub admin_addr: Option<SocketAddr>,
    /// The HTTP front's listener, sessions and bounds.
    pub http: HttpConfig,
    /// Credential sources of the HTTP front and the admin API.
    pub auth: AuthConfig,
    /// Where HTTP sessions and 2026 principals live.
    pub session_store: SessionStoreConfig,
    /// Egress policy, child process groups, secret backends, attestation key.
    pub trust: TrustConfig,
    /// Start the child reaper: this process's own executable run with a hidden argument
    /// (`transport::reaper`). Only the `graph-os` binary can be that executable, so it is off
    /// by default and the command line turns it on.
    pub spawn_reaper: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            front: Front::Stdio,
            fleet: FleetSpec::File(None),
            generation_store: None,
            discovery_budget: defaults::DISCOVERY_BUDGET,
            state_dir: None,
            replica_id: None,
            models_dir: None,
            drift_policy: DriftPolicy::Off,
            drain_timeout: defaults::DRAIN_TIMEOUT,
            admin_addr: None,
            http: HttpConfig::default(),
            auth: AuthConfig::default(),
            session_store: SessionStoreConfig::default(),
            trust: TrustConfig::default(),
            spawn_reaper: false,
        }
    }
}

/// Why the gateway could not be built. Each variant has a stable [`code`](BuildError::code).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A setting is out of range, malformed, or contradicts another (the message names the flag).
    #[error("{0}")]
    Setting(String),
    /// The fleet file cannot be read or used at all.
    #[error(transparent)]
    Fleet(#[from] ConfigError),
    /// The multiplexer cannot start (no usable state directory).
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// An McpFleet or Lease store was asked for and no Kubernetes client can be made.
    #[error("no Kubernetes client: {0}")]
    Kubernetes(String),
    /// Serving HTTP beyond loopback without any credential source, not explicitly allowed.
    #[error(
        "refusing to serve {0} without a credential source: every caller would be anonymous with \
         delegate scope. Configure --token SCOPE=env://NAME or --oauth-issuer/--oauth-audience, \
         or pass --allow-unauthenticated to accept that"
    )]
    Unauthenticated(String),
}

impl BuildError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            BuildError::Setting(_) => "invalid-setting",
            BuildError::Fleet(e) => e.code(),
            BuildError::Startup(StartupError::StateDir { .. }) => "state-dir-unusable",
            BuildError::Kubernetes(_) => "kubernetes-unavailable",
            BuildError::Unauthenticated(_) => "unauthenticated-exposure",
        }
    }
}

/// A setting error naming its flag.
pub(crate) fn setting(flag: &str, reason: impl std::fmt::Display) -> BuildError {
    BuildError::Setting(format!("{flag}: {reason}"))
}

/// A built gateway: the multiplexer running its fleet, the reload loop, and the front to serve.
pub struct Gateway {
    mux: Arc<Multiplexer>,
    front: front::Plan,
    source: source::Running,
}

impl Gateway {
    /// The multiplexer (for callers inside the process, and tests).
    pub fn mux(&self) -> &Arc<Multiplexer> {
        &self.mux
    }

    /// Serves the front until shutdown (SIGTERM/SIGINT, or stdin closing for stdio), then
    /// releases the status Lease.
    pub async fn serve(self) -> anyhow::Result<()> {
        let served = self.front.serve(self.mux.clone()).await;
        self.source.stop().await;
        served
    }

    /// Stops the reload loop and the children without serving (tests, `doctor`).
    pub async fn shutdown(self) {
        self.source.stop().await;
        self.mux.shutdown().await;
    }
}

/// Builds the gateway from `config`: trust boundary, fleet source, generation store,
/// multiplexer, reload loop and the front's options (credentials, session store).
pub async fn build(config: Config) -> Result<Gateway, BuildError> {
    if !(0.1..=60.0).contains(&config.discovery_budget) {
        return Err(BuildError::Setting(
            "--discovery-budget must be 0.1..60 seconds".into(),
        ));
    }
    if config.front == Front::Stdio
        && (config.http.port != defaults::PORT || config.http.host != defaults::HOST)
    {
        tracing::warn!(
            "--host/--port apply to --transport streamable-http and are ignored with stdio (for health and metrics beside stdio: --admin-addr)"
        );
    }
    let ctx: AdmissionContext = trust::apply(&config)?;
    let credentials = Arc::new(front::credentials(&config)?);
    let opened = source::open(&config, &ctx).await?;
    let fleet = &opened.initial;
    for issue in &fleet.issues {
        tracing::warn!(server = %issue.server, field = %issue.field, "config problem: {}", issue.reason);
    }
    tracing::info!(source = %fleet.source, servers = fleet.children.len(), "serving fleet");
    let settings = MuxSettings {
        discovery_budget: Duration::from_secs_f64(config.discovery_budget),
        state_dir: config
            .state_dir
            .clone()
            .unwrap_or_else(|| default_state_dir(opened.config_path.as_deref())),
        drift_policy: config.drift_policy,
        models_dir: config
            .models_dir
            .clone()
            .or_else(crate::discovery::semantic::default_models_dir),
        replica_id: config.replica_id.clone().unwrap_or_else(default_replica_id),
        ..Default::default()
    };
    tracing::info!(state_dir = %settings.state_dir.display(), replica = %settings.replica_id, "catalog state");
    let plan = front::plan(&config, credentials).await?;
    let (mux, source) = opened.start(settings, ctx)?;
    let front = match plan.open_store(mux.instance_id()) {
        Ok(front) => front,
        Err(e) => {
            source.stop().await;
            mux.shutdown().await;
            return Err(e);
        }
    };
    Ok(Gateway { mux, front, source })
}

/// [`build`], then [`Gateway::serve`].
pub async fn run(config: Config) -> anyhow::Result<()> {
    build(config).await?.serve().await
}

/// Whether a listen host is loopback only (the local-development profile).
pub fn is_loopback_listen(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h == "localhost"
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `$XDG_STATE_HOME/graph-os/<16 hex digits of the fleet file's absolute path>`: replicas
/// serving the same file agree on it; a different file gets its own.
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
        .join(&crate::digest::sha256_hex(key.as_bytes())[..16])
}

/// `<hostname>-<pid>`.
fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}
