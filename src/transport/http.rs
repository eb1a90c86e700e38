//! Remote child transports over HTTP: MCP streamable HTTP (rmcp's client) and legacy SSE
//! (see [`super::sse`]), sharing one egress-policy HTTP client.
//!
//! Egress policy applied here: redirects are never followed, proxies from the environment are
//! ignored, TLS uses rustls with the platform's trust store. Plain `http://` is admitted only
//! for loopback or `allowedPrivateHosts` (checked when the config is loaded).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use super::TransportError;
use crate::config::RemoteSpec;

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The HTTP client every remote child uses.
pub fn client() -> Result<reqwest::Client, TransportError> {
    install_crypto();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| TransportError::Spawn {
            command: "http client".into(),
            reason: e.to_string(),
        })
}

/// Resolves a remote child's declared headers (secret references resolve here, at the boundary).
pub fn resolve_headers(
    spec: &RemoteSpec,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<HashMap<HeaderName, HeaderValue>, TransportError> {
    let mut out = HashMap::new();
    for (name, value) in &spec.headers {
        let resolved = value.resolve(lookup)?;
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| TransportError::Spawn {
            command: spec.url.clone(),
            reason: format!("bad header name {name}"),
        })?;
        let mut value = HeaderValue::from_str(&resolved).map_err(|_| TransportError::Spawn {
            command: spec.url.clone(),
            reason: format!("bad value for header {name}"),
        })?;
        if crate::secrets::is_sensitive_name(name.as_str()) {
            value.set_sensitive(true);
        }
        out.insert(name, value);
    }
    Ok(out)
}

/// Opens a streamable HTTP transport to a remote child.
pub fn streamable(
    spec: &RemoteSpec,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<StreamableHttpClientTransport<reqwest::Client>, TransportError> {
    let headers = resolve_headers(spec, lookup)?;
    let config =
        StreamableHttpClientTransportConfig::with_uri(spec.url.clone()).custom_headers(headers);
    Ok(StreamableHttpClientTransport::with_client(
        client()?,
        config,
    ))
}
