//! `vault://MOUNT/PATH#KEY`: HashiCorp Vault KV version 2 over HTTPS.
//!
//! Read: `GET {addr}/v1/{MOUNT}/data/{PATH}` with `X-Vault-Token` → `data.data[KEY]` (Vault's
//! documented KV v2 API). Authentication: a token from a reference (`--vault-token env://…`), or
//! Kubernetes auth — `POST {addr}/v1/auth/{mount}/login` with `{"role", "jwt"}` where `jwt` is
//! the pod's service-account token — whose `auth.client_token` is cached for 90 % of its
//! `auth.lease_duration` and renewed by logging in again (also after a 403).
//!
//! Every request goes through the egress policy (gateway level) and the Vault TLS settings
//! (`--vault-ca-file`, rustls); plain http is refused. A read secret is cached in memory for
//! its `lease_duration` when Vault gives one, else `--vault-cache-ttl` (default 60 s), and is
//! never written anywhere. Anything that goes wrong — Vault down, 4xx/5xx, a missing key, a
//! body over 1 MiB — fails closed: the reference is unavailable (`secret-unavailable`); the log
//! names the reference and the HTTP status, never a value or a response body.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::Mutex;

use super::{SecretBackend, SecretValue};
use crate::net::egress::{self, Policy};

/// Largest Vault response read (bytes).
const MAX_BODY: usize = 1 << 20;
/// Most cached secret paths.
const MAX_CACHED: usize = 1024;
/// Per-request timeout.
const TIMEOUT: Duration = Duration::from_secs(10);

/// How graph-os authenticates to Vault.
#[derive(Debug, Clone)]
pub enum VaultAuth {
    /// A token from a reference (`env://NAME`, `${NAME}`), read at every login.
    Token(SecretValue),
    /// Kubernetes auth with the pod's service-account token.
    Kubernetes {
        /// Vault role.
        role: String,
        /// Auth mount (default `kubernetes`).
        mount: String,
        /// Service-account token file.
        jwt_path: PathBuf,
    },
}

/// Vault settings.
#[derive(Debug, Clone)]
pub struct VaultConfig {
    /// `https://vault.example:8200`.
    pub addr: url::Url,
    /// Authentication.
    pub auth: VaultAuth,
    /// `X-Vault-Namespace` (Vault Enterprise), if any.
    pub namespace: Option<String>,
    /// Extra CA certificates (PEM file) trusted for Vault (replacing the system roots).
    pub ca_file: Option<PathBuf>,
    /// Cache time when Vault returns no lease duration.
    pub cache_ttl: Duration,
}

/// A `vault://` reference split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VaultRef {
    /// KV v2 mount.
    pub mount: String,
    /// Secret path below the mount.
    pub path: String,
    /// Key inside the secret's data.
    pub key: String,
}

/// Splits `vault://MOUNT/PATH#KEY`.
pub fn parse_ref(reference: &str) -> Option<VaultRef> {
    let rest = reference.strip_prefix("vault://")?;
    let (path, key) = rest.split_once('#')?;
    let (mount, path) = path.split_once('/')?;
    let ok = |s: &str| {
        !s.is_empty()
            && !s
                .split('/')
                .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    };
    (ok(mount) && ok(path) && !key.is_empty() && !key.contains('#')).then(|| VaultRef {
        mount: mount.into(),
        path: path.into(),
        key: key.into(),
    })
}

/// One cached secret: its data and until when it may be served.
type Cached = (Arc<serde_json::Map<String, Value>>, Instant);

/// The Vault backend.
pub struct Vault {
    cfg: VaultConfig,
    http: reqwest::Client,
    token: Mutex<Option<(String, Instant)>>,
    cache: std::sync::Mutex<HashMap<String, Cached>>,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault")
            .field("addr", &self.cfg.addr.as_str())
            .finish()
    }
}

/// Why a Vault operation failed (never carries a value or a body).
#[derive(Debug, Clone, thiserror::Error)]
pub enum VaultError {
    /// Configuration problem.
    #[error("vault: {0}")]
    Config(String),
    /// Transport or policy failure.
    #[error("vault request failed: {0}")]
    Request(String),
    /// Vault answered with this status.
    #[error("vault answered HTTP {0}")]
    Status(u16),
    /// The answer is not what the KV v2 / auth API documents.
    #[error("vault answer is malformed: {0}")]
    Malformed(&'static str),
}

async fn read_limited(mut resp: reqwest::Response) -> Result<Vec<u8>, VaultError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| VaultError::Request(e.to_string()))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(VaultError::Malformed("the body is larger than 1 MiB"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

impl Vault {
    /// A backend for `cfg` (checks the address against the egress policy now).
    pub fn new(cfg: VaultConfig) -> Result<Self, VaultError> {
        if cfg.addr.scheme() != "https" {
            return Err(VaultError::Config(
                "the Vault address must be https://".into(),
            ));
        }
        let policy = Policy::gateway();
        policy
            .check_static(&cfg.addr)
            .map_err(|e| VaultError::Config(e.to_string()))?;
        let tls = match &cfg.ca_file {
            None => None,
            Some(path) => {
                let bad = |why: &str| VaultError::Config(format!("--vault-ca-file: {why}"));
                let text = crate::net::tls::read_pem_file(path).map_err(|why| bad(&why))?;
                let ca = crate::net::tls::pem_certificates(&text).map_err(bad)?;
                let trust = crate::net::tls::Trust {
                    name: "vault",
                    ca: &ca,
                    ca_mode: crate::net::tls::CaMode::Replace,
                    client_cert: &[],
                    min_version: crate::net::tls::TlsVersion::Tls12,
                };
                Some(
                    crate::net::tls::client_config(&trust, None)
                        .map_err(|e| VaultError::Config(e.to_string()))?,
                )
            }
        };
        let http = egress::client(policy, None, tls).map_err(VaultError::Config)?;
        Ok(Vault {
            cfg,
            http,
            token: Mutex::new(None),
            cache: std::sync::Mutex::new(HashMap::new()),
        })
    }

    fn url(&self, path: &str) -> Result<url::Url, VaultError> {
        let base = self.cfg.addr.as_str().trim_end_matches('/');
        url::Url::parse(&format!("{base}/v1/{path}"))
            .map_err(|_| VaultError::Config("cannot build a request URL".into()))
    }

    fn request(&self, method: reqwest::Method, url: url::Url) -> reqwest::RequestBuilder {
        let mut req = self.http.request(method, url).timeout(TIMEOUT);
        if let Some(ns) = &self.cfg.namespace {
            req = req.header("X-Vault-Namespace", ns);
        }
        req
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Value, VaultError> {
        let resp = req
            .send()
            .await
            .map_err(|e| match crate::net::classify_error(&e) {
                Some((code, msg)) => VaultError::Request(format!("{code}: {msg}")),
                None => VaultError::Request(e.to_string()),
            })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(VaultError::Status(status.as_u16()));
        }
        let body = read_limited(resp).await?;
        serde_json::from_slice(&body).map_err(|_| VaultError::Malformed("not JSON"))
    }

    async fn token(&self, fresh: bool) -> Result<String, VaultError> {
        let mut slot = self.token.lock().await;
        if !fresh
            && let Some((t, until)) = slot.as_ref()
            && Instant::now() < *until
        {
            return Ok(t.clone());
        }
        let (token, ttl) = match &self.cfg.auth {
            VaultAuth::Token(r) => {
                let t = r
                    .resolve(&super::process_env)
                    .map_err(|e| VaultError::Config(format!("--vault-token: {e}")))?;
                (t, Duration::from_secs(60))
            }
            VaultAuth::Kubernetes {
                role,
                mount,
                jwt_path,
            } => {
                let jwt = std::fs::read_to_string(jwt_path).map_err(|e| {
                    VaultError::Config(format!(
                        "cannot read the service-account token {}: {}",
                        jwt_path.display(),
                        e.kind()
                    ))
                })?;
                let url = self.url(&format!("auth/{mount}/login"))?;
                let answer = self
                    .send(
                        self.request(reqwest::Method::POST, url)
                            .json(&serde_json::json!({"role": role, "jwt": jwt.trim()})),
                    )
                    .await?;
                let auth = answer.get("auth").ok_or(VaultError::Malformed("no auth"))?;
                let token = auth
                    .get("client_token")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                    .ok_or(VaultError::Malformed("no auth.client_token"))?;
                let lease = auth
                    .get("lease_duration")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                let ttl = if lease == 0 {
                    Duration::from_secs(300)
                } else {
                    Duration::from_secs(lease).mul_f64(0.9)
                };
                tracing::debug!(target: "graph_os::secrets", mount = %mount, role = %role, lease_s = lease, "vault: logged in with Kubernetes auth");
                (token.to_string(), ttl)
            }
        };
        *slot = Some((token.clone(), Instant::now() + ttl));
        Ok(token)
    }

    async fn read(
        &self,
        r: &VaultRef,
    ) -> Result<(Arc<serde_json::Map<String, Value>>, Duration), VaultError> {
        let cache_key = format!("{}/{}", r.mount, r.path);
        if let Some((data, until)) = self.cached(&cache_key) {
            return Ok((data, until - Instant::now()));
        }
        let url = self.url(&format!("{}/data/{}", r.mount, r.path))?;
        let mut answer = None;
        for fresh in [false, true] {
            let token = self.token(fresh).await?;
            let mut t = reqwest::header::HeaderValue::from_str(&token).map_err(|_| {
                VaultError::Config("the Vault token is not a valid header value".into())
            })?;
            t.set_sensitive(true);
            match self
                .send(
                    self.request(reqwest::Method::GET, url.clone())
                        .header("X-Vault-Token", t),
                )
                .await
            {
                Err(VaultError::Status(403))
                    if !fresh && matches!(self.cfg.auth, VaultAuth::Kubernetes { .. }) =>
                {
                    continue;
                }
                other => {
                    answer = Some(other?);
                    break;
                }
            }
        }
        let answer = answer.ok_or(VaultError::Status(403))?;
        let data = answer
            .get("data")
            .and_then(|d| d.get("data"))
            .and_then(Value::as_object)
            .cloned()
            .ok_or(VaultError::Malformed(
                "no data.data (is the mount KV version 2?)",
            ))?;
        let lease = answer
            .get("lease_duration")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let ttl = if lease > 0 {
            Duration::from_secs(lease)
        } else {
            self.cfg.cache_ttl
        };
        let data = Arc::new(data);
        if !ttl.is_zero() {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
            cache.insert(cache_key, (data.clone(), Instant::now() + ttl));
        }
        Ok((data, ttl))
    }

    fn cached(&self, key: &str) -> Option<Cached> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|(_, until)| Instant::now() < *until)
            .cloned()
    }

    /// Resolves one reference: the value and how long it may be reused.
    pub async fn get(&self, reference: &str) -> Result<(String, Duration), VaultError> {
        let r = parse_ref(reference).ok_or(VaultError::Config(
            "a vault reference is vault://MOUNT/PATH#KEY".into(),
        ))?;
        let (data, ttl) = self.read(&r).await?;
        let value = match data.get(&r.key) {
            Some(Value::String(s)) => s.clone(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            Some(_) => return Err(VaultError::Malformed("the key's value is not a string")),
            None => return Err(VaultError::Malformed("the key is not in the secret")),
        };
        Ok((value, ttl))
    }
}

impl SecretBackend for Arc<Vault> {
    fn invalidate(&self, reference: &str) {
        if let Some(r) = parse_ref(reference) {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.remove(&format!("{}/{}", r.mount, r.path));
        }
    }

    fn fetch(&self, reference: &str) -> BoxFuture<'static, Option<String>> {
        let fut = self.fetch_ttl(reference);
        Box::pin(async move { fut.await.map(|(v, _)| v) })
    }

    fn fetch_ttl(&self, reference: &str) -> BoxFuture<'static, Option<(String, Duration)>> {
        let vault = self.clone();
        let reference = reference.to_string();
        Box::pin(async move {
            match vault.get(&reference).await {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(target: "graph_os::secrets", reference = %reference, "secret reference unavailable: {e}");
                    None
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_mount_path_and_key() {
        assert_eq!(
            parse_ref("vault://secret/apps/github#token"),
            Some(VaultRef {
                mount: "secret".into(),
                path: "apps/github".into(),
                key: "token".into()
            })
        );
        for bad in [
            "vault://secret#token",
            "vault://secret/#token",
            "vault://secret/a",
            "vault://secret/a//b#k",
            "vault://secret/a#",
            "secret://a/b#c",
        ] {
            assert_eq!(parse_ref(bad), None, "{bad}");
        }
    }

    #[test]
    fn plain_http_vault_is_refused() {
        let cfg = VaultConfig {
            addr: url::Url::parse("http://vault.example:8200").unwrap(),
            auth: VaultAuth::Token(SecretValue::parse("env://VAULT_TOKEN").unwrap()),
            namespace: None,
            ca_file: None,
            cache_ttl: Duration::from_secs(60),
        };
        assert!(Vault::new(cfg).is_err());
    }
}
