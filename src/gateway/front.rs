//! The front the gateway serves: its credential sources, its session store, its listener's
//! bounds, and the plan that runs it (stdio, stdio with an admin listener, or streamable HTTP).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{BuildError, Config, Front, is_loopback_listen, setting};
use crate::auth::{Credentials, Scope, oauth};
use crate::mux::Multiplexer;
use crate::server::http::HttpOptions;
use crate::server::listener;

/// The HTTP front's listener, sessions and bounds.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Listen host.
    pub host: String,
    /// Listen port.
    pub port: u16,
    /// Extra `Host` header values accepted on `/mcp`.
    pub allowed_hosts: Vec<String>,
    /// Extra `Origin` values accepted on `/mcp`.
    pub allowed_origins: Vec<String>,
    /// 2025-era sessions open at once (all principals).
    pub max_sessions: usize,
    /// 2025-era sessions open at once per principal.
    pub max_sessions_per_principal: usize,
    /// Seconds a session may stay idle (1..86400).
    pub session_idle_timeout: f64,
    /// 2026-era principals whose loaded sets are kept.
    pub max_principals: usize,
    /// Largest `/mcp` request body, bytes (at least 64 KiB).
    pub max_request_bytes: usize,
    /// Seconds a whole request body may take (0: no deadline).
    pub request_body_timeout: f64,
    /// Bytes per second a body must average after the grace (0: no minimum).
    pub request_body_min_rate: u64,
    /// Seconds of a body before the minimum rate applies.
    pub request_body_grace: f64,
    /// Connections open at once (0: no cap).
    pub max_connections: usize,
    /// Connections open at once from one client address (0: no cap).
    pub max_connections_per_ip: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            host: super::defaults::HOST.into(),
            port: super::defaults::PORT,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_sessions: super::defaults::MAX_SESSIONS,
            max_sessions_per_principal: super::defaults::MAX_SESSIONS_PER_PRINCIPAL,
            session_idle_timeout: super::defaults::SESSION_IDLE_TIMEOUT,
            max_principals: super::defaults::MAX_PRINCIPALS,
            max_request_bytes: crate::server::http::DEFAULT_MAX_REQUEST_BYTES,
            request_body_timeout: super::defaults::REQUEST_BODY_TIMEOUT,
            request_body_min_rate: listener::DEFAULT_BODY_MIN_RATE,
            request_body_grace: super::defaults::REQUEST_BODY_GRACE,
            max_connections: listener::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: listener::DEFAULT_MAX_CONNECTIONS_PER_IP,
        }
    }
}

/// Credential sources of the HTTP front and the admin API.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// Bearer tokens as `SCOPE=REFERENCE`.
    pub tokens: Vec<String>,
    /// OAuth 2.1 issuer (with `oauth_audience`).
    pub oauth_issuer: Option<String>,
    /// OAuth 2.1 resource identifier (RFC 8707).
    pub oauth_audience: Option<String>,
    /// The claim carrying scopes.
    pub oauth_scope_claim: String,
    /// Least seconds between two JWKS fetches (0.1..3600).
    pub oauth_jwks_min_refresh: f64,
    /// Claim values mapped to graph-os scopes, `VALUE=SCOPE`.
    pub oauth_scope_map: Vec<String>,
    /// Scope granted to `/mcp` requests without a credential (`discover` or `delegate`).
    pub anonymous_scope: Option<String>,
    /// Serve beyond loopback without any credential source.
    pub allow_unauthenticated: bool,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            tokens: Vec::new(),
            oauth_issuer: None,
            oauth_audience: None,
            oauth_scope_claim: super::defaults::OAUTH_SCOPE_CLAIM.into(),
            oauth_jwks_min_refresh: super::defaults::OAUTH_JWKS_MIN_REFRESH,
            oauth_scope_map: Vec::new(),
            anonymous_scope: None,
            allow_unauthenticated: false,
        }
    }
}

/// Where HTTP sessions and 2026 principals live.
#[derive(Clone, Debug)]
pub struct SessionStoreConfig {
    /// `memory`, a `redis://`/`rediss://` URL without a password, or a secret reference to one.
    pub url: String,
    /// The store's password as an `env://NAME` or `${NAME}` reference.
    pub password: Option<String>,
    /// A TLS profile file for `rediss://`.
    pub tls_profile: Option<PathBuf>,
    /// Prefix of every key and channel.
    pub prefix: String,
}

impl Default for SessionStoreConfig {
    fn default() -> Self {
        SessionStoreConfig {
            url: super::defaults::SESSION_STORE.into(),
            password: None,
            tls_profile: None,
            prefix: super::defaults::SESSION_STORE_PREFIX.into(),
        }
    }
}

/// The credential sources; refuses an HTTP front beyond loopback without any, unless allowed.
pub(super) fn credentials(config: &Config) -> Result<Credentials, BuildError> {
    let args = &config.auth;
    let tokens = crate::auth::Tokens::from_specs(&args.tokens, &crate::secrets::process_env)
        .map_err(|e| setting("--token", e))?;
    let oauth = match (&args.oauth_issuer, &args.oauth_audience) {
        (None, None) => None,
        (Some(issuer), Some(audience)) => Some(oauth_validator(args, issuer, audience)?),
        _ => {
            return Err(BuildError::Setting(
                "--oauth-issuer and --oauth-audience go together".into(),
            ));
        }
    };
    let anonymous = args
        .anonymous_scope
        .as_deref()
        .map(|s| s.parse::<Scope>())
        .transpose()
        .map_err(|e| setting("--anonymous-scope", e))?;
    let credentials = Credentials {
        tokens,
        oauth,
        anonymous,
    };
    if config.front == Front::StreamableHttp
        && !credentials.configured()
        && !is_loopback_listen(&config.http.host)
        && !args.allow_unauthenticated
    {
        return Err(BuildError::Unauthenticated(config.http.host.clone()));
    }
    if let Some(oauth) = &credentials.oauth {
        let oauth = oauth.clone();
        tokio::spawn(async move {
            if let Err(e) = oauth.warm().await {
                tracing::warn!(code = e.code(), "OAuth issuer not reachable yet: {e}");
            }
        });
    }
    Ok(credentials)
}

fn oauth_validator(
    args: &AuthConfig,
    issuer: &str,
    audience: &str,
) -> Result<oauth::OAuthValidator, BuildError> {
    crate::net::crypto::install_crypto();
    let mut config = oauth::OAuthConfig::new(issuer.to_string(), audience.to_string());
    config.http = Some(
        crate::transport::http::client()
            .map_err(|e| setting("--oauth-issuer", format!("HTTP client: {e}")))?,
    );
    config.scope_claim = args.oauth_scope_claim.clone();
    if !(0.1..=3600.0).contains(&args.oauth_jwks_min_refresh) {
        return Err(BuildError::Setting(
            "--oauth-jwks-min-refresh must be 0.1..3600 seconds".into(),
        ));
    }
    config.min_refresh_interval = Duration::from_secs_f64(args.oauth_jwks_min_refresh);
    for m in &args.oauth_scope_map {
        let (value, scope) = m
            .split_once('=')
            .ok_or_else(|| BuildError::Setting("--oauth-scope-map expects VALUE=SCOPE".into()))?;
        let scope: Scope = scope.parse().map_err(|e| setting("--oauth-scope-map", e))?;
        config.scope_map.push((value.to_string(), scope));
    }
    oauth::OAuthValidator::new(config).map_err(|e| setting("--oauth-issuer", e))
}

/// How the front is served.
pub(super) enum Plan {
    /// One stdio client and no other listener.
    Stdio,
    /// A stdio client, and the admin endpoints on HTTP.
    StdioWithAdmin(HttpOptions),
    /// Streamable HTTP, and the session store to open once the multiplexer's identity is known.
    Http(HttpOptions, Option<StoreSpec>),
}

/// The front's plan: listener bounds, HTTP options, the session store.
pub(super) async fn plan(
    config: &Config,
    credentials: Arc<Credentials>,
) -> Result<Plan, BuildError> {
    let http = &config.http;
    let drain_timeout = Duration::from_secs_f64(config.drain_timeout.clamp(0.0, 3600.0));
    let seconds = |s: f64| Duration::try_from_secs_f64(s.clamp(0.0, 86_400.0)).unwrap_or_default();
    let listener = listener::Limits {
        body: listener::BodyDeadline {
            timeout: seconds(http.request_body_timeout),
            min_rate: http.request_body_min_rate,
            grace: seconds(http.request_body_grace),
        },
        max_connections: http.max_connections,
        max_connections_per_ip: http.max_connections_per_ip,
        ..Default::default()
    };
    match config.front {
        Front::Stdio => Ok(match config.admin_addr {
            None => Plan::Stdio,
            Some(addr) => Plan::StdioWithAdmin(HttpOptions {
                drain_timeout,
                serve_mcp: false,
                listener,
                credentials,
                ..HttpOptions::new(addr)
            }),
        }),
        Front::StreamableHttp => {
            let addr = format!("{}:{}", http.host, http.port)
                .parse::<SocketAddr>()
                .or_else(|_| format!("[{}]:{}", http.host, http.port).parse())
                .map_err(|_| {
                    BuildError::Setting(format!(
                        "--host: {:?} is not an IP address to listen on",
                        http.host
                    ))
                })?;
            if !(1.0..=86_400.0).contains(&http.session_idle_timeout) {
                return Err(BuildError::Setting(
                    "--session-idle-timeout must be 1..86400 seconds".into(),
                ));
            }
            let opts = HttpOptions {
                allowed_hosts: http.allowed_hosts.clone(),
                allowed_origins: http.allowed_origins.clone(),
                drain_timeout,
                serve_mcp: true,
                credentials,
                sessions: crate::server::sessions::SessionLimits {
                    max_sessions: http.max_sessions.max(1),
                    max_per_principal: http.max_sessions_per_principal.max(1),
                    idle: Duration::from_secs_f64(http.session_idle_timeout),
                    ..Default::default()
                },
                max_principals: http.max_principals.max(1),
                max_request_bytes: http.max_request_bytes.max(64 << 10),
                listener,
                ..HttpOptions::new(addr)
            };
            let store = session_store(&config.session_store).await?;
            Ok(Plan::Http(opts, store))
        }
    }
}

impl Plan {
    /// Opens the session store under this replica's identity (a Redis client connects lazily).
    pub(super) fn open_store(self, replica: &str) -> Result<Plan, BuildError> {
        Ok(match self {
            Plan::Http(opts, Some(spec)) => {
                crate::net::crypto::install_crypto();
                let store = crate::session_redis::RedisSessionStore::open(
                    crate::session_redis::RedisConfig {
                        url: spec.url,
                        password: spec.password,
                        tls: spec.tls,
                        prefix: spec.prefix,
                        replica: replica.to_string(),
                        ttl: opts.store_ttl(),
                    },
                )
                .map_err(|e| setting("--session-store", e))?;
                Plan::Http(
                    HttpOptions {
                        session_store: Some(store),
                        ..opts
                    },
                    None,
                )
            }
            plan => plan,
        })
    }

    /// Serves until shutdown.
    pub(super) async fn serve(self, mux: Arc<Multiplexer>) -> anyhow::Result<()> {
        match self {
            Plan::Stdio => {
                // One stdio client and no other listener: every child connection is its own.
                crate::child::serve_one_front();
                crate::server::serve_stdio(mux).await
            }
            Plan::StdioWithAdmin(opts) => {
                let admin = tokio::spawn(crate::server::http::serve(mux.clone(), opts));
                let result = crate::server::serve_stdio(mux).await;
                admin.abort();
                result
            }
            Plan::Http(opts, _) => crate::server::http::serve(mux, opts).await,
        }
    }
}

/// A Redis session store, resolved (URL, password and TLS read) but not yet opened.
pub(super) struct StoreSpec {
    url: String,
    password: Option<String>,
    tls: Option<redis::TlsCertificates>,
    prefix: String,
}

/// The session store named by `url`, resolved (`None`: memory, built by the HTTP front).
async fn session_store(args: &SessionStoreConfig) -> Result<Option<StoreSpec>, BuildError> {
    use crate::secrets::{SecretValue, process_env};
    const FLAG: &str = "--session-store";
    let raw = args.url.trim();
    if raw.eq_ignore_ascii_case("memory") {
        return Ok(None);
    }
    let reference = SecretValue::parse(raw).map_err(|e| setting(FLAG, e))?;
    let url = if reference.is_reference() {
        let prefetched = crate::secrets::prefetch(std::iter::once(&reference)).await;
        reference
            .resolve(&crate::secrets::lookup_with(&prefetched))
            .map_err(|e| setting(FLAG, e))?
    } else {
        let parsed = url::Url::parse(raw).map_err(|_| {
            setting(
                FLAG,
                "`memory`, a redis:// or rediss:// URL, or a secret reference",
            )
        })?;
        if parsed.password().is_some() {
            return Err(setting(
                FLAG,
                "the URL carries a password; pass it as --session-store-password env://NAME (or the whole URL as a reference)",
            ));
        }
        raw.to_string()
    };
    let scheme = url
        .split("://")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if scheme != "redis" && scheme != "rediss" {
        return Err(setting(
            FLAG,
            "only redis:// and rediss:// (Redis ≥ 6, Valkey) are supported",
        ));
    }
    let password = match &args.password {
        None => None,
        Some(r) => Some(
            super::trust::env_reference("--session-store-password", r)?
                .resolve(&process_env)
                .map_err(|e| setting("--session-store-password", e))?,
        ),
    };
    let tls = match &args.tls_profile {
        None => None,
        Some(path) => {
            if scheme != "rediss" {
                return Err(BuildError::Setting(
                    "--session-store-tls-profile needs a rediss:// URL".into(),
                ));
            }
            Some(
                crate::config::tls::redis_certificates(path)
                    .await
                    .map_err(|e| BuildError::Setting(format!("{e:#}")))?,
            )
        }
    };
    Ok(Some(StoreSpec {
        url,
        password,
        tls,
        prefix: args.prefix.clone(),
    }))
}
