//! The trust boundary, applied before any child starts: the egress policy, the stop grace of
//! child process groups and the reaper, `MCP_FLEET_SECRET_REFS`, the secret backends
//! (Kubernetes Secrets, Vault), the attestation key; and the admission context every fleet
//! version is checked against (what graph-os itself is reached at, so no child points at it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{BuildError, Config, Front, is_loopback_listen, setting};
use crate::config::AdmissionContext;
use crate::net::egress;
use crate::secrets::{self, SecretValue};

/// Egress policy, child process groups, secret backends, attestation key.
#[derive(Clone, Debug)]
pub struct TrustConfig {
    /// Hosts, `*.domains`, addresses or CIDRs remote children (and OAuth/Vault) may reach although
    /// private, loopback or plain http.
    pub allowed_private_hosts: Vec<String>,
    /// Seconds a stopped stdio child's process group has between SIGTERM and SIGKILL (0..600).
    pub child_stop_grace: f64,
    /// Vault address for `vault://` references (https only).
    pub vault_addr: Option<String>,
    /// Vault token as one `env://NAME` or `${NAME}` reference.
    pub vault_token: Option<String>,
    /// Vault Kubernetes auth role.
    pub vault_k8s_role: Option<String>,
    /// Vault Kubernetes auth mount.
    pub vault_k8s_mount: String,
    /// Service-account token file for Vault Kubernetes auth.
    pub vault_sa_token_file: PathBuf,
    /// PEM CA bundle trusted for Vault (replaces the system roots).
    pub vault_ca_file: Option<PathBuf>,
    /// Vault Enterprise namespace.
    pub vault_namespace: Option<String>,
    /// Seconds a Vault secret without a lease duration is cached (0..86400).
    pub vault_cache_ttl: f64,
    /// Attestation key as one `env://NAME` or `${NAME}` reference.
    pub attestation_key: Option<String>,
}

impl Default for TrustConfig {
    fn default() -> Self {
        TrustConfig {
            allowed_private_hosts: Vec::new(),
            child_stop_grace: super::defaults::CHILD_STOP_GRACE,
            vault_addr: None,
            vault_token: None,
            vault_k8s_role: None,
            vault_k8s_mount: super::defaults::VAULT_K8S_MOUNT.into(),
            vault_sa_token_file: super::defaults::VAULT_SA_TOKEN_FILE.into(),
            vault_ca_file: None,
            vault_namespace: None,
            vault_cache_ttl: super::defaults::VAULT_CACHE_TTL,
            attestation_key: None,
        }
    }
}

/// One `env://NAME` or `${NAME}` reference (never a literal, never a remote backend).
pub(super) fn env_reference(flag: &str, raw: &str) -> Result<SecretValue, BuildError> {
    SecretValue::parse(raw)
        .ok()
        .filter(|v| v.is_bare_reference() && v.externals().count() == 0)
        .ok_or_else(|| {
            BuildError::Setting(format!(
                "{flag} must be one env://NAME or ${{NAME}} reference, never a literal"
            ))
        })
}

/// Applies the trust boundary and returns the admission context of the fleet.
pub(super) fn apply(config: &Config) -> Result<AdmissionContext, BuildError> {
    let args = &config.trust;
    let (self_addresses, self_hosts) = self_reach(config);
    // Local-development profile: every address graph-os listens on is loopback (stdio is local).
    let local_profile = (config.front == Front::Stdio || is_loopback_listen(&config.http.host))
        && config.admin_addr.is_none_or(|a| a.ip().is_loopback());
    let allowed = egress::Allowlist::parse(&args.allowed_private_hosts)
        .map_err(|e| setting("--allowed-private-host", e))?;
    let gateway = egress::GatewayEgress {
        allow_loopback: local_profile,
        allowed,
    };
    if !(0.0..=600.0).contains(&args.child_stop_grace) {
        return Err(BuildError::Setting(
            "--child-stop-grace must be 0..600 seconds".into(),
        ));
    }
    if !(0.0..=86_400.0).contains(&args.vault_cache_ttl) {
        return Err(BuildError::Setting(
            "--vault-cache-ttl must be 0..86400 seconds".into(),
        ));
    }
    egress::set_gateway(gateway.clone());
    let grace = Duration::from_secs_f64(args.child_stop_grace);
    crate::transport::stdio::set_stop_grace(grace);
    if config.spawn_reaper
        && let Err(e) = crate::transport::reaper::start(grace)
    {
        tracing::warn!(error = %e, "cannot start the child reaper: children rely on the parent-death signal alone");
    }
    match secrets::refs::init_from_env() {
        Ok(0) => {}
        Ok(n) => tracing::info!(entries = n, "MCP_FLEET_SECRET_REFS loaded"),
        Err(e) => tracing::error!(
            "{e}; every env:// alias that needs the mapping fails closed (secret-unavailable)"
        ),
    }
    secrets::set_backend(Arc::new(crate::kube::secrets::KubeSecrets::lazy()));
    if let Some(addr) = &args.vault_addr {
        vault(args, addr)?;
    }
    if let Some(reference) = &args.attestation_key {
        let key = env_reference("--attestation-key", reference)?
            .resolve(&secrets::process_env)
            .map_err(|e| setting("--attestation-key", e))?;
        crate::config::attest::set_key(key.as_bytes())
            .map_err(|e| setting("--attestation-key", e))?;
    }
    Ok(AdmissionContext {
        self_addresses,
        self_hosts,
        egress: gateway,
        ..Default::default()
    })
}

/// What graph-os is reached at: a child URL pointing at it is refused
/// (`config::points_at_self`): the listen addresses with their port, the hosts it is reached
/// by (`--allowed-host`, the advertised OAuth resource) on any port.
fn self_reach(config: &Config) -> (Vec<String>, Vec<String>) {
    let mut self_addresses = Vec::new();
    let mut self_hosts = Vec::new();
    let authority = |host: &str, port: u16| {
        if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    };
    if config.front == Front::StreamableHttp {
        let (host, port) = (&config.http.host, config.http.port);
        self_addresses.push(authority(host, port));
        if matches!(host.as_str(), "0.0.0.0" | "::" | "[::]") {
            self_addresses.extend(["127.0.0.1", "localhost", "::1"].map(|h| authority(h, port)));
        }
        self_hosts.extend(config.http.allowed_hosts.iter().cloned());
        if let Some(host) = config
            .auth
            .oauth_audience
            .as_deref()
            .and_then(|a| url::Url::parse(a).ok())
            .and_then(|u| u.host_str().map(str::to_string))
        {
            self_hosts.push(host);
        }
    }
    if let Some(a) = config.admin_addr {
        self_addresses.push(a.to_string());
    }
    (self_addresses, self_hosts)
}

/// The Vault backend for `vault://` references.
fn vault(args: &TrustConfig, addr: &str) -> Result<(), BuildError> {
    use crate::secrets::vault;
    let addr = url::Url::parse(addr)
        .map_err(|_| BuildError::Setting("--vault-addr is not a URL".into()))?;
    let auth = match (&args.vault_token, &args.vault_k8s_role) {
        (Some(t), None) => vault::VaultAuth::Token(env_reference("--vault-token", t)?),
        (None, Some(role)) => vault::VaultAuth::Kubernetes {
            role: role.clone(),
            mount: args.vault_k8s_mount.clone(),
            jwt_path: args.vault_sa_token_file.clone(),
        },
        (None, None) => {
            return Err(BuildError::Setting(
                "--vault-addr needs --vault-token or --vault-k8s-role".into(),
            ));
        }
        (Some(_), Some(_)) => {
            return Err(BuildError::Setting(
                "--vault-token and --vault-k8s-role exclude each other".into(),
            ));
        }
    };
    let backend = vault::Vault::new(vault::VaultConfig {
        addr,
        auth,
        namespace: args.vault_namespace.clone(),
        ca_file: args.vault_ca_file.clone(),
        cache_ttl: Duration::from_secs_f64(args.vault_cache_ttl),
    })
    .map_err(|e| setting("--vault-addr", e))?;
    secrets::set_vault_backend(Arc::new(Arc::new(backend)));
    Ok(())
}
